// SchedulerNode: the job's scheduler. Hosts the cluster state machine, the coordination
// services (KV store, barriers, errors, events) and the admin surface, over the native
// protocol on one EventLoop. Public methods are thread-safe (they post to the loop);
// everything else runs on the loop thread. Owned by main() or an embedding program.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "pscore/comm/alive.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/core/barrier_manager.h"
#include "pscore/core/cluster_manager.h"
#include "pscore/core/kv_store.h"
#include "pscore/core/repeat_filter.h"
#include "pscore/node/common/options.h"
#include "pscore/node/scheduler/metadata_cache.h"

namespace pscore::node {

class StateWriter;
struct AdminOpInfo;

class SchedulerNode {
 public:
  // loop: shared loop to run on (nullptr: the scheduler owns one).
  explicit SchedulerNode(SchedulerOptions options, comm::EventLoop* loop = nullptr);
  ~SchedulerNode();

  // Binds the scheduler port and starts serving. port() is valid afterwards.
  Status Start();
  // Stops serving and closes every connection; with a state_dir, returns once the last
  // state snapshot is written. Idempotent.
  void Stop();
  // Blocks until the job ends (finish passed or terminated) or timeout: kTimeout.
  Status WaitForExit(Duration timeout);
  bool exited() const;

  int port() const { return port_; }
  comm::EventLoop* loop() const { return loop_; }
  // Snapshot of the cluster state (any thread).
  pb::ClusterState cluster_state() const;
  uint64_t epoch() const;
  // How the job ended (any thread): kRunning until the cluster exits.
  core::JobOutcome outcome() const;
  // Called on the loop thread at every cluster event (tests, HTTP layer, rank table).
  void AddEventListener(std::function<void(const core::Event&)> fn);
  // Called on the loop thread after a node is admitted or re-admitted, which no cluster
  // event reports while STARTING (the rank table rebuilds on it).
  void AddRegisterListener(std::function<void()> fn);

  // Loop-thread accessors for the HTTP layer and tests.
  core::ClusterManager& cluster() { return cluster_; }
  const core::KvStore& kv() const { return kv_; }
  const core::BarrierManager& barriers() const { return barriers_; }
  // Loop thread: runs an admin request (same as ADMIN over the wire); cb runs on the loop thread.
  void Admin(const pb::AdminRequest& req, std::function<void(Status, pb::AdminResponse)> cb);
  // With TLS: whether the peer whose certificate names `cn` (at `peer`, for the message)
  // may run the admin operation named `op` (its wire name): the ones the table marks
  // any_certificate (status) anyone may, the rest only a CN of tls_admin_cns.
  // Without TLS always Ok (the cluster token, if any, is checked elsewhere). Any thread.
  Status CheckAdminCertificate(const std::string& op, const std::string& cn, const std::string& peer) const;
  const comm::TransportStats& transport_stats() { return messenger_->transport().stats(); }
  // Loop thread: serves a command the scheduler does not serve itself (extensions such
  // as the rank-table stream). Set before Start.
  void SetCommandHandler(pb::NodeCommand cmd, std::function<void(comm::ConnId, comm::Frame&&)> fn);
  comm::Messenger& messenger() { return *messenger_; }
  const SchedulerOptions& options() const { return options_; }
  uint64_t heartbeats() const { return heartbeats_; }
  // State file writes (--state_dir) done and refused by the disk (any thread; 0 without).
  uint64_t state_writes() const;
  uint64_t state_write_failures() const;
  // Loop thread: how many times the metadata bytes were built (once per membership change
  // and tick at most, never per member), and the output queued on the members' links now.
  uint64_t metadata_builds() const { return metadata_.builds(); }
  uint64_t QueuedOutputBytes() const;
  // Blocking KV gets waiting for their key (any thread; tests).
  size_t kv_gets_waiting();
  // FINISH requests waiting for the others (any thread; tests).
  size_t finish_waiting();

 private:
  friend class NodeProbe;  // tests/node/node_probe.h: hands frames to OnRequest (tests, fuzzers)

  // Dispatch and links (scheduler_node.cc).
  void OnRequest(comm::ConnId conn, comm::Frame&& frame);
  void HandleFetchMetadata(comm::ConnId conn, const comm::Frame& frame);
  void HandleUnserved(comm::ConnId conn, comm::Frame&& frame);
  void OnClose(comm::ConnId conn, const Status& why);
  void Tick();
  void MarkExited();
  std::string NodeOf(comm::ConnId conn) const;
  void Reply(comm::ConnId conn, const pb::MessageMeta& req, const Status& st, Payload payload = nullptr);

