// ClusterManager, part three: snapshot and restore for a scheduler that restarts with
// --state_dir. The registry and rules are in cluster_manager.cc, scaling in
// cluster_manager_scale.cc, the file format in state_file.h.
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
  for (const NodeRecord* rec : Nodes()) {
    pb::PersistedNode* n = out.add_nodes();
    n->set_node_id(rec->node_id);
    n->set_role(rec->role);
    n->set_rank(rec->rank);
    n->set_ip(rec->ip);
    n->set_port(rec->port);
    n->set_incarnation(rec->incarnation);
    for (const pb::Device& d : rec->devices) *n->add_devices() = d;
    n->set_host_name(rec->host_name);
    n->set_in_error(rec->in_error);
    n->set_error_code(rec->error_code);
    n->set_error_message(rec->error_message);
    n->set_finished(rec->finished);
    n->set_leaving(rec->leaving);
    n->set_timed_out(rec->timed_out);
    n->set_in_metadata(rec->in_metadata);
    n->set_resyncing(rec->resyncing);
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
    NodeRecord& rec = AddNode(n.node_id(), n.role());
    rec.rank = n.rank();
    rec.ip = n.ip();
    rec.port = n.port();
    rec.incarnation = n.incarnation();
    rec.devices.assign(n.devices().begin(), n.devices().end());
    rec.host_name = n.host_name();
    rec.last_heartbeat = now;
    SetInError(&rec, n.in_error());
    rec.error_code = n.error_code();
    rec.error_message = n.error_message();
    rec.finished = n.finished();
    rec.leaving = n.leaving();
    SetTimedOut(&rec, n.timed_out());
    rec.in_metadata = n.in_metadata();
    rec.resyncing = n.resyncing();
  }
  worker_num_ = state.worker_num();
  server_num_ = state.server_num();
  epoch_ = state.epoch();
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
