#include "pscore/node/scheduler/scheduler_node.h"

#include <future>
#include <random>

#include "pscore/core/state_file.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/state_writer.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

namespace {

core::ClusterConfig MakeClusterConfig(const SchedulerOptions& o) {
  core::ClusterConfig c;
  c.worker_num = o.worker_num;
  c.server_num = o.server_num;
  c.heartbeat_timeout = o.heartbeat_timeout;
  c.scale_timeout = o.scale_timeout;
  c.isolation_timeout = o.isolation_timeout;
  c.replicas = o.replicas;
  c.recoverable_roles = o.recoverable_roles;
  return c;
}

// A scheduler started with no state opens a new session: members registered with an
// earlier scheduler process are told to register again.
uint64_t FreshSessionId() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return v == 0 ? 1 : v;
}

}  // namespace

SchedulerNode::SchedulerNode(SchedulerOptions options, comm::EventLoop* loop)
    : options_(std::move(options)),
      owned_loop_(loop == nullptr ? std::make_unique<comm::EventLoop>("scheduler") : nullptr),
      loop_(loop == nullptr ? owned_loop_.get() : loop),
      cluster_(MakeClusterConfig(options_), &clock_),
      kv_(&clock_, options_.max_kv_value_bytes, options_.max_kv_total_bytes),
      barriers_(&clock_) {
  cluster_.set_session_id(FreshSessionId());  // OpenState keeps a persisted one instead
  // Barriers may name registered members only (any name while the cluster is starting).
  barriers_.SetMembership([this](const std::string& node_id) {
    return cluster_.state() == pb::ClUSTER_STARTING || cluster_.Find(node_id) != nullptr;
  });
  comm::Messenger::Handlers h;
  h.on_request = [this](ConnId c, Frame&& f) { OnRequest(c, std::move(f)); };
  h.on_close = [this](ConnId c, const Status& why) { OnClose(c, why); };
  comm::TransportOptions t = MakeTransportOptions(options_.max_message_bytes, options_.cluster_token, options_.accept, options_.tls);
  t.max_queued_write_bytes = options_.max_queued_write_bytes;
  messenger_ = std::make_unique<comm::Messenger>(loop_, t, std::move(h));
}

SchedulerNode::~SchedulerNode() { Stop(); }

Status SchedulerNode::Start() {
  for (int total : {options_.worker_num, options_.server_num}) {
    if (total < 0 || total > core::kMaxRoleTotal) {
      return Status(Code::kInvalidArgument, "worker_num and server_num must be in [0, " +
                                                std::to_string(core::kMaxRoleTotal) + "], got " +
                                                std::to_string(options_.worker_num) + " and " +
                                                std::to_string(options_.server_num));
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return Status(Code::kFailedPrecondition, "the scheduler was stopped: it starts once");
  }
  if (owned_loop_ && !owned_loop_->running()) PSCORE_RETURN_IF_ERROR(owned_loop_->Start());
  PSCORE_RETURN_IF_ERROR(OpenState());  // --state_dir: restore before anyone can connect
  std::promise<Status> started;
  bool queued = loop_->Run([this, &started] {
    Result<int> port = messenger_->transport().Listen(options_.host, options_.port);
    if (!port.ok()) {
      started.set_value(port.status());
      return;
    }
    port_ = *port;
    Duration period = std::max<Duration>(options_.heartbeat_interval / 4, std::chrono::milliseconds(5));
    tick_period_ = period;
    last_tick_ = clock_.Now();  // A stall before the first tick counts as one too.
    tick_timer_ = loop_->AddTimer(period, period, [this] { Tick(); });
    stop_hook_ = loop_->AddStopHook([this] {
      if (tick_timer_ != 0) loop_->CancelTimer(tick_timer_);
      tick_timer_ = 0;
      if (untold_timer_ != 0) loop_->CancelTimer(untold_timer_);
      untold_timer_ = 0;
      messenger_->Shutdown();
    });
    LOG(INFO) << "scheduler listening on " << options_.host << ":" << port_ << " (expecting "
              << options_.worker_num << " workers, " << options_.server_num << " servers)";
    started.set_value(Status::Ok());
  });
  if (!queued) return Status(Code::kCancelled, "the scheduler's event loop is stopping");
  return started.get_future().get();
}

void SchedulerNode::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (owned_loop_) {
    owned_loop_->Stop().IgnoreError();  // Stop hooks close the messenger.
  } else if (loop_->running() && !loop_->InLoopThread()) {
    loop_->RunAndWait([this] {
      if (stop_hook_ != 0) loop_->RemoveStopHook(stop_hook_);
      if (tick_timer_ != 0) loop_->CancelTimer(tick_timer_);
      tick_timer_ = 0;
      messenger_->Shutdown();
      if (state_writer_) {  // what the writer had no time for (an owned loop's stop hook does this)
        MarkStateDirty(/*urgent=*/true);
        PersistState();
      }
    });
  }
  if (state_writer_) {
    // The last snapshot is on disk once Stop returns: the directory may be read, removed
    // or given to a new scheduler at once.
    Status st = state_writer_->Flush(std::chrono::seconds(30));
    if (!st.ok()) LOG(WARNING) << "scheduler: " << st;
    // Wake-ups the flush posted to a shared loop run before the token goes (in posting
    // order) or find it gone; inline when the loop is not running.
    loop_->RunAndWait([this] { writer_token_.Expire(); });
  }
  MarkExited();
}

