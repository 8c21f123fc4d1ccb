// Node: what every worker and server does. It registers with the scheduler, beats,
// follows metadata and cluster events, reaches other servers by rank, and offers the
// coordination client (KV, barriers, errors, events) and the finish barrier.
// Public methods are thread-safe: they post to the loop; blocking ones must not be called
// on the loop thread. Callbacks run on the loop thread. Owned by the embedding program.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "pscore/comm/backoff.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/comm/tcp_client.h"
#include "pscore/core/scale_participant.h"
#include "pscore/core/scheduler_watch.h"
#include "pscore/node/common/direct_control.h"
#include "pscore/node/common/options.h"

namespace pscore::node {

class MetricsText;
class PeerLinks;

class Node {
 public:
  struct Callbacks {
    std::function<void(pb::ClusterState)> on_state;                      // every state change
    std::function<void(const pb::ClusterEventMessage&)> on_cluster_event;  // timeouts, errors, restarts, rollbacks
    std::function<void(const std::string& from, uint32_t event, const std::string& payload)> on_user_event;
    std::function<void(const Status&)> on_fatal;  // lost the scheduler, or terminated with an error
    std::function<void(const pb::SendMetadataMessage&)> on_metadata;
    std::function<void(const pb::ScaleOutMessage&)> on_scale_out;
    std::function<void(const pb::ScaleInMessage&)> on_scale_in;
    std::function<void()> on_new_instance;
  };

  Node(NodeOptions options, comm::EventLoop* loop);
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  void SetCallbacks(Callbacks cb);  // before Start
  // Connects to the scheduler and registers (bounded by connect_timeout).
  Status Start();
  // Returns when the cluster is READY, or kTimeout naming how many nodes are missing.
  Status WaitForReady(Duration timeout);
  // The finish barrier over all live nodes; kTimeout names the stragglers.
  Status Finish(Duration timeout);
  // Blocks until the scheduler ends the job (TERMINATE / EXIT) or a fatal error.
  Status WaitForTermination(Duration timeout);
  // Leaves: closes every connection. Idempotent.
  void Stop();

  const std::string& node_id() const { return options_.node_id; }
  const NodeOptions& options() const { return options_; }
  pb::NodeRole role() const { return options_.role; }
  int rank() const;
  // The scheduler's session this node last registered under (0: none yet).
  uint64_t session() const;
  pb::ClusterState cluster_state() const;
  uint64_t epoch() const;
  // A copy of the whole metadata (every member's entry): server_num() where the count is all
  // a caller needs, as on each Push and Pull.
  pb::SendMetadataMessage metadata() const;
  int server_num() const;
  // Node ids of one role in the current metadata, by rank (e.g. barrier participants). A
  // server's view lists the workers by id and rank only (worker_ids), a worker's none.
  std::vector<std::string> NodeIds(pb::NodeRole role) const;
  // Coordination calls answered over the direct way so far (DirectControl; any thread).
  uint64_t direct_control_calls() const { return direct_calls_.calls(); }
  int listen_port() const { return listen_port_; }
  comm::EventLoop* loop() const { return loop_; }
  // Loop thread: this node's transport, read for its counters (MemberHttp's /metrics).
  const comm::Transport& transport() const { return messenger_->transport(); }
  // Payload bytes this node copied in user space so far (any thread): by its role (a
  // push's values into its message, answers into a pull's result, a small pull's answer
  // out of the store) and by its transport (comm::Transport::payload_bytes_copied).
  // dataplane_bench divides it by the bytes moved: the copies per byte it prints.
  // A role's own figures for GET /metrics (member_http.cc), after the common ones.
  virtual void AppendRoleMetrics(MetricsText* m) const {}
  uint64_t payload_bytes_copied() const {
    return copied_->load(std::memory_order_relaxed) + messenger_->transport().payload_bytes_copied();
  }

