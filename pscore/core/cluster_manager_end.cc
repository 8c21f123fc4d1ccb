// ClusterManager, the job's end: the finish barrier, the job's outcome, and the admin
// states (new instance, disable/enable, stop).
#include "pscore/core/cluster_manager.h"

#include <glog/logging.h>

#include "pscore/core/key_range.h"
#include "pscore/core/role_names.h"

namespace pscore::core {

using internal::Cat;
using internal::Err;
using internal::Label;

Status ClusterManager::Finish(const std::string& node_id) {
  NodeRecord* rec = Mutable(node_id);
  if (rec == nullptr) return Status(Code::kNotFound, "unknown node " + node_id);
  if (finish_passed_ && rec->finished) {
    return Err(Code::kFailedPrecondition, "node ", node_id, " already left");
  }
  rec->finished = true;
  RefreshNodeState(rec);
  CheckFinish();
  return Status::Ok();
}

std::vector<std::string> ClusterManager::FinishMissing() const {
  std::vector<std::string> missing;
  for (const NodeRecord* rec : Nodes()) {
    if (!rec->timed_out && !rec->finished) missing.push_back(rec->node_id);
  }
  return missing;
}

void ClusterManager::FinishTimedOut(const std::vector<std::string>& late) {
  for (const std::string& node_id : late) {
    NodeRecord* rec = Mutable(node_id);
    if (rec == nullptr || rec->in_error || rec->finished) continue;
    RecordError(rec, static_cast<int>(Code::kTimeout),
                Cat("finish barrier timed out waiting for ", RoleLabel(rec->role), " ", node_id), /*reported=*/false);
    rec->late_to_finish = true;
  }
}

// The finish barrier covers live nodes: timed-out nodes do not hold it up, and nodes that
// left in a scale-in are gone from the registry. It cannot pass before the cluster was READY.
void ClusterManager::CheckFinish() {
  if (finish_passed_ || state_ == pb::ClUSTER_STARTING || state_ == pb::CLUSTER_EXIT) return;
  bool any_finished = false;
  for (const auto& [id, rec] : nodes_) {
    if (!rec.timed_out && !rec.finished) return;
    any_finished = any_finished || rec.finished;
  }
  // Every live node finished. Once a node called Finish the barrier is under way, so it
  // also passes when no live node is left at all (every one timed out, the finished ones
  // too: nobody is left to finish, and the outcome below names the lost ones). Before any
  // Finish, a cluster whose every node timed out waits for them to come back.
  if (!any_finished) return;
  finish_passed_ = true;
  scaling_ = false;
  for (NodeRecord* rec : MutableNodes()) RefreshNodeState(rec);
  SetOutcomeAtFinish();
  state_ = pb::CLUSTER_EXIT;
  const bool failed = outcome_.result == JobOutcome::Result::kFailed;
  for (Event::Kind kind : {Event::Kind::kFinishPassed, Event::Kind::kStateChanged}) {
    Event& e = EmitRaw(kind);
    if (failed) {
      e.error_code = static_cast<int>(Code::kAborted);
      e.message = "job failed: " + outcome_.failure;
    }
  }
}

// The barrier passed. Nodes still timed out that never called Finish died and were not
// brought back in time, and nodes still in error (reported, never reset): the job failed.
// A node that finished and then went silent had done its part.
void ClusterManager::SetOutcomeAtFinish() {
  outcome_ = JobOutcome();
  for (const NodeRecord* rec : Nodes()) {
    std::string what;
    if (rec->timed_out && !rec->finished) {
      if (rec->role == pb::SERVER && ServerCovered(*rec)) {
        LOG(WARNING) << Label(*rec) << " lost; its key ranges live on in their replicas";
        continue;
      }
      what = Cat("lost (", rec->lost_cause.empty() ? "timed out" : rec->lost_cause, ")");
    } else if (rec->in_error && !(rec->late_to_finish && rec->finished)) {
      // Reported an error and was neither reset nor restarted: its part is not done. (A
      // node late to a timed-out finish barrier that finished after all did its part.)
      what = Cat("in error (", rec->error_code, ": ", rec->error_message, ")");
    } else {
      continue;
    }
    outcome_.failure += Cat(outcome_.failure.empty() ? "" : "; ", RoleLabel(rec->role), " ", rec->node_id, " ", what);
    outcome_.failed_nodes.push_back(rec->node_id);
  }
  if (outcome_.failed_nodes.empty()) {
    outcome_.result = JobOutcome::Result::kFinished;
    LOG(INFO) << "finish barrier passed; cluster exiting";
  } else {
    outcome_.result = JobOutcome::Result::kFailed;
    LOG(ERROR) << "finish barrier passed; the job failed: " << outcome_.failure;
  }
}

bool ClusterManager::ServerCovered(const NodeRecord& lost) const {
  if (config_.replicas < 2 || server_num_ <= 0 || lost.rank < 0 || lost.rank >= server_num_) return false;
  std::vector<char> live(static_cast<size_t>(server_num_), 0);
  for (const auto& [id, rec] : nodes_) {
    if (rec.role == pb::SERVER && rec.rank >= 0 && rec.rank < server_num_ && !rec.timed_out && !rec.resyncing) {
      live[static_cast<size_t>(rec.rank)] = 1;
    }
  }
  for (int range = 0; range < server_num_; ++range) {
    if (HoldsRange(lost.rank, range, server_num_, config_.replicas) &&
        PrimaryOf(range, server_num_, config_.replicas, live) < 0) {
      return false;
    }
  }
  return true;
}

// Admin states. NEW_INSTANCE passes through and returns to READY. DISABLE_FLS is sticky:
// the cluster stays disabled (no scaling, no NODE_TIMEOUT state) until ENABLE_FLS, which
// passes through ENABLE_FLS back to READY (or NODE_TIMEOUT if nodes timed out meanwhile).
// CLUSTER_EXIT terminates from any state and abandons a running scale operation.
Status ClusterManager::SetState(pb::ClusterState state) {
  const std::string now = " (state is " + ClusterStateName(state_) + ")";
  switch (state) {
    case pb::CLUSTER_NEW_INSTANCE:
    case pb::CLUSTER_DISABLE_FLS:
      if (state_ != pb::CLUSTER_READY) {
        return Err(Code::kFailedPrecondition, ClusterStateName(state), " needs CLUSTER_READY", now);
      }
      SetClusterState(state);
      if (state == pb::CLUSTER_NEW_INSTANCE) SetClusterState(pb::CLUSTER_READY);
      return Status::Ok();
    case pb::CLUSTER_ENABLE_FLS:
      if (state_ != pb::CLUSTER_DISABLE_FLS) {
        return Err(Code::kFailedPrecondition, "cluster is not disabled", now);
      }
      SetClusterState(pb::CLUSTER_ENABLE_FLS);
      SetClusterState(pb::CLUSTER_READY);
      RefreshTimeoutState();
      return Status::Ok();
    case pb::CLUSTER_EXIT:
      if (state_ == pb::CLUSTER_EXIT) {
        return Status(Code::kFailedPrecondition, "cluster is already exiting");
      }
      scaling_ = false;
      outcome_ = JobOutcome();
      outcome_.result = JobOutcome::Result::kStopped;
      LOG(INFO) << "cluster terminated by admin";
      SetClusterState(pb::CLUSTER_EXIT);
      return Status::Ok();
    default:
      return Err(Code::kInvalidArgument, "cluster state ", ClusterStateName(state),
                 " cannot be set by admin");
  }
}

}  // namespace pscore::core
