// ClusterManager: the scheduler's cluster state machine (membership, ranks, heartbeat
// timeouts, finish barrier, elastic scale-out/in with rollback, admin states).
// Owned by the scheduler node; not thread-safe: call it only from the scheduler's loop
// thread. It performs no I/O: callers feed it requests and a clock, then drain
// TakeEvents() in order and turn each Event into messages.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <unordered_map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "pscore/core/clock.h"
#include "pscore/core/cluster_event.h"
#include "pscore/core/node_record.h"
#include "pscore/core/status.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::core {

// The enum name of a cluster state, for messages.
std::string ClusterStateName(pb::ClusterState state);

namespace internal {
// Message building shared by the parts of ClusterManager.
template <typename... Args>
std::string Cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
template <typename... Args>
Status Err(Code code, const Args&... args) {
  return Status(code, Cat(args...));
}
// "server s1 (rank 0)", for logs and messages about a node.
std::string Label(const NodeRecord& rec);
}  // namespace internal

// Most workers, or servers, one job may have: the scheduler refuses larger totals (flags,
// SchedulerOptions, scale-out) and nodes ignore metadata claiming more, since a worker
// sizes its per-server groups by the server total.
inline constexpr int kMaxRoleTotal = 1 << 16;

struct ClusterConfig {
  int worker_num = 1;
  int server_num = 1;
  Duration heartbeat_timeout = std::chrono::seconds(30);
  Duration scale_timeout = std::chrono::seconds(30);
  // Every live member (2 or more) silent at once, some past heartbeat_timeout and none
  // heard in its last half, is taken for this scheduler's own network (its link cut, its
  // host partitioned), not for that many failures: their timeouts wait up to this long,
  // counted from the last time any member was heard, for one of them to be heard again;
  // then each gets a fresh heartbeat_timeout. 0: they time out at once.
  Duration isolation_timeout = std::chrono::seconds(15);
  // Copies of each server's key range (docs/reliability.md). With 2 or more, a server's
  // heartbeat timeout publishes new metadata (a new epoch) marking it down, so every
  // member routes its ranges to their next live replica.
  int replicas = 1;
  // Roles whose members may fail and come back (a restart with a new incarnation) without
  // the others being told of an error: their errors are not propagated and a restart
  // re-admits them at once. Other roles follow the coordination service's rule: a new
  // incarnation records the member in error, and a member in error must be reset before it
  // registers again (docs/coordination.md).
  std::vector<pb::NodeRole> recoverable_roles;
};

struct RegisterRequest {
  std::string node_id;
  pb::NodeRole role = pb::WORKER;
  std::string ip;
  int port = 0;
  uint64_t incarnation = 0;  // fresh per process start
  int requested_rank = -1;   // -1: any free rank
  std::vector<pb::Device> devices;
  std::string host_name;
};

struct RegisterOutcome {
  int rank = -1;
  uint64_t epoch = 0;
  bool restarted = false;  // a known node_id came back with a new incarnation (recoverable or reset)
  bool retry = false;      // same node_id and incarnation: nothing changed
};

// How the job ended. A job fails when the finish barrier passes while a node is timed out
// without having called Finish (it died and was neither restarted nor replaced in time) or
// is in error (reported one, never reset); nodes that left in a scale-in are gone from the
// registry and do not count. Once a node called Finish, the barrier also ends the job when
// no node is live any more (every one timed out).
struct JobOutcome {
  enum class Result { kRunning, kFinished, kFailed, kStopped };
  Result result = Result::kRunning;
  std::string failure;                    // kFailed: "worker w1 lost (no heartbeat for 3000 ms)"; ...
  std::vector<std::string> failed_nodes;  // kFailed: node ids, by role then rank
};
// "running", "finished", "failed", "stopped".
const char* JobResultName(JobOutcome::Result result);