Status SchedulerNode::WaitForExit(Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!exit_cv_.wait_for(lock, timeout, [this] { return exited_; })) {
    return Status(Code::kTimeout, "job did not end within " + std::to_string(ToMillis(timeout)) + " ms");
  }
  return Status::Ok();
}

bool SchedulerNode::exited() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exited_;
}

pb::ClusterState SchedulerNode::cluster_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_snapshot_;
}

uint64_t SchedulerNode::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_snapshot_;
}

core::JobOutcome SchedulerNode::outcome() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outcome_snapshot_;
}

void SchedulerNode::SetCommandHandler(pb::NodeCommand cmd, std::function<void(ConnId, Frame&&)> fn) {
  extra_handlers_[cmd] = std::move(fn);
}

void SchedulerNode::AddEventListener(std::function<void(const core::Event&)> fn) {
  loop_->Run([this, fn = std::move(fn)] { listeners_.push_back(fn); });
}

void SchedulerNode::AddRegisterListener(std::function<void()> fn) {
  loop_->Run([this, fn = std::move(fn)] { register_listeners_.push_back(fn); });
}

void SchedulerNode::MarkExited() {
  std::lock_guard<std::mutex> lock(mu_);
  exited_ = true;
  exit_cv_.notify_all();
}

std::string SchedulerNode::NodeOf(ConnId conn) const {
  DCHECK(loop_->InLoopThread());
  auto it = node_of_.find(conn);
  return it == node_of_.end() ? std::string() : it->second.node_id;
}

void SchedulerNode::Reply(ConnId conn, const pb::MessageMeta& req, const Status& st, Payload payload) {
  DCHECK(loop_->InLoopThread());
  // The transport refuses to send a payload over max_message_bytes: answer with why instead,
  // so the caller fails at once rather than at its deadline.
  if (payload.size() > options_.max_message_bytes) {
    Status too_big(Code::kResourceExhausted, "the answer to " + pb::NodeCommand_Name(req.cmd()) + " is " +
                                                 std::to_string(payload.size()) + " bytes, over max_message_bytes " +
                                                 std::to_string(options_.max_message_bytes));
    LOG_EVERY_N(WARNING, 100) << "scheduler: conn " << conn << ": " << too_big;
    return Reply(conn, req, too_big);
  }
  Status sent = messenger_->Reply(conn, req, st, std::move(payload));
  if (!sent.ok()) VLOG(1) << "reply to conn " << conn << " not sent: " << sent;
}

void SchedulerNode::OnRequest(ConnId conn, Frame&& frame) {
  DCHECK(loop_->InLoopThread());
  // A request made under another session (a scheduler process whose state is gone) is not
  // acted on: the member registers again and gets this session.
  if (frame.meta.session_id() != 0 && frame.meta.cmd() != pb::REGISTER) {
    Status session = cluster_.CheckSession(frame.meta.session_id());
    if (!session.ok()) {
      LOG_EVERY_N(WARNING, 100) << "scheduler: conn " << conn << " " << NodeOf(conn) << ": "
                                << pb::NodeCommand_Name(frame.meta.cmd()) << " refused: " << session;
      return Reply(conn, frame.meta, session);
    }
  }
  switch (frame.meta.cmd()) {
    case pb::REGISTER: HandleRegister(conn, frame); break;
    case pb::HEARTBEAT: HandleHeartbeat(conn, frame); break;
    case pb::FETCH_METADATA: HandleFetchMetadata(conn, frame); break;
    case pb::FINISH: HandleFinish(conn, frame); break;
    case pb::ADMIN: HandleAdmin(conn, frame); break;
    case pb::KV_REQUEST: HandleKv(conn, frame); break;
    case pb::BARRIER: HandleBarrier(conn, frame); break;
    case pb::SEND_EVENT: HandleEvent(conn, frame); break;
    case pb::SCALE_OUT_DONE:
    case pb::SCALE_IN_DONE: HandleScaleDone(conn, frame); break;
    case pb::REPORT_ERROR: HandleReportError(conn, frame); break;
    case pb::RESYNC_DONE: HandleResyncDone(conn, frame); break;
    case pb::PING: Reply(conn, frame.meta, Status::Ok()); break;
    default: HandleUnserved(conn, std::move(frame));
  }
  DrainEvents();
}