  // Registration and member reports (scheduler_admission.cc).
  void HandleRegister(comm::ConnId conn, const comm::Frame& frame);
  // With TLS: Ok when the peer's certificate names `node_id`; else why, logged.
  Status CheckRegisterIdentity(comm::ConnId conn, const std::string& node_id) const;
  // Makes `conn` the link of `node_id`. True when the node registered on this link before
  // and stayed linked on it since, so every notice broadcast meanwhile reached it.
  bool LinkRegistered(comm::ConnId conn, const std::string& node_id);
  void AnswerRegister(comm::ConnId conn, const pb::MessageMeta& meta, const core::RegisterRequest& req,
                      const core::RegisterOutcome& out);
  void HandleHeartbeat(comm::ConnId conn, const comm::Frame& frame);
  // To a node registering on a new link: the stored errors and heartbeat losses.
  void ReplayNotices(comm::ConnId conn, const std::string& node_id);
  void HandleReportError(comm::ConnId conn, const comm::Frame& frame);
  void HandleResyncDone(comm::ConnId conn, const comm::Frame& frame);

  // Coordination services: FINISH, KV, barriers, member events (scheduler_services.cc).
  void HandleFinish(comm::ConnId conn, const comm::Frame& frame);
  void AnswerFinishWaiters(const Status& st);
  void ExpireFinishWaiters();
  void HandleKv(comm::ConnId conn, const comm::Frame& frame);
  // A blocking GET: waits on the key, at most kMaxGetsPerConn per connection.
  void StartKvGet(comm::ConnId conn, const pb::MessageMeta& meta, const pb::KvRequest& req);
  void ForgetGet(comm::ConnId conn, uint64_t id);
  void CancelGets(comm::ConnId conn);
  void HandleBarrier(comm::ConnId conn, const comm::Frame& frame);
  void HandleEvent(comm::ConnId conn, const comm::Frame& frame);

  // Admin operations (scheduler_admin.cc).
  void HandleAdmin(comm::ConnId conn, const comm::Frame& frame);
  // Runs an operation that answers with the plain status response.
  Status RunAdminOp(const AdminOpInfo& info, const pb::AdminRequest& req);
  pb::AdminResponse StatusResponse(bool with_nodes) const;
  pb::AdminResponse BarriersResponse() const;

  // Scale operations: the members' reports and the scheduler's broadcasts (scheduler_scaling.cc).
  void HandleScaleDone(comm::ConnId conn, const comm::Frame& frame);
  void BroadcastScaleOut(const core::Event& e);
  void BroadcastScaleIn(const core::Event& e);
  void NoteScaleEnd(const core::Event& e);

  // Cluster events and metadata fan-out (scheduler_events.cc).
  void DrainEvents();
  void HandleClusterEvent(const core::Event& e);
  void OnStateChanged(const core::Event& e);
  // The job ended while members had no link (scheduler_events.cc): told when they come
  // back, within a bound; the scheduler exits once none is left (or at the bound).
  void AwaitUntold(std::set<std::string> untold);
  // Loop thread: a member (this process of it) that missed the end is told it now, on
  // `conn`. True if it was.
  bool TellEndIfUntold(comm::ConnId conn, const std::string& node_id, uint64_t incarnation);
  // A node timed out, restarted, recovered or is in error: tell the members and the barriers.
  void OnNodeNotice(const core::Event& e);
  void OnFinishPassed(const core::Event& e);
  void OnNodeLeft(const core::Event& e);
  // The new membership to every linked member (its role's view) and to the barriers.
  void PushMetadata();
  // The state and epoch for readers on other threads, locked only when they changed.
  void PublishSnapshot();
  void Broadcast(const pb::MessageMeta& meta, const BufferPtr& payload);
  // To the node's link, unless MetadataFits refuses it.
  void SendMetadataTo(const std::string& node_id);
  // A link holds at most one copy of the membership, whatever its member does (one that
  // reads slowly, re-registers, or fetches again after giving up on a fetch): metadata (a
  // push or a FETCH_METADATA answer) goes onto a link only while at most kMetadataGateBytes
  // wait unwritten there. A push left out is not lost: the member sees the newer epoch in
  // its next heartbeat answer and fetches it; a fetch refused is asked again. So the
  // output queued for a member is one membership plus its small answers and events
  // (docs/reliability.md).
  static constexpr uint64_t kMetadataGateBytes = 16 << 10;
  bool MetadataFits(comm::ConnId conn) const;
  uint64_t QueuedOn(comm::ConnId conn) const;
  // The CLUSTER_EVENT of e (core::ToClusterEvent: a kind core::ClusterEventKind maps), to
  // every linked node, or (only_to_it) to the node the event is about.
  void SendClusterEvent(const core::Event& e, bool only_to_it = false);
  // Per-node notices (timed out, restarted, recovered, error) of one drain are coalesced
  // into one CLUSTER_EVENT frame (the first, the rest in `more`), broadcast once.
  static bool IsNodeNotice(core::Event::Kind kind);
  void FlushNotices();

