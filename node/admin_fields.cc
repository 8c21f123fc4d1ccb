#include "node/admin_fields.h"

#include <string>

namespace pscore::node {

Status CheckAdminFields(const pb::AdminRequest& req) {
  const std::string& op = req.op();
  const bool totals = op == "scale_out" || op == "scale_in";
  const bool ids = op == "scale_in" || op == "reset";
  auto refuse = [&op](const char* field, const char* takers) {
    return Status(Code::kInvalidArgument,
                  std::string("field '") + field + "' does not apply to " + op + " (only " + takers + ")");
  };
  if (!totals && req.worker_num() != 0) return refuse("worker_num", "scale_out, scale_in");
  if (!totals && req.server_num() != 0) return refuse("server_num", "scale_out, scale_in");
  if (!ids && req.node_ids_size() != 0) return refuse("node_ids", "scale_in, reset");
  return Status::Ok();
}

}  // namespace pscore::node