// The refusal of a request made under another session begins with this (kFailedPrecondition):
// the member registers again (node::Node does it by itself).
inline constexpr char kStaleSessionPrefix[] = "stale session";
bool IsStaleSession(const Status& st);
// A new node refused because its role has no free place (kInvalidArgument, "node X is not in
// the cluster: server quota full (2/2)"): a scale-out asked later may make room, so
// node::Node asks again for a while (NodeOptions::join_timeout).
inline constexpr char kQuotaFullMark[] = "quota full (";
bool IsQuotaFull(const Status& st);
// A new node refused while a scale-in runs (kFailedPrecondition, "scale-in running; new node
// X refused"): node::Node asks again as for "quota full".
inline constexpr char kScaleInRunningPrefix[] = "scale-in running";
bool IsScaleInRunning(const Status& st);

class ClusterManager {
 public:
  ClusterManager(ClusterConfig config, const Clock* clock);

  // Admits a node or re-admits a known node_id (it keeps its rank). See the .cc for rules.
  Result<RegisterOutcome> Register(const RegisterRequest& req);
  // What a caller may keep per link so the next Heartbeat skips the registry lookup: the
  // record found for `node_id` while generation() was `generation`. Checked before use (the
  // same generation and node id); a stale hint costs the lookup.
  struct NodeHint {
    NodeRecord* rec = nullptr;
    uint64_t generation = 0;
    std::string node_id;
  };
  // kNotFound for an unknown, timed-out or reset node: it must register again. kAborted for
  // an incarnation other than the registered one (a stale or foreign process), and for a
  // member in error whose role is not recoverable (its liveness still counts: the process
  // is there, only its state is not trusted).
  Status Heartbeat(const std::string& node_id, uint64_t incarnation, NodeHint* hint = nullptr) {
    return Beat(node_id, &incarnation, hint);
  }
  // The same without the incarnation check, for a caller that vouches for the sender.
  Status Heartbeat(const std::string& node_id, NodeHint* hint = nullptr) { return Beat(node_id, nullptr, hint); }
  // A member's heartbeat says it knows membership epoch `known`. Newer than the epoch of a
  // restored scheduler, it was published by a predecessor whose state file had not caught
  // up when it died: the epoch moves past it and the membership is published again, so
  // that no member takes the restored membership for a stale one. Believed only after a
  // Restore, and only up to kMaxEpochLead past the restored epoch (else logged, ignored).
  void SeenEpoch(uint64_t known);
  static constexpr uint64_t kMaxEpochLead = 1u << 16;
  bool Recoverable(pb::NodeRole role) const;
  // Applies timeouts: silent nodes, the scale-operation deadline, then the finish barrier.
  void Tick();
  // True while every live member's silence is taken for this scheduler's isolation
  // (ClusterConfig::isolation_timeout).
  bool isolated() const { return isolated_since_.has_value(); }
  // The scheduler itself did not run for `stalled` (stopped, swapped out): that time does
  // not count against nodes' heartbeats or the scale deadline, since their messages
  // were waiting in our sockets. Call before Tick.
  void Pause(Duration stalled);
  Status ReportError(const std::string& node_id, int code, const std::string& message);
  // A resyncing server (of that incarnation) holds a copy of each of its ranges again: a new
  // epoch marks it alive, and it is primary again of the ranges it is first live in.
  Status ResyncDone(const std::string& node_id, uint64_t incarnation);
  Status ResetNode(const std::string& node_id);  // clears the error state
  Status Finish(const std::string& node_id);     // joins the finish barrier
  std::vector<std::string> FinishMissing() const;  // live nodes that have not called Finish
  // A caller's shutdown barrier timed out: `late` (FinishMissing then) are recorded in error
  // (kTimeout), so they cannot register again without a reset.
  void FinishTimedOut(const std::vector<std::string>& late);