  // --state_dir persistence (scheduler_state.cc).
  Status OpenState();
  // Loop thread: applies a loaded state to the cluster, KV store and barriers.
  Status RestoreState(const pb::PersistedState& state, const std::string& path);
  void MarkStateDirty(bool urgent);
  void PersistState();
  // Loop thread, every tick: after a write the disk refused, the state is written again.
  void RetryRefusedState();
  // Runs answer once the state as it is now is on disk (at once without --state_dir): a
  // barrier round's end and a KV change are answered only when a restart would keep them.
  void AnswerWhenDurable(std::function<void()> answer);
  // Loop thread: runs the answers whose snapshot is written (all: `all`).
  void RunDurableAnswers(bool all);
  std::vector<std::pair<uint64_t, std::function<void()>>> durable_answers_;  // loop thread
  std::unique_ptr<StateWriter> state_writer_;
  // The writer thread's posted wake-ups watch it; Stop expires it on the loop thread, so one
  // still queued on a shared loop after this node is gone does nothing.
  comm::AliveToken writer_token_;
  bool state_dirty_ = false;   // changed since the last snapshot
  bool state_urgent_ = false;  // membership/state changed: write now, not when the writer is idle
  uint64_t state_sequence_ = 0;
  uint64_t state_failures_seen_ = 0;  // loop thread: the writer's failures() at the last retry

  SchedulerOptions options_;
  std::unique_ptr<comm::EventLoop> owned_loop_;
  comm::EventLoop* loop_;
  SteadyClock clock_;
  core::ClusterManager cluster_;
  core::KvStore kv_;
  core::BarrierManager barriers_;
  std::unique_ptr<comm::Messenger> messenger_;
  int port_ = 0;
  comm::TimerId tick_timer_ = 0;
  // After the job ended: the notice, and the live members it did not reach (no link).
  pb::ClusterEventMessage end_notice_;
  std::set<std::string> untold_;
  comm::TimerId untold_timer_ = 0;
  // Members whose last link closed after half a heartbeat timeout without a word on it (a
  // link that died, e.g. closed by the member while the network was cut): unlike a member
  // that closed a live link, such a member may be redialing. Cleared when it links again.
  std::unordered_set<std::string> quiet_close_;
  Duration tick_period_{};
  TimePoint last_tick_{};
  uint64_t stop_hook_ = 0;

  std::unordered_map<std::string, comm::ConnId> conn_of_;  // node_id -> its scheduler link
  // Refused REGISTERs are logged once per 30 s per node and reason: a new node waiting for a
  // scale-out asks about once a second (NodeOptions::join_timeout).
  core::RepeatFilter refusals_{std::chrono::seconds(30), 4096};
  std::vector<std::pair<std::string, comm::ConnId>> Links() const;  // conn_of_, copied
  struct LinkNode {
    std::string node_id;
    core::ClusterManager::NodeHint hint;  // spares the registry lookup per heartbeat
    bool registered = false;  // the node registered on this link (not only beat on it)
    TimePoint heard;          // its last registration or heartbeat on this link
  };
  std::unordered_map<comm::ConnId, LinkNode> node_of_;
  struct FinishWaiter {
    pb::MessageMeta meta;
    TimePoint deadline;
    std::string node_id;
  };
  // FINISH requests waiting for the others: at most one per connection (a second is
  // refused), withdrawn when their connection closes (nobody could be answered).
  std::map<comm::ConnId, FinishWaiter> finish_waiters_;
  // Blocking KV gets waiting for a key, by the connection that asked: at most
  // kMaxGetsPerConn each, cancelled when their connection closes (nobody could be answered).
  static constexpr size_t kMaxGetsPerConn = 4096;
  std::unordered_map<comm::ConnId, std::unordered_set<uint64_t>> kv_gets_;
  std::vector<std::function<void(const core::Event&)>> listeners_;
  std::vector<std::function<void()>> register_listeners_;
  MetadataCache metadata_{options_.worker_metadata_view_over, options_.server_metadata_view_over};
  pb::ClusterEventMessage notices_;  // per-node notices not yet broadcast (FlushNotices)
  bool has_notices_ = false;
  std::unordered_map<int, std::function<void(comm::ConnId, comm::Frame&&)>> extra_handlers_;
  uint64_t heartbeats_ = 0;
  std::unordered_map<comm::ConnId, int> unserved_;  // commands not served, per connection (loop thread)
  pb::HeartbeatMessage heartbeat_in_;     // HandleHeartbeat scratch (loop thread)
  pb::HeartbeatRespMessage heartbeat_out_;
  // What the snapshot below last got (loop thread), so DrainEvents locks only on a change.
  pb::ClusterState published_state_ = pb::ClUSTER_STARTING;
  uint64_t published_epoch_ = 0;
  std::string last_scale_result_;  // how the last scale operation ended (admin status)

  mutable std::mutex mu_;  // guards the snapshot below
  std::condition_variable exit_cv_;
  bool exited_ = false;
  pb::ClusterState state_snapshot_ = pb::ClUSTER_STARTING;
  uint64_t epoch_snapshot_ = 0;
  core::JobOutcome outcome_snapshot_;
  bool stopped_ = false;
};

}  // namespace pscore::node