  // Coordination client (blocking; any thread but the loop's).
  Status KvSet(const std::string& key, const std::string& value, bool overwrite = true);
  Result<std::string> KvGet(const std::string& key, Duration timeout);
  Result<std::string> KvTryGet(const std::string& key);
  Result<std::vector<std::pair<std::string, std::string>>> KvList(const std::string& dir);
  Status KvDelete(const std::string& key);
  Status Barrier(const std::string& id, Duration timeout, std::vector<std::string> participants = {});
  Status CancelBarrier(const std::string& id);
  // Barrier rounds: every Barrier/BarrierAsync call is this node's next round of its id (1,
  // 2, ...), sent with the call, so a call re-issued after a lost link or a scheduler restart
  // gets that round's answer. A restarted process (same node id) resumes with
  // ResumeBarrierRound: it asks the scheduler for the last round of id this node joined,
  // continues counting from it and returns it (0: none). Blocking; docs/embedding.md.
  Result<uint64_t> ResumeBarrierRound(const std::string& id);
  // The last round of id this process called (0: none).
  uint64_t BarrierRound(const std::string& id) const;
  Status ReportError(int code, const std::string& message);
  Status SendEvent(uint32_t event, const std::string& payload);

  // Coordination client, asynchronous: any thread (the loop's too); `done` runs once, on
  // the loop thread, and must not block (calls issued after Stop() may never complete).
  // Many calls may be in flight at once, answered in any order (a GET waits for its key):
  // no thread waits per call, so one client with several calls in flight costs the
  // machine far less than as many blocking threads.
  void KvSetAsync(const std::string& key, const std::string& value, bool overwrite, std::function<void(Status)> done);
  void KvGetAsync(const std::string& key, Duration timeout, std::function<void(Result<std::string>)> done);
  void KvTryGetAsync(const std::string& key, std::function<void(Result<std::string>)> done);
  void BarrierAsync(const std::string& id, Duration timeout, std::vector<std::string> participants,
                    std::function<void(Status)> done);

 protected:
  uint64_t incarnation() const { return incarnation_; }  // this process's, as registered
  // What a call made after Stop is answered (kCancelled, naming this node).
  Status Stopped() const;
  // Loop thread: Stop has closed this node (its loop may be shared and run on).
  bool closed() const { return closed_; }
  // Loop thread: this member ends its part in the job on its own, for `why` (what
  // WaitForTermination returns, and on_fatal gets): it sends no more heartbeats, so the
  // scheduler times it out as a lost member.
  void StepDown(const Status& why) { Terminate(why); }
  // Role hooks, loop thread.
  virtual Status StartRole() { return Status::Ok(); }  // before registering (servers listen)
  virtual void OnPeerRequest(comm::ConnId conn, comm::Frame&& frame);
  virtual void OnMetadataApplied() {}
  virtual void OnStateApplied(pb::ClusterState state) {}
  // A cluster event from the scheduler (a node timed out, restarted, recovered...), before
  // NodeCallbacks::on_cluster_event sees it.
  virtual void OnClusterEvent(const pb::ClusterEventMessage& ev) {}
  // Scale-out: every new node is in (md is the complete new membership). Move what must
  // move, then call done() (any thread) to answer SCALE_OUT_DONE.
  virtual void OnScaleOutReady(const pb::SendMetadataMessage& md, std::function<void()> done) { done(); }
  // Scale-in started (msg names the leaving nodes). Hand over, then call done().
  virtual void OnScaleInStart(const pb::ScaleInMessage& msg, std::function<void()> done) { done(); }
  // The scale that held key-value traffic ended (scale().holding() turned false), right
  // after OnStateApplied of the new state.
  virtual void OnHoldReleased() {}
  // Loop thread: this member's side of scaling (cluster state, epoch, phase, holding).
  const core::ScaleParticipant& scale() const {
    DCHECK(loop_->InLoopThread());
    return scale_;
  }
  virtual void OnPeerClosed(comm::ConnId conn, const Status& why) {}
  std::unordered_map<comm::ConnId, int> unserved_;  // commands not served, per connection (loop thread)
  // A request whose tail could be taken as it arrives (comm::TailStream): a stream for
  // it, or null (the default) to receive it whole. Its frame then reaches
  // OnPeerRequest with the head and the stream.
  virtual std::shared_ptr<comm::TailStream> OnRequestStream(comm::ConnId conn, const pb::MessageMeta& meta,
                                                            uint64_t tail) {
    return nullptr;
  }
  virtual void StopRole() {}
  // Stop() was called on this thread, before anything stops (e.g. a server's handler
  // thread, which Stop must then not wait for).
  virtual void OnStopCalled() {}

