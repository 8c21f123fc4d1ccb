// SchedulerNode, the admin operations (AdminOp, pscore/node/common/admin_ops.h): ADMIN over
// the native protocol, the same operations for the HTTP surface, who may run them under
// TLS, and the status, nodes and barriers answers.
#include <algorithm>

#include "pscore/core/node_record.h"
#include "pscore/node/common/admin_ops.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

pb::AdminResponse SchedulerNode::StatusResponse(bool with_nodes) const {
  DCHECK(loop_->InLoopThread());
  pb::AdminResponse resp;
  resp.set_cluster_state(cluster_.state());
  resp.set_epoch(cluster_.epoch());
  resp.set_worker_num(cluster_.worker_num());
  resp.set_server_num(cluster_.server_num());
  resp.set_registered_workers(cluster_.registered(pb::WORKER));
  resp.set_registered_servers(cluster_.registered(pb::SERVER));
  resp.set_last_scale_result(last_scale_result_);
  const core::JobOutcome& outcome = cluster_.outcome();
  resp.set_job_result(core::JobResultName(outcome.result));
  resp.set_job_failure(outcome.failure);
  for (const std::string& id : outcome.failed_nodes) resp.add_failed_nodes(id);
  if (!with_nodes) return resp;
  TimePoint now = clock_.Now();
  // A resyncing server is listed alive while it heartbeats (and marked resyncing).
  for (const core::NodeRecord* rec : cluster_.Nodes()) {
    core::ToServersMeta(*rec, now, core::Liveness::kHeartbeat, resp.add_nodes());
  }
  return resp;
}

pb::AdminResponse SchedulerNode::BarriersResponse() const {
  DCHECK(loop_->InLoopThread());
  pb::AdminResponse resp = StatusResponse(false);
  for (const core::BarrierInfo& b : barriers_.List()) {
    pb::BarrierInfo* out = resp.add_barriers();
    out->set_id(b.id);
    out->set_generation(b.generation);
    out->set_state(core::BarrierStateName(b.state));
    out->set_arrived(static_cast<int32_t>(b.arrived));
    out->set_expected(static_cast<int32_t>(b.expected));
    for (const std::string& m : b.missing) out->add_missing(m);
    if (!b.result.ok()) out->set_result(b.result.ToString());
  }
  return resp;
}

void SchedulerNode::Admin(const pb::AdminRequest& req, std::function<void(Status, pb::AdminResponse)> cb) {
  DCHECK(loop_->InLoopThread());
  const AdminOpInfo* info = FindAdminOp(req.op());
  if (info == nullptr) {
    return cb(Status(Code::kInvalidArgument, "unknown admin operation '" + req.op() + "'"), StatusResponse(false));
  }
  Status st = CheckAdminFields(req);
  if (!st.ok()) return cb(st, StatusResponse(false));
  // The reads answer with more than the status.
  if (info->op == AdminOp::kNodes) return cb(Status::Ok(), StatusResponse(true));
  if (info->op == AdminOp::kBarriers) return cb(Status::Ok(), BarriersResponse());
  st = RunAdminOp(*info, req);
  pb::AdminResponse resp = StatusResponse(false);
  if (st.ok() && info->op != AdminOp::kStatus) resp.set_message(std::string(info->wire) + " accepted");
  cb(st, resp);
  DrainEvents();
}

Status SchedulerNode::RunAdminOp(const AdminOpInfo& info, const pb::AdminRequest& req) {
  DCHECK(loop_->InLoopThread());
  switch (info.op) {
    case AdminOp::kStatus:
    case AdminOp::kNodes:
    case AdminOp::kBarriers:
      return Status::Ok();  // reads: nothing to run
    case AdminOp::kScaleOut:
      return cluster_.ScaleOut(req.worker_num(), req.server_num());
    case AdminOp::kScaleIn:
      return req.node_ids_size() > 0 ? cluster_.ScaleInByIds({req.node_ids().begin(), req.node_ids().end()})
                                     : cluster_.ScaleInByCounts(req.worker_num(), req.server_num());
    case AdminOp::kNewInstance:
      return cluster_.SetState(pb::CLUSTER_NEW_INSTANCE);
    case AdminOp::kEnable:
      return cluster_.SetState(pb::CLUSTER_ENABLE_FLS);
    case AdminOp::kDisable:
      return cluster_.SetState(pb::CLUSTER_DISABLE_FLS);
    case AdminOp::kReset: {  // clears the error state of node_ids (ClusterManager::ResetNode)
      if (req.node_ids_size() == 0) return Status(Code::kInvalidArgument, "reset needs node ids");
      Status st;
      for (const std::string& id : req.node_ids()) {
        if (st.ok()) st = cluster_.ResetNode(id);
        if (st.ok()) barriers_.NodeRecovered(id);
      }
      if (st.ok()) MarkStateDirty(/*urgent=*/true);  // the error state is persisted
      return st;
    }
    case AdminOp::kStop:
      return cluster_.SetState(pb::CLUSTER_EXIT);
  }
  return Status(Code::kInvalidArgument, "unknown admin operation");  // unreachable: every AdminOp is above
}

// A member's certificate is as CA-signed as an operator's: the CN tells them apart, so a
// compromised or misconfigured member cannot steer the job.
Status SchedulerNode::CheckAdminCertificate(const std::string& op, const std::string& cn,
                                            const std::string& peer) const {
  if (options_.tls == nullptr) return Status::Ok();
  const AdminOpInfo* info = FindAdminOp(op);
  if (info != nullptr && info->any_certificate) return Status::Ok();
  const std::vector<std::string>& allowed = options_.tls_admin_cns;
  if (std::find(allowed.begin(), allowed.end(), cn) != allowed.end()) return Status::Ok();
  std::string list;
  for (const std::string& a : allowed) list += (list.empty() ? "" : ",") + a;
  Status why(Code::kPermissionDenied, "admin '" + op + "' refused: the TLS certificate of " + peer + " (CN=" + cn +
                                          ") is not an admin certificate (--tls_admin_cns=" + list + ")");
  LOG(ERROR) << "scheduler: " << why.message();
  return why;
}

void SchedulerNode::HandleAdmin(ConnId conn, const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  pb::AdminRequest req;
  Status st = ParsePayload(frame, &req);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  if (options_.tls != nullptr) {
    st = CheckAdminCertificate(req.op(), messenger_->transport().PeerIdentity(conn),
                               messenger_->transport().PeerAddress(conn));
    if (!st.ok()) return Reply(conn, frame.meta, st);
  }
  pb::MessageMeta meta = frame.meta;
  Admin(req, [this, conn, meta](Status s, pb::AdminResponse resp) { Reply(conn, meta, s, ToBuffer(resp)); });
}

}  // namespace pscore::node
