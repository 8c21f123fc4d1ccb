#include "pscore/node/common/admin_ops.h"

#include <string>

namespace pscore::node {

const std::vector<AdminOpInfo>& AdminOps() {
  static const std::vector<AdminOpInfo> kOps = {
      // op                  wire            command         totals ids    http_post any_certificate
      {AdminOp::kStatus, "status", "status", false, false, false, true},
      {AdminOp::kNodes, "nodes", "nodes", false, false, false, false},
      {AdminOp::kScaleOut, "scale_out", "scale-out", true, false, true, false},
      {AdminOp::kScaleIn, "scale_in", "scale-in", true, true, true, false},
      {AdminOp::kNewInstance, "new_instance", "new-instance", false, false, true, false},
      {AdminOp::kEnable, "enable", "enable", false, false, true, false},
      {AdminOp::kDisable, "disable", "disable", false, false, true, false},
      {AdminOp::kReset, "reset", "reset", false, true, true, false},
      {AdminOp::kStop, "stop", "stop", false, false, true, false},
      {AdminOp::kBarriers, "barriers", "barriers", false, false, false, false},
  };
  return kOps;
}

const AdminOpInfo* FindAdminOp(std::string_view wire) {
  for (const AdminOpInfo& i : AdminOps()) {
    if (wire == i.wire) return &i;
  }
  return nullptr;
}

const AdminOpInfo* FindAdminCommand(std::string_view command) {
  for (const AdminOpInfo& i : AdminOps()) {
    if (command == i.command) return &i;
  }
  return nullptr;
}

const AdminOpInfo& Info(AdminOp op) {
  for (const AdminOpInfo& i : AdminOps()) {
    if (i.op == op) return i;
  }
  return AdminOps().front();  // unreachable: the table lists every AdminOp
}

const char* AdminOpName(AdminOp op) { return Info(op).wire; }

namespace {

// The operations that take a field, for the refusal's text ("scale_out, scale_in").
std::string Takers(bool AdminOpInfo::*field) {
  std::string out;
  for (const AdminOpInfo& i : AdminOps()) {
    if (i.*field) out += (out.empty() ? "" : ", ") + std::string(i.wire);
  }
  return out;
}

}  // namespace

Status CheckAdminFields(const pb::AdminRequest& req) {
  const AdminOpInfo* info = FindAdminOp(req.op());
  if (info == nullptr) return Status::Ok();
  auto refuse = [&req](const char* field, bool AdminOpInfo::*takers) {
    return Status(Code::kInvalidArgument, std::string("field '") + field + "' does not apply to " + req.op() +
                                              " (only " + Takers(takers) + ")");
  };
  if (!info->takes_totals && req.worker_num() != 0) return refuse("worker_num", &AdminOpInfo::takes_totals);
  if (!info->takes_totals && req.server_num() != 0) return refuse("server_num", &AdminOpInfo::takes_totals);
  if (!info->takes_ids && req.node_ids_size() != 0) return refuse("node_ids", &AdminOpInfo::takes_ids);
  return Status::Ok();
}

}  // namespace pscore::node
