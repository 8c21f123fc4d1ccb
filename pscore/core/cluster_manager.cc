// ClusterManager, registration: admitting new nodes, re-admitting known ones (retries,
// recoveries, restarts), picking ranks. The other parts: cluster_manager_health.cc
// (heartbeats, timeouts, errors), cluster_manager_end.cc (finish barrier, outcome, admin
// states), cluster_manager_registry.cc (records, metadata, events), cluster_manager_scale.cc
// (scaling), cluster_manager_state.cc (snapshot and restore).
#include "pscore/core/cluster_manager.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <glog/logging.h>

#include "pscore/core/role_names.h"

namespace pscore::core {
namespace {

using internal::Cat;
using internal::Err;
using internal::Label;

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

namespace internal {
std::string Label(const NodeRecord& rec) {
  return Cat(RoleLabel(rec.role), " ", rec.node_id, " (rank ", rec.rank, ")");
}
}  // namespace internal

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
    return Err(Code::kInvalidArgument, "unknown role ", RoleLabel(req.role), " for node ",
               req.node_id, ": must be server or worker");
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
               RoleLabel(rec.role), ", now claims ", RoleLabel(req.role));
  }
  std::vector<pb::Device> devices = SortedDevices(req.devices);
  if (!SameDevices(devices, rec.devices)) {
    return Err(Code::kInvalidArgument, "node ", rec.node_id, " changed its device list (",
               devices.size(), " devices, was ", rec.devices.size(), ")");
  }
  // The same process asks for the rank it last heard of: a scale-in may have compacted it
  // since (the link was lost before the new metadata came). Its rank is the record's.
  const bool same_process = req.incarnation == rec.incarnation;
  if (!same_process && req.requested_rank >= 0 && req.requested_rank != rec.rank) {
    return Err(Code::kInvalidArgument, "node ", rec.node_id, " holds ", RoleLabel(rec.role),
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

// A new process under the node id of a member whose role is not recoverable: whatever the
// old one held is lost, which the others must hear of; it may join once reset.
Status ClusterManager::RefuseNewIncarnation(NodeRecord* rec, const RegisterRequest& req) {
  const std::string why = Cat(RoleLabel(rec->role), " ", rec->node_id, " restarted (incarnation ",
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
  if (restarted && scaling_ && op_.kind == ScaleKind::kIn) {
    // The old process's part of a scale-in (its hand-over, its DONE) went with it, and the
    // new one never heard the SCALE_IN: undone at once rather than at the scale timeout.
    // The rollback publishes the membership, the new address in it.
    Rollback(Cat(Label(*rec), " restarted during scale-in"));
  } else if ((moved || resync) && rec->in_metadata) {
    PublishMetadata();  // peers need the new address
  }
  RefreshTimeoutState();
  out.restarted = restarted;
  out.epoch = epoch_;
  return out;
}

Result<RegisterOutcome> ClusterManager::AdmitNew(const RegisterRequest& req) {
  if (scaling_ && op_.kind == ScaleKind::kIn) {
    return Err(Code::kFailedPrecondition, kScaleInRunningPrefix, "; new node ", req.node_id, " refused");
  }
  const int total = Total(req.role);
  const int have = registered(req.role);
  if (have >= total) {
    return Err(Code::kInvalidArgument, "node ", req.node_id, " is not in the cluster: ", RoleLabel(req.role), " ",
               kQuotaFullMark, have, "/", total, ")");
  }
  Result<int> rank = PickRank(req.role, req.requested_rank);
  if (!rank.ok()) return rank.status();
  NodeRecord fresh;
  fresh.node_id = req.node_id;
  fresh.role = req.role;
  fresh.rank = *rank;
  fresh.ip = req.ip;
  fresh.port = req.port;
  fresh.incarnation = req.incarnation;
  fresh.devices = SortedDevices(req.devices);
  fresh.host_name = req.host_name;
  fresh.last_heartbeat = clock_->Now();
  const NodeRecord& rec = AddNode(std::move(fresh));
  rank_taken_[req.role == pb::SERVER ? 0 : 1][*rank] = 1;  // PickRank just sized it
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
    return Err(Code::kInvalidArgument, "requested ", RoleLabel(role), " rank ", requested, " is negative");
  }
  if (requested >= total) {
    return Err(Code::kFailedPrecondition, "requested ", RoleLabel(role), " rank ", requested,
               " out of range [0, ", total, "): the job is configured for ", total, " ", RoleLabel(role), "s");
  }
  const std::vector<char>& taken = RanksTaken(role);
  if (requested >= 0) {
    if (!taken[requested]) return requested;
    for (const auto& [id, rec] : nodes_) {  // only to name the owner in the refusal
      if (rec.role == role && rec.rank == requested) {
        return Err(Code::kAlreadyExists, RoleLabel(role), " rank ", requested, " already taken by node ", id);
      }
    }
    return Err(Code::kAlreadyExists, RoleLabel(role), " rank ", requested, " already taken");
  }
  const void* free = total == 0 ? nullptr : std::memchr(taken.data(), 0, taken.size());
  if (free != nullptr) return static_cast<int>(static_cast<const char*>(free) - taken.data());
  return Status(Code::kResourceExhausted, "no free " + RoleLabel(role) + " rank");
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

}  // namespace pscore::core
