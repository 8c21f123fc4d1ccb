// ClusterManager, snapshot and restore for a scheduler that restarts with --state_dir (the
// records' conversion is in node_record.h, the file format in state_file.h).
#include <glog/logging.h>

#include "pscore/core/cluster_manager.h"
#include "pscore/core/state_file.h"

namespace pscore::core {

using internal::Cat;

pb::PersistedState ClusterManager::Snapshot() const {
  pb::PersistedState out;
  out.set_cluster_state(state_);
  out.set_epoch(epoch_);
  out.set_worker_num(worker_num_);
  out.set_server_num(server_num_);
  out.set_finish_passed(finish_passed_);
  out.set_session_id(session_id_);
  if (outcome_.result != JobOutcome::Result::kRunning) {
    out.set_job_result(JobResultName(outcome_.result));
    out.set_job_failure(outcome_.failure);
    for (const std::string& id : outcome_.failed_nodes) out.add_failed_nodes(id);
  }
  for (const NodeRecord* rec : Nodes()) ToPersisted(*rec, out.add_nodes());
  for (const std::string& id : left_order_) {
    pb::PersistedLeft* left = out.add_left();
    left->set_node_id(id);
    left->set_incarnation(left_.at(id));
  }
  if (scaling_) {
    pb::PersistedScale* s = out.mutable_scale();
    s->set_scale_in(op_.kind == ScaleKind::kIn);
    s->set_old_worker_num(op_.old_worker_num);
    s->set_old_server_num(op_.old_server_num);
    for (const std::string& id : op_.added) s->add_added(id);
  }
  return out;
}

bool IsStaleSession(const Status& st) {
  return st.code() == Code::kFailedPrecondition && st.message().rfind(kStaleSessionPrefix, 0) == 0;
}

bool IsQuotaFull(const Status& st) {
  return st.code() == Code::kInvalidArgument && st.message().find(kQuotaFullMark) != std::string::npos;
}

bool IsScaleInRunning(const Status& st) {
  return st.code() == Code::kFailedPrecondition && st.message().rfind(kScaleInRunningPrefix, 0) == 0;
}

Status ClusterManager::CheckSession(uint64_t carried) const {
  if (carried == 0 || carried == session_id_) return Status::Ok();
  return internal::Err(Code::kFailedPrecondition, kStaleSessionPrefix, " ", carried, ": this scheduler's session is ",
                       session_id_, " (the state that session named is gone); register again");
}

// What a restart changes:
// - every node gets last_heartbeat = now: a full heartbeat timeout to re-register (with
//   its node id and incarnation, a harmless retry that keeps its rank); a node that does
//   not come back times out as usual;
// - a scale operation under way is rolled back (its per-node progress was not kept, and
//   the nodes lost the link in the middle of it): added nodes are dropped, leaving nodes
//   stay, the old totals return;
// - otherwise a published membership is republished one epoch later, so that nodes take
//   it even if the write of their newest epoch was lost in the crash.
Status ClusterManager::Restore(const pb::PersistedState& state) {
  if (!nodes_.empty() || state_ != pb::ClUSTER_STARTING || epoch_ != 0) {
    return Status(Code::kFailedPrecondition, "restore needs a fresh cluster manager");
  }
  PSCORE_RETURN_IF_ERROR(ValidateState(state));
  if (state.cluster_state() == pb::CLUSTER_EXIT) {
    return Status(Code::kFailedPrecondition, "the persisted job had ended (CLUSTER_EXIT)");
  }
  const TimePoint now = clock_->Now();
  for (const pb::PersistedNode& n : state.nodes()) {
    NodeRecord rec = FromPersisted(n);
    rec.last_heartbeat = now;
    AddNode(std::move(rec));
  }
  for (const pb::PersistedLeft& left : state.left()) RememberLeft(left.node_id(), left.incarnation());
  worker_num_ = state.worker_num();
  server_num_ = state.server_num();
  epoch_ = state.epoch();
  restored_epoch_ = epoch_;
  state_ = state.cluster_state();
  finish_passed_ = false;
  if (state.session_id() != 0) session_id_ = state.session_id();  // a file of an older build has none
  InvalidateRanks();
  for (NodeRecord* rec : MutableNodes()) RefreshNodeState(rec);
  LOG(INFO) << "restored " << nodes_.size() << " nodes, state " << ClusterStateName(state_) << ", epoch "
            << epoch_ << ", totals " << worker_num_ << " workers / " << server_num_ << " servers";
  if (state.has_scale()) {
    const pb::PersistedScale& s = state.scale();
    op_ = ScaleOp();
    op_.kind = s.scale_in() ? ScaleKind::kIn : ScaleKind::kOut;
    op_.started = now;
    op_.old_worker_num = s.old_worker_num();
    op_.old_server_num = s.old_server_num();
    op_.added.insert(s.added().begin(), s.added().end());
    scaling_ = true;
    Rollback(Cat("the scheduler restarted during ", s.scale_in() ? "scale-in" : "scale-out"));
  } else if (state_ != pb::ClUSTER_STARTING) {
    PublishMetadata();
    EmitRaw(Event::Kind::kStateChanged);
  }
  RefreshTimeoutState();
  return Status::Ok();
}

}  // namespace pscore::core