  // Blocking call to the scheduler from a user thread.
  Result<comm::Frame> CallScheduler(pb::NodeCommand cmd, const google::protobuf::MessageLite& msg,
                                    Duration timeout);
  // The same with the request already encoded (a large KV value copied once, into it).
  Result<comm::Frame> CallScheduler(pb::NodeCommand cmd, BufferPtr payload, Duration timeout);
  // The same without waiting: any thread; done runs on the loop thread.
  // BARRIER, KV_REQUEST and FINISH calls that find no registered scheduler link, or lose it
  // (or time out while the scheduler answered nothing), are re-issued once the node has
  // registered again; they fail only after options_.recovery_timeout without a scheduler.
  void CallSchedulerAsync(pb::NodeCommand cmd, const google::protobuf::MessageLite& msg, Duration timeout,
                          std::function<void(Result<comm::Frame>)> done);
  // The same, telling done whether the answer is to a re-issued call (an idempotence check
  // may need it: a SET that must not overwrite finds its own value).
  void CallSchedulerReissuable(pb::NodeCommand cmd, const google::protobuf::MessageLite& msg, Duration timeout,
                               std::function<void(Result<comm::Frame>, bool reissued)> done);
  void CallSchedulerReissuable(pb::NodeCommand cmd, BufferPtr payload, Duration timeout,
                               std::function<void(Result<comm::Frame>, bool reissued)> done);
  // Loop thread: the address of server `rank` in the current metadata ("" if none), and
  // whether an address still belongs to a member.
  std::string ServerAddress(int rank) const;
  bool IsServerAddress(const std::string& addr) const;
  // Loop thread: the loop's own view of the metadata and of this node's rank, read in place
  // (metadata() and rank() are for other threads: they read a snapshot under mu_).
  const pb::SendMetadataMessage& loop_metadata() const {
    DCHECK(loop_->InLoopThread());
    return metadata_;
  }
  int loop_rank() const {
    DCHECK(loop_->InLoopThread());
    return rank_;
  }
  // Loop thread: the connection to server `rank` (dialled on first use, giving up after
  // `connect_timeout`, zero: NodeOptions::connect_timeout); cb gets it or why not.
  void WithServerConn(int rank, std::function<void(Result<comm::ConnId>)> cb,
                      Duration connect_timeout = Duration::zero());
  // Loop thread: dials to addresses not in `current` end now with kUnavailable, so their
  // callers retry at the address the membership names now instead of dialing a dead one
  // until connect_timeout.
  void FailDialsNotIn(const std::set<std::string>& current);
  // Loop thread: whether a link to server address `addr` is open now.
  bool HasServerLink(const std::string& addr) const;
  // Loop thread: closes the open link to server address `addr` now; the requests pending on
  // it fail with `why` (kUnavailable: their callers retry). A later request dials anew.
  void CloseServerLink(const std::string& addr, const Status& why);
  comm::Messenger& messenger() { return *messenger_; }
  void CountCopied(uint64_t bytes) { copied_->fetch_add(bytes, std::memory_order_relaxed); }
  // The role's count, shared with work that may finish after a call returns.
  const std::shared_ptr<std::atomic<uint64_t>>& copied_counter() const { return copied_; }

  NodeOptions options_;
  Callbacks callbacks_;
  int listen_port_ = 0;  // set by StartRole of roles that listen