// What a member asks for once it sees a newer epoch in a heartbeat answer: the cached
// buffer of its view, so a wave of fetches after one change builds it once and every answer
// queued meanwhile shares it. The role is the registered one (the frame's for a connection
// that carries no member).
void SchedulerNode::HandleFetchMetadata(ConnId conn, const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  const core::NodeRecord* rec = cluster_.Find(NodeOf(conn));
  const pb::NodeRole role = rec != nullptr ? rec->role : frame.meta.role();
  if (!MetadataFits(conn)) {
    // A copy is still on its way (a push, or the answer to a fetch the member gave up on):
    // the member asks again on a later heartbeat, once its link has drained.
    return Reply(conn, frame.meta, Status(Code::kUnavailable, "the metadata waits unwritten on this link (" +
                                                                  std::to_string(QueuedOn(conn)) +
                                                                  " bytes queued); fetch again later"));
  }
  Reply(conn, frame.meta, Status::Ok(), Payload::Shared(metadata_.For(cluster_, role)));
}

// A command of an extension (SetCommandHandler), or one the scheduler refuses; a peer
// that keeps sending those is closed.
void SchedulerNode::HandleUnserved(ConnId conn, Frame&& frame) {
  DCHECK(loop_->InLoopThread());
  auto extra = extra_handlers_.find(frame.meta.cmd());
  if (extra != extra_handlers_.end()) return extra->second(conn, std::move(frame));
  const std::string what = UnservedCommandName(frame.meta.cmd());
  LOG_EVERY_N(WARNING, 100) << "scheduler: conn " << conn << " " << messenger_->transport().PeerAddress(conn)
                            << " sent " << what << ", which the scheduler does not serve";
  Reply(conn, frame.meta, Status(Code::kInvalidArgument, "the scheduler does not serve " + what));
  if (++unserved_[conn] >= kMaxUnservedCommands) {
    messenger_->transport().CloseAfterFlush(conn, Status(Code::kProtocol, std::to_string(kMaxUnservedCommands) +
                                                                    " commands the scheduler does not serve"));
  }
}

void SchedulerNode::OnClose(ConnId conn, const Status& why) {
  DCHECK(loop_->InLoopThread());
  unserved_.erase(conn);
  CancelGets(conn);
  barriers_.Withdraw(conn);  // a departed caller no longer counts as arrived
  finish_waiters_.erase(conn);  // its FINISH stays recorded; only the wait ends
  auto it = node_of_.find(conn);
  if (it == node_of_.end()) return;
  VLOG(1) << "scheduler: link of " << it->second.node_id << " (conn " << conn << ") closed: " << why;
  auto c = conn_of_.find(it->second.node_id);
  if (c != conn_of_.end() && c->second == conn) {
    conn_of_.erase(c);
    if (clock_.Now() - it->second.heard > options_.heartbeat_timeout / 2) quiet_close_.insert(it->second.node_id);
  }
  node_of_.erase(it);
  // Liveness is judged by heartbeats, not by the link: a node may reconnect in time.
}

void SchedulerNode::Tick() {
  DCHECK(loop_->InLoopThread());
  // A tick far later than its period means this process did not run (SIGSTOP, swap, a
  // long stall): heartbeats are waiting unread in the sockets, so the gap must not time
  // nodes out.
  TimePoint now = clock_.Now();
  Duration gap = now - last_tick_;
  if (gap > options_.heartbeat_timeout / 2) {
    LOG(WARNING) << "scheduler: did not run for " << ToMillis(gap)
                 << " ms; that time does not count against heartbeats";
    cluster_.Pause(gap - tick_period_);
  }
  last_tick_ = now;
  metadata_.Invalidate();  // heartbeat ages and liveness in the bytes are one tick old at most
  cluster_.Tick();
  kv_.Tick();
  barriers_.Tick();
  ExpireFinishWaiters();
  RetryRefusedState();
  DrainEvents();
}

uint64_t SchedulerNode::QueuedOutputBytes() const {
  DCHECK(loop_->InLoopThread());
  uint64_t total = 0;
  for (const auto& [conn, link] : node_of_) total += messenger_->transport().QueuedBytes(conn);
  return total;
}

}  // namespace pscore::node