  Status ScaleOut(int worker_num, int server_num);  // new totals (each >= current)
  Status ScaleInByIds(const std::vector<std::string>& node_ids);
  Status ScaleInByCounts(int worker_num, int server_num);  // new totals; removes the highest ranks
  Status ScaleOutDone(const std::string& node_id, uint64_t epoch);
  Status ScaleInDone(const std::string& node_id, uint64_t epoch);
  // Admin: CLUSTER_NEW_INSTANCE, CLUSTER_ENABLE_FLS, CLUSTER_DISABLE_FLS, CLUSTER_EXIT.
  Status SetState(pb::ClusterState state);

  // The scheduler's session (docs/coordination.md, Sessions): a number the scheduler draws
  // when it starts, hands out at REGISTER, and members carry on their requests. Restore
  // keeps the persisted one, since the state it names comes back with it.
  uint64_t session_id() const { return session_id_; }
  void set_session_id(uint64_t id) { session_id_ = id; }
  // OK for 0 (a caller that never registered: admin clients, subscribers) and for the
  // current session; kFailedPrecondition naming both otherwise (the state its registration
  // was made in is gone: it registers again).
  Status CheckSession(uint64_t carried) const;

  std::vector<Event> TakeEvents();
  pb::ClusterState state() const { return state_; }
  // kRunning until the cluster exits (finish barrier passed or admin stop).
  const JobOutcome& outcome() const { return outcome_; }
  uint64_t epoch() const { return epoch_; }
  int worker_num() const { return worker_num_; }  // current target totals
  int server_num() const { return server_num_; }
  int registered(pb::NodeRole role) const;
  // Records timed out or in error, in O(1): a registration skips its scan for notices to
  // replay when there are none.
  int flagged() const { return timed_out_count_ + in_error_count_; }
  const NodeRecord* Find(const std::string& node_id) const;
  // True for the process (node id and incarnation) that a completed scale-in removed: it
  // missed being told to end (its link was down) and registers again; it should end, not
  // join. Remembered (and persisted) for the last kLeftRemembered such nodes.
  bool LeftInScaleIn(const std::string& node_id, uint64_t incarnation) const;
  static constexpr size_t kLeftRemembered = 4096;
  std::vector<const NodeRecord*> Nodes() const;  // sorted by role (server, worker), then rank
  // Every node in no particular order (no sort, no allocation).
  template <typename Fn>
  void ForEachNode(Fn&& fn) const {
    for (const auto& [id, rec] : nodes_) fn(rec);
  }
  // servers_meta + workers_meta (sorted by rank), totals, state, epoch; devices with global
  // ids. rank_id is left 0: the sender fills it per recipient.
  pb::SendMetadataMessage BuildMetadata() const;

  // Persistence (cluster_manager_state.cc): Snapshot holds the registry, state, epoch,
  // totals and a running scale operation (not the KV store). Restore loads one into a
  // fresh manager (nothing registered yet); the .cc says what a restart changes.
  pb::PersistedState Snapshot() const;
  Status Restore(const pb::PersistedState& state);

 private:
  enum class ScaleKind { kOut, kIn };
  struct ScaleOp {
    ScaleKind kind = ScaleKind::kOut;
    TimePoint started;
    int old_worker_num = 0;
    int old_server_num = 0;
    uint64_t expected_epoch = 0;        // the epoch a *Done must carry
    bool new_nodes_in = false;          // scale-out: every new node registered
    std::set<std::string> added;        // scale-out: nodes registered by this operation
    std::set<std::string> done;         // nodes that answered *Done
  };