 private:
  // tests/node/node_probe.h: hands frames to HandleSchedulerPush and OnPeerRequest as if
  // they had arrived (tests, fuzzers).
  friend class NodeProbe;

  // Lifecycle and dispatch (node.cc).
  Status StartOnLoop();
  void CloseOnLoop();
  void OnFrame(comm::ConnId conn, comm::Frame&& frame);
  bool Terminate(const Status& why);  // false: terminated already (the first reason stays)
  void TerminateAsTold(const pb::ClusterEventMessage& end);
  void PublishSnapshot();

  // Registration, heartbeats and scheduler liveness (node_registration.cc).
  void OnSchedulerConnected(comm::ConnId conn);
  void OnSchedulerFailed(const Status& why);
  void Register();
  void OnRegistered(const pb::RegisterRespMessage& resp);
  void RetryRegister(const Status& why);
  // The refusals a new node waits out (NodeOptions::join_timeout).
  enum class JoinRefusal { kNone, kQuotaFull, kScaleInRunning };
  static JoinRefusal JoinRefusalOf(const Status& refusal);
  bool WaitToJoin(const Status& refusal, JoinRefusal kind);
  void RegisterAfter(Duration wait);
  void SettleStart(const Status& st);  // answers Start() once
  void Heartbeat();
  void OnHeartbeatAnswer(uint64_t session, Result<comm::Frame> r);
  void SchedulerAnswered();
  void WatchScheduler();
  // The meta of a request to the scheduler: carries the session of our registration.
  pb::MessageMeta SchedulerMeta(pb::NodeCommand cmd) const;
  // A request sent under session `carried` was refused as stale: registers again, unless a
  // registration since gave a new session already.
  void OnStaleSession(uint64_t carried, const Status& why);

  // Metadata, epochs, cluster state and scaling as the scheduler pushes them (node_metadata.cc).
  void HandleSchedulerPush(comm::ConnId conn, comm::Frame&& frame);
  void OnClusterEventPush(const comm::Frame& frame);
  void OnScaleOutPush(const comm::Frame& frame);
  void OnScaleInPush(const comm::Frame& frame);
  // One CLUSTER_EVENT notice (a frame's own, or one of its `more`).
  void HandleClusterEvent(const pb::ClusterEventMessage& ev);
  // By value: the node's own rank is filled in (found by node id) before it is applied.
  void ApplyMetadata(pb::SendMetadataMessage md);
  void FetchMetadata(uint64_t epoch);
  void ApplyState(pb::ClusterState state);
  // Does what scale_ decided, in order. `md`: the metadata an OnMetadataApplied decision
  // is about; `scale_in`: the notice an OnScaleIn decision is about.
  void Perform(const core::ScaleActions& actions, const pb::SendMetadataMessage* md = nullptr,
               const pb::ScaleInMessage* scale_in = nullptr);
  void StateChanged(const core::ScaleAction& change);
  void SendScaleDone(pb::NodeCommand cmd, uint64_t epoch);

  // Control calls that survive a lost scheduler (node_control_calls.cc): see CallSchedulerAsync.
  struct ControlCall {
    pb::NodeCommand cmd;
    BufferPtr payload;
    Duration timeout{};
    std::function<void(Result<comm::Frame>, bool reissued)> done;
    bool reissuable = false;
    bool reissued = false;
    std::optional<TimePoint> lost_since;  // set while parked
  };
  void SendControlCall(std::shared_ptr<ControlCall> call);
  // A failed call: parks it for re-issue (true) when the failure is a lost scheduler.
  bool ParkControlCall(const std::shared_ptr<ControlCall>& call, const Status& why, TimePoint sent,
                       comm::ConnId conn);
  void ReissueParked();
  // Fails parked calls lost for recovery_timeout (all: `all`), with why appended.
  void FailParked(bool all, const std::string& why);

