#include "pscore/core/cluster_manager.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include <glog/logging.h>

#include "pscore/core/key_range.h"

namespace pscore::core {
namespace {

using internal::Cat;
using internal::Err;

std::string Label(const NodeRecord& rec) {
  return Cat(RoleName(rec.role), " ", rec.node_id, " (rank ", rec.rank, ")");
}

std::vector<pb::Device> SortedDevices(std::vector<pb::Device> devices) {
  std::sort(devices.begin(), devices.end(),
            [](const pb::Device& a, const pb::Device& b) { return a.local_id() < b.local_id(); });
  return devices;
}

// Compares what the node declares; global_id is ours and is ignored.
bool SameDevices(const std::vector<pb::Device>& a, const std::vector<pb::Device>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].local_id() != b[i].local_id() || a[i].device_ip() != b[i].device_ip() ||
        a[i].super_device_id() != b[i].super_device_id() ||
        a[i].super_pod_id() != b[i].super_pod_id()) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string RoleName(pb::NodeRole role) {
  if (role == pb::SERVER) return "server";
  if (role == pb::WORKER) return "worker";
  const std::string name = pb::NodeRole_Name(role);
  return name.empty() ? std::to_string(static_cast<int>(role)) : name;
}

const char* JobResultName(JobOutcome::Result result) {
  switch (result) {
    case JobOutcome::Result::kRunning: return "running";
    case JobOutcome::Result::kFinished: return "finished";
    case JobOutcome::Result::kFailed: return "failed";
    case JobOutcome::Result::kStopped: return "stopped";
  }
  return "running";
}

std::string ClusterStateName(pb::ClusterState state) {
  if (state == pb::ClUSTER_STARTING) return "CLUSTER_STARTING";  // the wire enum keeps the reference's typo
  const std::string name = pb::ClusterState_Name(state);
  return name.empty() ? std::to_string(static_cast<int>(state)) : name;
}

ClusterManager::ClusterManager(ClusterConfig config, const Clock* clock)
    : config_(config), clock_(clock), worker_num_(config.worker_num),
      server_num_(config.server_num) {}

// Registration rules:
// - role must be SERVER or WORKER; ranks are dense per role in arrival order (the lowest free
//   rank), or the requested rank when it is free and below the role's total;
// - a known node_id keeps its rank (see Reregister);
// - when every expected node is in during STARTING, the topology is published and the
//   cluster goes READY; during a scale-out, new nodes take the ranks after the old ones.
Result<RegisterOutcome> ClusterManager::Register(const RegisterRequest& req) {
  if (req.role != pb::SERVER && req.role != pb::WORKER) {
    return Err(Code::kInvalidArgument, "unknown role ", RoleName(req.role), " for node ",
               req.node_id, ": must be SERVER or WORKER");
  }
  if (req.node_id.empty()) return Status(Code::kInvalidArgument, "register with empty node_id");
  if (state_ == pb::CLUSTER_EXIT) {
    return Err(Code::kFailedPrecondition, "cluster is exiting; node ", req.node_id, " refused");
  }
  if (NodeRecord* rec = Mutable(req.node_id)) return Reregister(rec, req);
  return AdmitNew(req);
}

// A known node_id comes back. Same incarnation: a harmless retry (a timed-out node
// recovers). New incarnation: the old process and its state are gone. For a role declared
// recoverable, or a member reset since it last registered, it is admitted as a restart (the
// error and finish flags cleared, NODE_RESTARTED). Otherwise the member is recorded in error
// (kAborted, told to every other member, its barriers failed) and refused until it is reset.
// A member in error is refused whatever its incarnation until it is reset.
Status ClusterManager::CheckReregister(const NodeRecord& rec,
                                       const RegisterRequest& req) const {
  if (req.role != rec.role) {
    return Err(Code::kInvalidArgument, "node ", rec.node_id, " registered as ",
               RoleName(rec.role), ", now claims ", RoleName(req.role));
  }
  std::vector<pb::Device> devices = SortedDevices(req.devices);
  if (!SameDevices(devices, rec.devices)) {
    return Err(Code::kInvalidArgument, "node ", rec.node_id, " changed its device list (",
               devices.size(), " devices, was ", rec.devices.size(), ")");
  }
  if (req.requested_rank >= 0 && req.requested_rank != rec.rank) {
    return Err(Code::kInvalidArgument, "node ", rec.node_id, " holds ", RoleName(rec.role),
               " rank ", rec.rank, ", cannot re-register as rank ", req.requested_rank);
  }
  const bool restart_ok = rec.reset_pending || Recoverable(rec.role);
  if (rec.in_error && !(restart_ok && req.incarnation != rec.incarnation)) {
    return Err(Code::kFailedPrecondition, "node ", rec.node_id, " is in error (code ",
               rec.error_code, ": ", rec.error_message, "); reset it before it registers again");
  }
  return Status::Ok();
}

bool ClusterManager::Recoverable(pb::NodeRole role) const {
  return std::find(config_.recoverable_roles.begin(), config_.recoverable_roles.end(), role) !=
         config_.recoverable_roles.end();
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

// A new process under the node id of a member whose role is not recoverable: whatever the
// old one held is lost, which the others must hear of; it may join once reset.
Status ClusterManager::RefuseNewIncarnation(NodeRecord* rec, const RegisterRequest& req) {
  const std::string why = Cat(RoleName(rec->role), " ", rec->node_id, " restarted (incarnation ",
                              rec->incarnation, " -> ", req.incarnation, "): the state of its old process is lost");
  LOG(WARNING) << Label(*rec) << ": " << why << "; recorded in error";
  RecordError(rec, static_cast<int>(Code::kAborted), why, /*reported=*/false);
  return Err(Code::kAborted, why, "; it is recorded in error: reset it (pscore-admin reset ", rec->node_id,
             ") before it registers again, or declare its role in --recoverable_roles");
}

Result<RegisterOutcome> ClusterManager::Reregister(NodeRecord* rec, const RegisterRequest& req) {
  PSCORE_RETURN_IF_ERROR(CheckReregister(*rec, req));
  const bool restarted = req.incarnation != rec->incarnation;
  if (restarted && !rec->reset_pending && !Recoverable(rec->role)) return RefuseNewIncarnation(rec, req);
  RegisterOutcome out;
  out.rank = rec->rank;
  rec->last_heartbeat = clock_->Now();
  next_timeout_scan_ = TimePoint::min();
  const bool recovered = rec->timed_out;
  const bool moved = rec->ip != req.ip || rec->port != req.port;
  rec->reset_pending = false;
  if (!restarted && !recovered && !moved) {
    out.retry = true;
    out.epoch = epoch_;
    return out;
  }
  rec->ip = req.ip;
  rec->port = req.port;
  rec->host_name = req.host_name;
  rec->incarnation = req.incarnation;
  SetTimedOut(rec, false);
  if (restarted) {
    SetInError(rec, false);
    rec->error_code = 0;
    rec->error_message.clear();
    rec->late_to_finish = false;
    rec->finished = false;
  }
  RefreshNodeState(rec);
  if (restarted) Emit(Event::Kind::kNodeRestarted, rec);
  if (recovered) Emit(Event::Kind::kNodeRecovered, rec);
  // A replica that missed pushes is not read until it is rebuilt from its ranges'
  // primaries (ResyncDone): marked resyncing, which is not alive.
  const bool resync = config_.replicas >= 2 && rec->role == pb::SERVER && rec->in_metadata;
  if (resync && !rec->resyncing) {
    rec->resyncing = true;
    LOG(WARNING) << Label(*rec) << " came back with replicas=" << config_.replicas
                 << ": resyncing (it missed pushes; rebuilt from its key ranges' primaries)";
  }
  if ((moved || resync) && rec->in_metadata) PublishMetadata();  // peers need the new address
  RefreshTimeoutState();
  out.restarted = restarted;
  out.epoch = epoch_;
  return out;
}

Result<RegisterOutcome> ClusterManager::AdmitNew(const RegisterRequest& req) {
  if (scaling_ && op_.kind == ScaleKind::kIn) {
    return Err(Code::kFailedPrecondition, "scale-in running; new node ", req.node_id, " refused");
  }
  const int total = Total(req.role);
  const int have = registered(req.role);
  if (have >= total) {
    return Err(Code::kInvalidArgument, "node ", req.node_id, " is not in the cluster: ", RoleName(req.role),
               " quota full (", have, "/", total, ")");
  }
  Result<int> rank = PickRank(req.role, req.requested_rank);
  if (!rank.ok()) return rank.status();
  NodeRecord& rec = AddNode(req.node_id, req.role);
  rec.rank = *rank;
  rank_taken_[req.role == pb::SERVER ? 0 : 1][*rank] = 1;  // PickRank just sized it
  rec.ip = req.ip;
  rec.port = req.port;
  rec.incarnation = req.incarnation;
  rec.devices = SortedDevices(req.devices);
  rec.host_name = req.host_name;
  rec.last_heartbeat = clock_->Now();
  if (scaling_) op_.added.insert(req.node_id);
  VLOG(1) << "registered " << Label(rec);
  AfterAdmit();
  RegisterOutcome out;
  out.rank = *rank;
  out.epoch = epoch_;
  return out;
}

Result<int> ClusterManager::PickRank(pb::NodeRole role, int requested) const {
  const int total = Total(role);
  if (requested < -1) {
    return Err(Code::kInvalidArgument, "requested ", RoleName(role), " rank ", requested, " is negative");
  }
  if (requested >= total) {
    return Err(Code::kFailedPrecondition, "requested ", RoleName(role), " rank ", requested,
               " out of range [0, ", total, "): the job is configured for ", total, " ", RoleName(role), "s");
  }
  const std::vector<char>& taken = RanksTaken(role);
  if (requested >= 0) {
    if (!taken[requested]) return requested;
    for (const auto& [id, rec] : nodes_) {  // only to name the owner in the refusal
      if (rec.role == role && rec.rank == requested) {
        return Err(Code::kAlreadyExists, RoleName(role), " rank ", requested, " already taken by node ", id);
      }
    }
    return Err(Code::kAlreadyExists, RoleName(role), " rank ", requested, " already taken");
  }
  const void* free = total == 0 ? nullptr : std::memchr(taken.data(), 0, taken.size());
  if (free != nullptr) return static_cast<int>(static_cast<const char*>(free) - taken.data());
  return Status(Code::kResourceExhausted, "no free " + RoleName(role) + " rank");
}

// The taken ranks of a role, kept across registrations (AdmitNew marks each new rank), so
// a storm of N registrations costs N cheap picks, not N walks of the registry. Rebuilt from
// the registry when invalidated (a removal, a rank compaction, a restore) or when the
// role's total changed.
const std::vector<char>& ClusterManager::RanksTaken(pb::NodeRole role) const {
  const int i = role == pb::SERVER ? 0 : 1;
  std::vector<char>& taken = rank_taken_[i];
  const size_t total = static_cast<size_t>(Total(role));
  if (!rank_taken_valid_[i] || taken.size() != total) {
    taken.assign(total, 0);
    for (const auto& [id, rec] : nodes_) {
      if (rec.role == role && rec.rank >= 0 && static_cast<size_t>(rec.rank) < total) taken[rec.rank] = 1;
    }
    rank_taken_valid_[i] = true;
  }
  return taken;
}

void ClusterManager::AfterAdmit() {
  if (state_ == pb::ClUSTER_STARTING) {
    if (registered(pb::SERVER) < server_num_ || registered(pb::WORKER) < worker_num_) return;
    PublishMetadata();
    LOG(INFO) << "cluster ready: " << server_num_ << " servers, " << worker_num_
              << " workers, epoch " << epoch_;
    SetClusterState(pb::CLUSTER_READY);
    RefreshTimeoutState();
    CheckFinish();
    return;
  }
  if (scaling_ && op_.kind == ScaleKind::kOut && !op_.new_nodes_in &&
      registered(pb::SERVER) == server_num_ && registered(pb::WORKER) == worker_num_) {
    op_.new_nodes_in = true;
    PublishMetadata();
  }
}

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

void ClusterManager::Pause(Duration stalled) {
  if (stalled <= Duration::zero()) return;
  const TimePoint now = clock_->Now();
  for (NodeRecord* rec : MutableNodes()) {
    if (!rec->timed_out) rec->last_heartbeat = std::min(now, rec->last_heartbeat + stalled);
  }
  if (scaling_) op_.started = std::min(now, op_.started + stalled);
}

void ClusterManager::Tick() {
  if (state_ == pb::CLUSTER_EXIT) return;
  const TimePoint now = clock_->Now();
  std::string first_timeout;
  if (now > next_timeout_scan_) {
    // One pass over the records, in no order; the (rare) expired ones are then handled in
    // role, rank order so logs and events read the same every run.
    TimePoint earliest = TimePoint::max();
    std::vector<NodeRecord*> expired;
    for (auto& [id, rec] : nodes_) {
      if (rec.timed_out) continue;
      const TimePoint deadline = rec.last_heartbeat + config_.heartbeat_timeout;
      if (now > deadline) {
        expired.push_back(&rec);
      } else {
        earliest = std::min(earliest, deadline);
      }
    }
    next_timeout_scan_ = earliest;
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
  if (scaling_) {
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
                Cat("finish barrier timed out waiting for ", RoleName(rec->role), " ", node_id), /*reported=*/false);
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
    outcome_.failure += Cat(outcome_.failure.empty() ? "" : "; ", RoleName(rec->role), " ", rec->node_id, " ", what);
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

std::vector<Event> ClusterManager::TakeEvents() {
  std::vector<Event> out;
  out.swap(events_);
  return out;
}

int ClusterManager::registered(pb::NodeRole role) const {
  return role >= 0 && role < 4 ? role_count_[role] : 0;
}

NodeRecord& ClusterManager::AddNode(const std::string& node_id, pb::NodeRole role) {
  auto [it, added] = nodes_.try_emplace(node_id);
  if (!added && it->second.role >= 0 && it->second.role < 4) --role_count_[it->second.role];
  if (!added && it->second.timed_out) --timed_out_count_;
  if (!added && it->second.in_error) --in_error_count_;
  if (!added) InvalidateRanks();
  it->second = NodeRecord();
  it->second.node_id = node_id;
  it->second.role = role;
  if (role >= 0 && role < 4) ++role_count_[role];
  next_timeout_scan_ = TimePoint::min();
  return it->second;
}

void ClusterManager::RemoveNode(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  if (it->second.role >= 0 && it->second.role < 4) --role_count_[it->second.role];
  if (it->second.timed_out) --timed_out_count_;
  if (it->second.in_error) --in_error_count_;
  nodes_.erase(it);
  InvalidateRanks();
  ++generation_;
}

void ClusterManager::SetTimedOut(NodeRecord* rec, bool timed_out) {
  if (rec->timed_out == timed_out) return;
  rec->timed_out = timed_out;
  timed_out_count_ += timed_out ? 1 : -1;
}

void ClusterManager::SetInError(NodeRecord* rec, bool in_error) {
  if (rec->in_error == in_error) return;
  rec->in_error = in_error;
  in_error_count_ += in_error ? 1 : -1;
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

int ClusterManager::Total(pb::NodeRole role) const {
  return role == pb::SERVER ? server_num_ : worker_num_;
}

const NodeRecord* ClusterManager::Find(const std::string& node_id) const {
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? nullptr : &it->second;
}

NodeRecord* ClusterManager::Mutable(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? nullptr : &it->second;
}

std::vector<const NodeRecord*> ClusterManager::Nodes() const {
  std::vector<const NodeRecord*> out;
  for (const auto& [id, rec] : nodes_) out.push_back(&rec);
  std::sort(out.begin(), out.end(), [](const NodeRecord* a, const NodeRecord* b) {
    return std::tie(a->role, a->rank, a->node_id) < std::tie(b->role, b->rank, b->node_id);
  });
  return out;
}

std::vector<NodeRecord*> ClusterManager::MutableNodes() {
  std::vector<NodeRecord*> out;
  for (const NodeRecord* rec : Nodes()) out.push_back(const_cast<NodeRecord*>(rec));
  return out;
}

pb::SendMetadataMessage ClusterManager::BuildMetadata() const {
  pb::SendMetadataMessage msg;
  msg.set_worker_num(worker_num_);
  msg.set_server_num(server_num_);
  msg.set_cluster_state(state_);
  msg.set_epoch(epoch_);
  msg.set_replicas(config_.replicas);
  if (scaling_ && op_.kind == ScaleKind::kOut) msg.set_scale_out_old_server_num(op_.old_server_num);
  const TimePoint now = clock_->Now();
  for (const NodeRecord* rec : Nodes()) {
    pb::ServersMeta* meta =
        rec->role == pb::SERVER ? msg.add_servers_meta() : msg.add_workers_meta();
    meta->set_rank_id(rec->rank);
    meta->set_ip(rec->ip);
    meta->set_port(rec->port);
    meta->set_is_alive(!rec->timed_out && !rec->resyncing);
    meta->set_resyncing(rec->resyncing && !rec->timed_out);
    meta->set_role(rec->role);
    meta->set_node_id(rec->node_id);
    for (const pb::Device& d : rec->devices) *meta->add_devices() = d;
    meta->set_state(rec->state);
    meta->set_incarnation(rec->incarnation);
    meta->set_last_heartbeat_age_ms(ToMillis(now - rec->last_heartbeat));
  }
  return msg;
}

// Global device ids are dense and ordered by role (servers first, then workers), then rank,
// then local_id, so the numbering follows from the rank table alone.
void ClusterManager::AssignTopology() {
  int next = 0;
  for (NodeRecord* rec : MutableNodes()) {
    for (pb::Device& d : rec->devices) d.set_global_id(next++);
    rec->in_metadata = true;
    RefreshNodeState(rec);
  }
}

// During a scale operation (once scale-out's new nodes are in) every node must acknowledge
// the newest metadata, so a republish restarts the *Done round at the new epoch.
void ClusterManager::PublishMetadata() {
  AssignTopology();
  ++epoch_;
  if (scaling_ && (op_.kind == ScaleKind::kIn || op_.new_nodes_in)) {
    op_.expected_epoch = epoch_;
    op_.done.clear();
  }
  EmitRaw(Event::Kind::kMetadataChanged);
}

// A node's pb state is derived from its flags, most urgent first.
void ClusterManager::RefreshNodeState(NodeRecord* rec) const {
  if (rec->finished && finish_passed_) {
    rec->state = pb::NODE_FINISH;
  } else if (rec->timed_out) {
    rec->state = pb::NODE_TIMED_OUT;
  } else if (rec->in_error) {
    rec->state = pb::NODE_IN_ERROR;
  } else if (rec->leaving) {
    rec->state = pb::NODE_LEAVING;
  } else {
    rec->state = rec->in_metadata ? pb::NODE_READY : pb::NODE_STARTING;
  }
}

// READY <-> NODE_TIMEOUT follows whether any node is timed out. Other states (starting,
// scaling, disabled, exiting) are left alone; they re-check when they return to READY.
void ClusterManager::RefreshTimeoutState() {
  const bool any = timed_out_count_ > 0;
  if (state_ == pb::CLUSTER_READY && any) SetClusterState(pb::NODE_TIMEOUT);
  if (state_ == pb::NODE_TIMEOUT && !any) SetClusterState(pb::CLUSTER_READY);
}

void ClusterManager::SetClusterState(pb::ClusterState state) {
  state_ = state;
  EmitRaw(Event::Kind::kStateChanged);
}

Event& ClusterManager::EmitRaw(Event::Kind kind) {
  Event& e = events_.emplace_back();
  e.kind = kind;
  e.state = state_;
  e.epoch = epoch_;
  e.worker_num = worker_num_;
  e.server_num = server_num_;
  return e;
}

Event& ClusterManager::Emit(Event::Kind kind, const NodeRecord* rec) {
  Event& e = EmitRaw(kind);
  e.node_id = rec->node_id;
  e.role = rec->role;
  e.rank = rec->rank;
  return e;
}

}  // namespace pscore::core