  Status CheckReregister(const NodeRecord& rec, const RegisterRequest& req) const;
  Status Beat(const std::string& node_id, const uint64_t* incarnation, NodeHint* hint);
  Status RefuseNewIncarnation(NodeRecord* rec, const RegisterRequest& req);
  void RecordError(NodeRecord* rec, int code, const std::string& message, bool reported);
  Result<RegisterOutcome> Reregister(NodeRecord* rec, const RegisterRequest& req);
  Result<RegisterOutcome> AdmitNew(const RegisterRequest& req);
  Result<int> PickRank(pb::NodeRole role, int requested) const;
  int Total(pb::NodeRole role) const;
  NodeRecord* Mutable(const std::string& node_id);
  std::vector<NodeRecord*> MutableNodes();
  void AfterAdmit();
  void AssignTopology();
  void PublishMetadata();
  void RefreshNodeState(NodeRecord* rec) const;
  void RefreshTimeoutState();
  bool HoldForIsolation(const std::vector<NodeRecord*>& expired, size_t live, TimePoint last_heard, TimePoint now);
  void EndIsolationIfHeard(TimePoint now);
  void CheckFinish();
  void SetOutcomeAtFinish();
  void CompleteScaleIn();
  void RememberLeft(const std::string& node_id, uint64_t incarnation);
  void EndScale();
  bool AllDone() const;
  void Rollback(const std::string& reason);
  std::string ScaleProgress() const;
  Status CheckCanStartScale() const;
  Status StartScaleIn(const std::vector<std::string>& leaving);
  Status CheckDone(ScaleKind kind, const std::string& node_id, uint64_t epoch) const;
  void SetClusterState(pb::ClusterState state);
  Event& Emit(Event::Kind kind, const NodeRecord* rec);
  Event& EmitRaw(Event::Kind kind);

  ClusterConfig config_;
  const Clock* clock_;
  pb::ClusterState state_ = pb::ClUSTER_STARTING;
  uint64_t epoch_ = 0;
  std::optional<uint64_t> restored_epoch_;  // the state file's, after a Restore
  std::optional<TimePoint> isolated_since_;  // while isolated(): the last time a member was heard
  int worker_num_;
  int server_num_;
  bool finish_passed_ = false;
  uint64_t session_id_ = 0;
  JobOutcome outcome_;
  bool scaling_ = false;
  ScaleOp op_;
  std::unordered_map<std::string, NodeRecord> nodes_;  // by node_id; pointers stay valid until removal
  std::map<std::string, uint64_t> left_;  // node id -> incarnation, removed by a scale-in
  std::deque<std::string> left_order_;    // left_'s ids, oldest first
  // No live node can time out before this (the earliest last_heartbeat + timeout at the
  // last scan; heartbeats only move deadlines later), so Tick skips the scan until then.
  // Reset whenever a node becomes live (AddNode, Reregister).
  TimePoint next_timeout_scan_ = TimePoint::min();
  // Records in nodes_ by role (a record's role never changes), so registered() is O(1):
  // it runs several times per registration. Kept by AddNode / RemoveNode.
  int role_count_[4] = {0, 0, 0, 0};
  uint64_t generation_ = 1;  // bumped when a record is erased (NodeHint pointers die)
  int timed_out_count_ = 0;  // records with timed_out set; kept by SetTimedOut / AddNode / RemoveNode
  // Adds rec to the registry (replacing a record of its node id), counted by role, timed
  // out and in error.
  NodeRecord& AddNode(NodeRecord rec);
  void SetTimedOut(NodeRecord* rec, bool timed_out);
  // kFailedPrecondition when a scale would change the server count with replicas >= 2.
  Status CheckReplicatedServerScale(int server_num, const std::string& totals) const;
  // Whether a lost server's key ranges all still have a live replica (replicas >= 2).
  bool ServerCovered(const NodeRecord& rec) const;
  int in_error_count_ = 0;   // records with in_error set; kept by SetInError / AddNode / RemoveNode
  void SetInError(NodeRecord* rec, bool in_error);
  // Which ranks of each role (0: servers, 1: workers) are taken, by rank; see RanksTaken.
  mutable std::vector<char> rank_taken_[2];
  mutable bool rank_taken_valid_[2] = {false, false};
  const std::vector<char>& RanksTaken(pb::NodeRole role) const;
  void InvalidateRanks() { rank_taken_valid_[0] = rank_taken_valid_[1] = false; }
  void RemoveNode(const std::string& node_id);
  std::vector<Event> events_;
};

}  // namespace pscore::core