  std::unique_ptr<comm::EventLoop> owned_loop_;
  comm::EventLoop* loop_;
  // Links to the servers, by rank (loop thread). Declared before messenger_: the links'
  // close watches stay valid while the messenger is torn down.
  std::unique_ptr<PeerLinks> links_;
  std::unique_ptr<comm::Messenger> messenger_;
  std::shared_ptr<std::atomic<uint64_t>> copied_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::unique_ptr<comm::TcpClient> scheduler_;
  uint64_t incarnation_;
  comm::TimerId heartbeat_timer_ = 0;
  // Scheduler liveness (loop thread): fed every answer, checked by watch_timer_ from the
  // first registration on.
  SteadyClock clock_;
  core::SchedulerWatch watch_;
  comm::TimerId watch_timer_ = 0;
  uint64_t stop_hook_ = 0;
  bool closed_ = false;  // loop thread: CloseOnLoop ran
  // Loop thread: Terminate ran. The node's part in the job is over (the job ended, or it
  // left by a scale-in): nothing the scheduler says afterwards is applied. A server that
  // handed its keys over must not take back its old range from a state change broadcast
  // after its TERMINATE.
  bool ended_ = false;
  bool registered_ = false;
  bool registering_ = false;
  uint64_t session_id_ = 0;  // the scheduler's session, from the last registration (0: none yet)
  // A REGISTER that timed out on a live link is sent again after this backoff (loop thread).
  comm::TimerId register_retry_timer_ = 0;
  comm::Backoff register_backoff_{std::chrono::milliseconds(100), std::chrono::seconds(5)};
  // The first refusal this node waits out ("quota full", "scale-in running"), and the kinds
  // met since, in order, quoted (loop thread; WaitToJoin).
  std::optional<TimePoint> refused_since_;
  std::string join_refusals_;
  JoinRefusal last_join_refusal_ = JoinRefusal::kNone;
  comm::Backoff join_backoff_{std::chrono::milliseconds(100), std::chrono::seconds(1)};
  std::promise<Status> start_promise_;
  bool start_done_ = false;

  // Loop-thread view of the cluster.
  int rank_ = -1;
  // The cluster state, the metadata epoch and every scale decision.
  core::ScaleParticipant scale_;
  pb::SendMetadataMessage metadata_;
  bool metadata_fetching_ = false;  // a FETCH_METADATA is in flight

  std::map<uint64_t, std::shared_ptr<ControlCall>> parked_calls_;  // loop thread, by serial
  uint64_t parked_serial_ = 0;
  // Blocking KV requests and barriers the calling thread sends itself; the loop opens and
  // closes the way as the scheduler link comes and goes.
  DirectControl direct_calls_{options_};
  // Control calls handed to the loop and not answered yet (any thread). While one is out, a
  // blocking call goes the loop's way too, so it cannot overtake an earlier asynchronous
  // call of its thread on another link.
  std::atomic<uint64_t> loop_calls_out_{0};
  // A blocking KV or barrier call the direct way; nullopt: send it the loop's way.
  std::optional<Result<comm::Frame>> CallDirect(pb::NodeCommand cmd, const BufferPtr& payload, Duration timeout);
  // Loop thread: opens the direct way on the registered scheduler link, or closes it.
  void OpenDirectCalls();
  void CloseDirectCalls(const char* why);
  // Barrier round counters by id (any thread).
  uint64_t NextBarrierRound(const std::string& id);
  mutable std::mutex rounds_mu_;
  std::map<std::string, uint64_t> barrier_rounds_;  // guarded by rounds_mu_

  // Snapshot for other threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int rank_snapshot_ = -1;
  uint64_t session_snapshot_ = 0;
  pb::ClusterState state_snapshot_ = pb::ClUSTER_STARTING;
  uint64_t epoch_snapshot_ = 0;
  pb::SendMetadataMessage metadata_snapshot_;
  bool ready_seen_ = false;
  bool terminated_ = false;
  Status termination_;
  bool stopped_ = false;
};

}  // namespace pscore::node
