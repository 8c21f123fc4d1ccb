// ClusterManager, liveness and errors: heartbeats, the timeout scan, a scheduler stall,
// errors reported or found, resets, and a replica's resync. Registration is in
// cluster_manager.cc.
#include "pscore/core/cluster_manager.h"

#include <algorithm>
#include <tuple>

#include <glog/logging.h>

namespace pscore::core {

using internal::Cat;
using internal::Err;
using internal::Label;

Status ClusterManager::Beat(const std::string& node_id, const uint64_t* incarnation, NodeHint* hint) {
  NodeRecord* rec = nullptr;
  if (hint != nullptr && hint->generation == generation_ && hint->rec != nullptr && hint->node_id == node_id) {
    rec = hint->rec;  // the hint's copy of the id is warm; the record is touched once below
  } else {
    rec = Mutable(node_id);
    if (hint != nullptr) *hint = NodeHint{rec, generation_, node_id};
  }
  if (rec == nullptr) {
    return Err(Code::kNotFound, "unknown node ", node_id, "; register again");
  }
  // A timed-out node lost its place in the live set; registering again restores it.
  if (rec->timed_out) {
    return Err(Code::kNotFound, "node ", node_id, " timed out; register again");
  }
  if (rec->reset_pending) {
    return Err(Code::kNotFound, "node ", node_id, " was reset; register again");
  }
  if (incarnation != nullptr && *incarnation != rec->incarnation) {
    return Err(Code::kAborted, "heartbeat of node ", node_id, " carries incarnation ", *incarnation,
               ", but the member registered is incarnation ", rec->incarnation);
  }
  rec->last_heartbeat = clock_->Now();
  if (rec->in_error && !Recoverable(rec->role)) {
    return Err(Code::kAborted, "node ", node_id, " is in error (code ", rec->error_code, ": ", rec->error_message,
               "); reset it before it registers again");
  }
  return Status::Ok();
}

void ClusterManager::SeenEpoch(uint64_t known) {
  if (!restored_epoch_ || known <= epoch_) return;
  if (known - *restored_epoch_ > kMaxEpochLead) {
    LOG_EVERY_T(WARNING, 10.0) << "a member claims membership epoch " << known << ", " << known - *restored_epoch_
                               << " past the restored " << *restored_epoch_ << "; not believed";
    return;
  }
  LOG(WARNING) << "a member knows membership epoch " << known << ", newer than the restored " << epoch_
               << " (published before the last state write): publishing the membership after it";
  epoch_ = known;
  if (state_ == pb::ClUSTER_STARTING) {
    ++epoch_;
    return;
  }
  PublishMetadata();
}

void ClusterManager::Pause(Duration stalled) {
  if (stalled <= Duration::zero()) return;
  const TimePoint now = clock_->Now();
  for (NodeRecord* rec : MutableNodes()) {
    if (!rec->timed_out) rec->last_heartbeat = std::min(now, rec->last_heartbeat + stalled);
  }
  if (scaling_) op_.started = std::min(now, op_.started + stalled);
}

// Every live member silent at once (some past the heartbeat timeout, none heard in the
// last half of it): more likely this scheduler's link than that many failures. True while
// their timeouts wait (the scan then runs at every tick).
bool ClusterManager::HoldForIsolation(const std::vector<NodeRecord*>& expired, size_t live, TimePoint last_heard,
                                      TimePoint now) {
  if (config_.isolation_timeout <= Duration::zero() || live < 2 || expired.empty() ||
      now - last_heard <= config_.heartbeat_timeout / 2) {
    isolated_since_.reset();
    return false;
  }
  if (!isolated_since_) {
    isolated_since_ = last_heard;
    LOG(WARNING) << "every member (" << live << ") silent at once, none heard for " << ToMillis(now - last_heard)
                 << " ms: taken for this scheduler's own network, not " << live
                 << " failures; their timeouts wait up to "
                 << ToMillis(config_.isolation_timeout) << " ms from the last heartbeat for any of them";
  }
  if (now - *isolated_since_ <= config_.isolation_timeout) {
    next_timeout_scan_ = TimePoint::min();
    return true;
  }
  LOG(WARNING) << "no member heard for " << ToMillis(now - *isolated_since_) << " ms (isolation timeout "
               << ToMillis(config_.isolation_timeout) << " ms): they time out";
  isolated_since_.reset();
  return false;
}

// A member heard again ends an isolation: the silence was this scheduler's network, so
// it counts against no member (each still silent gets a fresh heartbeat timeout) and not
// against a scale's deadline.
void ClusterManager::EndIsolationIfHeard(TimePoint now) {
  const NodeRecord* heard = nullptr;
  for (const auto& [id, rec] : nodes_) {
    if (!rec.timed_out && rec.last_heartbeat > *isolated_since_) heard = &rec;
  }
  if (heard == nullptr) return;
  const Duration silent = now - *isolated_since_;
  LOG(WARNING) << Label(*heard) << " heard again after every member was silent for " << ToMillis(silent)
               << " ms: this scheduler's own network; every member gets a fresh heartbeat timeout";
  isolated_since_.reset();
  Pause(silent);
}

void ClusterManager::Tick() {
  if (state_ == pb::CLUSTER_EXIT) return;
  const TimePoint now = clock_->Now();
  if (isolated_since_) EndIsolationIfHeard(now);
  std::string first_timeout;
  if (now > next_timeout_scan_) {
    // One pass over the records, in no order; the (rare) expired ones are then handled in
    // role, rank order so logs and events read the same every run.
    TimePoint earliest = TimePoint::max();
    std::vector<NodeRecord*> expired;
    size_t live = 0;
    TimePoint last_heard = TimePoint::min();
    for (auto& [id, rec] : nodes_) {
      if (rec.timed_out) continue;
      ++live;
      last_heard = std::max(last_heard, rec.last_heartbeat);
      const TimePoint deadline = rec.last_heartbeat + config_.heartbeat_timeout;
      if (now > deadline) {
        expired.push_back(&rec);
      } else {
        earliest = std::min(earliest, deadline);
      }
    }
    next_timeout_scan_ = earliest;
    if (HoldForIsolation(expired, live, last_heard, now)) expired.clear();
    std::sort(expired.begin(), expired.end(), [](const NodeRecord* a, const NodeRecord* b) {
      return std::tie(a->role, a->rank, a->node_id) < std::tie(b->role, b->rank, b->node_id);
    });
    for (NodeRecord* rec : expired) {
      const Duration silent = now - rec->last_heartbeat;
      SetTimedOut(rec, true);
      RefreshNodeState(rec);
      rec->lost_cause = Cat("no heartbeat for ", ToMillis(silent), " ms");
      LOG(WARNING) << Label(*rec) << " timed out: silent for " << ToMillis(silent) << " ms";
      Emit(Event::Kind::kNodeTimedOut, rec).message = Cat("silent for ", ToMillis(silent), " ms");
      if (first_timeout.empty()) first_timeout = Label(*rec);
    }
    // Replicated ranges: a new epoch whose metadata marks the lost server down promotes
    // the next live replica of each of its ranges (docs/reliability.md).
    const bool server_lost = std::any_of(expired.begin(), expired.end(), [](const NodeRecord* rec) {
      return rec->role == pb::SERVER && rec->in_metadata;
    });
    if (server_lost && config_.replicas >= 2 && !scaling_) PublishMetadata();
  }
  if (scaling_ && !isolated_since_) {
    const char* what = op_.kind == ScaleKind::kOut ? "scale-out" : "scale-in";
    if (!first_timeout.empty()) {
      Rollback(Cat(first_timeout, " timed out during ", what));
    } else if (now - op_.started > config_.scale_timeout) {
      Rollback(Cat(what, " timed out after ", ToMillis(config_.scale_timeout), " ms: ",
                   ScaleProgress()));
    }
  }
  RefreshTimeoutState();
  CheckFinish();
}

Status ClusterManager::ResyncDone(const std::string& node_id, uint64_t incarnation) {
  NodeRecord* rec = Mutable(node_id);
  if (rec == nullptr) return Status(Code::kNotFound, "unknown node " + node_id);
  if (rec->incarnation != incarnation) {
    return Err(Code::kAborted, Label(*rec), ": resync done from incarnation ", incarnation, ", registered ",
               rec->incarnation);
  }
  if (!rec->resyncing) return Status::Ok();  // a repeat: the epoch that marked it live is out
  if (rec->timed_out) return Err(Code::kFailedPrecondition, Label(*rec), " is timed out: register again");
  rec->resyncing = false;
  LOG(INFO) << Label(*rec) << " resynced: a replica of its key ranges again";
  if (!scaling_) PublishMetadata();
  return Status::Ok();
}

Status ClusterManager::ReportError(const std::string& node_id, int code,
                                   const std::string& message) {
  NodeRecord* rec = Mutable(node_id);
  if (rec == nullptr) return Status(Code::kNotFound, "unknown node " + node_id);
  LOG(WARNING) << Label(*rec) << " reported error " << code << ": " << message;
  RecordError(rec, code, message, /*reported=*/true);
  return Status::Ok();
}

void ClusterManager::RecordError(NodeRecord* rec, int code, const std::string& message, bool reported) {
  SetInError(rec, true);
  rec->error_code = code;
  rec->error_message = message;
  RefreshNodeState(rec);
  Event& e = Emit(Event::Kind::kNodeError, rec);
  e.error_code = code;
  e.message = message;
  e.propagate = !Recoverable(rec->role);
  e.reported = reported;
}

// Clears the error; the member (the same process, or a new one) registers again next.
Status ClusterManager::ResetNode(const std::string& node_id) {
  NodeRecord* rec = Mutable(node_id);
  if (rec == nullptr) return Status(Code::kNotFound, "unknown node " + node_id);
  SetInError(rec, false);
  rec->error_code = 0;
  rec->error_message.clear();
  rec->late_to_finish = false;
  rec->reset_pending = true;
  RefreshNodeState(rec);
  return Status::Ok();
}

}  // namespace pscore::core
