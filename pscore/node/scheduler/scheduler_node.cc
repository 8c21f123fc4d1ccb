#include "pscore/node/scheduler/scheduler_node.h"

#include <future>
#include <random>

#include "pscore/core/state_file.h"
#include "pscore/node/scheduler/state_writer.h"
#include "pscore/node/common/wire.h"

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
    loop_->RunAndWait([this] { writer_token_.reset(); });
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
  auto it = node_of_.find(conn);
  return it == node_of_.end() ? std::string() : it->second.node_id;
}

void SchedulerNode::Reply(ConnId conn, const pb::MessageMeta& req, const Status& st, Payload payload) {
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
    case pb::FETCH_METADATA: {
      // What a member asks for once it sees a newer epoch in a heartbeat answer: the
      // cached buffer of its view, so a wave of fetches after one change builds it once
      // and every answer queued meanwhile shares it. The role is the registered one (the
      // frame's for a connection that carries no member).
      const core::NodeRecord* rec = cluster_.Find(NodeOf(conn));
      const pb::NodeRole role = rec != nullptr ? rec->role : frame.meta.role();
      if (!MetadataFits(conn)) {
        // A copy is still on its way (a push, or the answer to a fetch the member gave up
        // on): the member asks again on a later heartbeat, once its link has drained.
        return Reply(conn, frame.meta, Status(Code::kUnavailable, "the metadata waits unwritten on this link (" +
                                                                      std::to_string(QueuedOn(conn)) +
                                                                      " bytes queued); fetch again later"));
      }
      Reply(conn, frame.meta, Status::Ok(), Payload::Shared(metadata_.For(cluster_, role)));
      break;
    }
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
    default: {
      auto extra = extra_handlers_.find(frame.meta.cmd());
      if (extra != extra_handlers_.end()) {
        extra->second(conn, std::move(frame));
        break;
      }
      const std::string what = UnservedCommandName(frame.meta.cmd());
      LOG_EVERY_N(WARNING, 100) << "scheduler: conn " << conn << " " << messenger_->transport().PeerAddress(conn)
                                << " sent " << what << ", which the scheduler does not serve";
      Reply(conn, frame.meta, Status(Code::kInvalidArgument, "the scheduler does not serve " + what));
      if (++unserved_[conn] >= kMaxUnservedCommands) {
        messenger_->transport().CloseAfterFlush(conn, Status(Code::kProtocol, std::to_string(kMaxUnservedCommands) +
                                                                        " commands the scheduler does not serve"));
      }
    }
  }
  DrainEvents();
}

void SchedulerNode::OnClose(ConnId conn, const Status& why) {
  unserved_.erase(conn);
  CancelGets(conn);
  barriers_.Withdraw(conn);  // a departed caller no longer counts as arrived
  finish_waiters_.erase(conn);  // its FINISH stays recorded; only the wait ends
  auto it = node_of_.find(conn);
  if (it == node_of_.end()) return;
  VLOG(1) << "scheduler: link of " << it->second.node_id << " (conn " << conn << ") closed: " << why;
  auto c = conn_of_.find(it->second.node_id);
  if (c != conn_of_.end() && c->second == conn) conn_of_.erase(c);
  node_of_.erase(it);
  // Liveness is judged by heartbeats, not by the link: a node may reconnect in time.
}

void SchedulerNode::HandleRegister(ConnId conn, const Frame& frame) {
  pb::RegisterMessage msg;
  Status st = ParsePayload(frame, &msg);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  if (msg.protocol_version() != kProtocolVersion) {
    return Reply(conn, frame.meta, Status(Code::kInvalidArgument, "node " + msg.node_id() + " speaks protocol version " +
                                                                      std::to_string(msg.protocol_version()) +
                                                                      "; this scheduler speaks version " +
                                                                      std::to_string(kProtocolVersion)));
  }
  core::RegisterRequest req;
  req.node_id = msg.node_id();
  req.role = msg.role();
  req.ip = msg.ip();
  req.port = msg.port();
  req.incarnation = msg.incarnation();
  req.requested_rank = msg.requested_rank();
  req.devices.assign(msg.devices().begin(), msg.devices().end());
  req.host_name = msg.host_name();
  if (req.node_id.empty() || req.node_id.size() > 256) {
    return Reply(conn, frame.meta, Status(Code::kInvalidArgument, "node_id must be 1..256 bytes"));
  }
  if (options_.tls != nullptr) {
    // With TLS the node id is not a claim: the member's certificate (verified against the
    // cluster CA) names it, so one member cannot register as another.
    const std::string proven = messenger_->transport().PeerIdentity(conn);
    if (proven != req.node_id) {
      Status why(Code::kPermissionDenied, "node id '" + req.node_id + "' does not match the TLS certificate of " +
                                              messenger_->transport().PeerAddress(conn) + " (CN=" + proven + ")");
      LOG(ERROR) << "scheduler: refused REGISTER: " << why.message();
      Reply(conn, frame.meta, why);
      messenger_->transport().CloseAfterFlush(conn, why);
      return;
    }
  }
  // What the state file may hold (pscore/core/state_file.h): a scheduler must be able to load the
  // state it writes, or its restart fails on a member's bad REGISTER.
  if (req.port < 0 || req.port > 65535) {
    return Reply(conn, frame.meta, Status(Code::kInvalidArgument, "port " + std::to_string(req.port) + " is not in [0, 65535]"));
  }
  if (req.devices.size() > static_cast<size_t>(core::kMaxStateDevicesPerNode)) {
    return Reply(conn, frame.meta, Status(Code::kInvalidArgument, std::to_string(req.devices.size()) +
                                                                      " devices: at most " +
                                                                      std::to_string(core::kMaxStateDevicesPerNode) + " per node"));
  }
  const uint64_t epoch_before = cluster_.epoch();
  Result<core::RegisterOutcome> out = cluster_.Register(req);
  if (!out.ok()) {
    LOG(WARNING) << "scheduler: refused " << RoleLabel(req.role) << " " << req.node_id << " from "
                 << messenger_->transport().PeerAddress(conn) << ": " << out.status();
    return Reply(conn, frame.meta, out.status());
  }
  auto old = conn_of_.find(req.node_id);
  auto link = node_of_.find(conn);
  // Registered on this link before and linked on it since: every notice reached it.
  const bool heard_all = old != conn_of_.end() && old->second == conn && link != node_of_.end() &&
                         link->second.node_id == req.node_id && link->second.registered;
  if (old != conn_of_.end() && old->second != conn) node_of_.erase(old->second);
  conn_of_[req.node_id] = conn;
  node_of_[conn] = LinkNode{req.node_id, {}, /*registered=*/true};
  LOG(INFO) << "scheduler: " << RoleLabel(req.role) << " " << req.node_id << " registered as rank "
            << out->rank << " from " << req.ip << ":" << req.port
            << (out->restarted ? " (restarted)" : out->retry ? " (retry)" : "") << "; "
            << cluster_.registered(pb::WORKER) << "/" << cluster_.worker_num() << " workers, "
            << cluster_.registered(pb::SERVER) << "/" << cluster_.server_num() << " servers";
  pb::RegisterRespMessage resp;
  resp.set_node_id(req.node_id);
  resp.set_rank_id(out->rank);
  resp.set_epoch(cluster_.epoch());
  resp.set_worker_num(cluster_.worker_num());
  resp.set_server_num(cluster_.server_num());
  resp.set_session_id(cluster_.session_id());
  Reply(conn, frame.meta, Status::Ok(), ToBuffer(resp));
  if (!out->retry) {
    metadata_.Invalidate();
    for (auto& fn : register_listeners_) fn();
  }
  // A node that (re)joins an already published membership needs the metadata now; one
  // whose admission published a new membership gets it with everyone (DrainEvents).
  if (cluster_.state() != pb::ClUSTER_STARTING && cluster_.epoch() == epoch_before) SendMetadataTo(req.node_id);
  // A node registering again on the link it registered on before heard every notice
  // broadcast since (it timed out while its link stayed up); on a new link, or one it
  // only heartbeat on, it may have missed some.
  if (!heard_all) ReplayNotices(conn, req.node_id);
}

// Every stored error and heartbeat loss, in one CLUSTER_EVENT frame (the first notice, the
// others in `more`): one frame per joiner, however many nodes are flagged. Skipped when no
// node is flagged: a scan per REGISTER would make a registration storm O(N^2).
void SchedulerNode::ReplayNotices(ConnId conn, const std::string& node_id) {
  if (cluster_.flagged() == 0) return;
  pb::ClusterEventMessage first;
  bool any = false;
  cluster_.ForEachNode([&](const core::NodeRecord& rec) {
    if (rec.node_id == node_id || (!rec.in_error && !rec.timed_out)) return;
    pb::ClusterEventMessage* ev = any ? first.add_more() : &first;
    any = true;
    ev->set_kind(rec.in_error ? pb::ClusterEventMessage::NODE_ERROR : pb::ClusterEventMessage::NODE_TIMED_OUT);
    ev->set_cluster_state(cluster_.state());
    ev->set_node_id(rec.node_id);
    ev->set_role(rec.role);
    ev->set_rank_id(rec.rank);
    ev->set_error_code(rec.in_error ? rec.error_code : 0);
    ev->set_message(rec.in_error ? rec.error_message : "heartbeat timed out");
    ev->set_epoch(cluster_.epoch());
  });
  if (any) messenger_->Notify(conn, MakeMeta(pb::CLUSTER_EVENT, pb::SCHEDULER, 0), ToBuffer(first)).IgnoreError();
}

void SchedulerNode::HandleHeartbeat(ConnId conn, const Frame& frame) {
  // The hottest request: the messages are members, reused (no allocation once warm).
  pb::HeartbeatMessage& msg = heartbeat_in_;
  Status st = ParsePayload(frame, &msg);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  ++heartbeats_;
  auto link = node_of_.find(conn);
  core::ClusterManager::NodeHint* hint = link == node_of_.end() ? nullptr : &link->second.hint;
  if (link == node_of_.end()) {
    // Another connection may not take over the link of a member whose link is up; the
    // member re-registers on it (REGISTER moves the link).
    auto live = conn_of_.find(msg.node_id());
    if (live != conn_of_.end() && live->second != conn) {
      return Reply(conn, frame.meta, Status(Code::kFailedPrecondition, "node " + msg.node_id() +
                                                                           " is linked on another connection; register again"));
    }
  }
  st = cluster_.Heartbeat(msg.node_id(), msg.incarnation(), hint);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  if (link == node_of_.end()) {
    // The node reconnected: this link now carries its pushes.
    conn_of_[msg.node_id()] = conn;
    node_of_[conn] = LinkNode{msg.node_id(), {}};
  }
  // Constant-size whatever the cluster's size: a member whose known epoch is older fetches
  // the metadata itself (FETCH_METADATA), once, so no beat costs O(members).
  pb::HeartbeatRespMessage& resp = heartbeat_out_;
  resp.Clear();
  resp.set_cluster_state(cluster_.state());
  resp.set_epoch(cluster_.epoch());
  if (const core::NodeRecord* rec = cluster_.Find(msg.node_id())) resp.set_rank_id(rec->rank);
  Status sent = messenger_->Reply(conn, frame.meta, resp);
  if (!sent.ok()) VLOG(1) << "heartbeat answer to conn " << conn << " not sent: " << sent;
}

void SchedulerNode::HandleFinish(ConnId conn, const Frame& frame) {
  pb::FinishMessage msg;
  Status st = ParsePayload(frame, &msg);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  if (auto w = finish_waiters_.find(conn); w != finish_waiters_.end()) {
    return Reply(conn, frame.meta, Status(Code::kResourceExhausted, "a FINISH for " + w->second.node_id +
                                                                          " already waits on this connection"));
  }
  st = cluster_.Finish(msg.node_id());
  if (!st.ok()) return Reply(conn, frame.meta, st);
  barriers_.NodeFailed(msg.node_id(), "it shut down (called Finish)");
  MarkStateDirty(/*urgent=*/true);
  finish_waiters_[conn] = FinishWaiter{frame.meta,
                                       clock_.Now() + WireMillis(msg.timeout_ms(), std::chrono::seconds(60)),
                                       msg.node_id()};
  LOG(INFO) << "scheduler: " << msg.node_id() << " finished; waiting for "
            << cluster_.FinishMissing().size() << " more";
}

size_t SchedulerNode::finish_waiting() {
  size_t n = 0;
  loop_->RunAndWait([this, &n] { n = finish_waiters_.size(); });
  return n;
}

void SchedulerNode::AnswerFinishWaiters(const Status& st) {
  std::map<ConnId, FinishWaiter> waiters;
  waiters.swap(finish_waiters_);
  for (auto& [conn, w] : waiters) Reply(conn, w.meta, st);
}

void SchedulerNode::ExpireFinishWaiters() {
  if (finish_waiters_.empty()) return;
  TimePoint now = clock_.Now();
  std::vector<std::string> missing = cluster_.FinishMissing();
  std::string names;
  for (auto& m : missing) names += (names.empty() ? "" : ", ") + m;
  bool expired = false;
  for (auto it = finish_waiters_.begin(); it != finish_waiters_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    expired = true;
    // Erased first: a reply may close its connection, and OnClose erases from this map.
    const ConnId conn = it->first;
    const pb::MessageMeta meta = std::move(it->second.meta);
    it = finish_waiters_.erase(it);
    Reply(conn, meta,
          Status(Code::kTimeout, "finish timed out: " + std::to_string(missing.size()) +
                                     " node(s) missing: " + names));
  }
  if (!expired) return;
  // The others gave up waiting for the stragglers: they are in error (everyone hears of it)
  // and must be reset before they register again.
  cluster_.FinishTimedOut(missing);
}

void SchedulerNode::HandleEvent(ConnId conn, const Frame& frame) {
  pb::EventMessage msg;
  Status st = ParsePayload(frame, &msg);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  pb::EventRespMessage ev;
  ev.set_event(msg.event());
  ev.set_node_id(msg.node_id());
  ev.set_payload(msg.payload());
  BufferPtr payload = ToBuffer(ev);
  pb::MessageMeta meta = MakeMeta(pb::SEND_EVENT, pb::SCHEDULER, 0);
  for (auto& [node_id, c] : Links()) {
    if (node_id != msg.node_id()) messenger_->Notify(c, meta, payload).IgnoreError();
  }
  Reply(conn, frame.meta, Status::Ok());
}

void SchedulerNode::HandleScaleDone(ConnId conn, const Frame& frame) {
  std::string node_id;
  uint64_t epoch = 0;
  Status st;
  if (frame.meta.cmd() == pb::SCALE_OUT_DONE) {
    pb::ScaleOutDoneMessage msg;
    st = ParsePayload(frame, &msg);
    node_id = msg.node_id();
    epoch = msg.epoch();
    if (st.ok()) st = cluster_.ScaleOutDone(node_id, epoch);
  } else {
    pb::ScaleInDoneMessage msg;
    st = ParsePayload(frame, &msg);
    node_id = msg.node_id();
    epoch = msg.epoch();
    if (st.ok()) st = cluster_.ScaleInDone(node_id, epoch);
  }
  if (st.code() == Code::kAborted) LOG(WARNING) << "scheduler: ignored stale " << node_id << ": " << st;
  Reply(conn, frame.meta, st);
}

void SchedulerNode::HandleReportError(ConnId conn, const Frame& frame) {
  pb::ErrorReport msg;
  Status st = ParsePayload(frame, &msg);
  if (st.ok()) st = cluster_.ReportError(msg.node_id(), msg.error_code(), msg.message());
  Reply(conn, frame.meta, st);
}

void SchedulerNode::HandleResyncDone(ConnId conn, const Frame& frame) {
  pb::ResyncDoneMessage msg;
  Status st = ParsePayload(frame, &msg);
  if (st.ok()) st = cluster_.ResyncDone(msg.node_id(), msg.incarnation());
  Reply(conn, frame.meta, st);
}

void SchedulerNode::Tick() {
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
  DrainEvents();
}

// One buffer for every link, counted once in the transport's queued total.
void SchedulerNode::Broadcast(const pb::MessageMeta& meta, const BufferPtr& payload) {
  for (auto& [node_id, c] : Links()) messenger_->Notify(c, meta, Payload::Shared(payload)).IgnoreError();
}

bool SchedulerNode::IsNodeNotice(core::Event::Kind kind) {
  using Kind = core::Event::Kind;
  return kind == Kind::kNodeTimedOut || kind == Kind::kNodeRestarted || kind == Kind::kNodeRecovered ||
         kind == Kind::kNodeError;
}

void SchedulerNode::FlushNotices() {
  if (!has_notices_) return;
  has_notices_ = false;
  BufferPtr payload = ToBuffer(notices_);
  notices_.Clear();
  Broadcast(MakeMeta(pb::CLUSTER_EVENT, pb::SCHEDULER, 0), payload);
}

// A copy of the node links to send over: a send may close its connection at once (a
// peer over the queued-output cap), and OnClose then erases it from conn_of_.
std::vector<std::pair<std::string, ConnId>> SchedulerNode::Links() const {
  return std::vector<std::pair<std::string, ConnId>>(conn_of_.begin(), conn_of_.end());
}

uint64_t SchedulerNode::QueuedOn(ConnId conn) const { return messenger_->transport().QueuedBytes(conn); }

bool SchedulerNode::MetadataFits(ConnId conn) const { return QueuedOn(conn) <= kMetadataGateBytes; }

void SchedulerNode::SendMetadataTo(const std::string& node_id) {
  auto c = conn_of_.find(node_id);
  const core::NodeRecord* rec = cluster_.Find(node_id);
  if (c == conn_of_.end() || rec == nullptr || !MetadataFits(c->second)) return;
  messenger_->Notify(c->second, MakeMeta(pb::SEND_METADATA, pb::SCHEDULER, 0),
                     Payload::Shared(metadata_.For(cluster_, rec->role)))
      .IgnoreError();
}

uint64_t SchedulerNode::QueuedOutputBytes() const {
  uint64_t total = 0;
  for (const auto& [conn, link] : node_of_) total += messenger_->transport().QueuedBytes(conn);
  return total;
}

void SchedulerNode::SendClusterEvent(const core::Event& e, pb::ClusterEventMessage::Kind kind, bool only_to_it) {
  pb::ClusterEventMessage ev;
  ev.set_kind(kind);
  // A state change names the state it changed to: several may be drained at once (NODE_TIMEOUT,
  // then CLUSTER_EXIT), and only the last carries how the job ended.
  ev.set_cluster_state(kind == pb::ClusterEventMessage::STATE_CHANGED ? e.state : cluster_.state());
  ev.set_node_id(e.node_id);
  ev.set_role(e.role);
  ev.set_rank_id(e.rank);
  ev.set_error_code(e.error_code);
  ev.set_message(e.message);
  ev.set_epoch(e.epoch ? e.epoch : cluster_.epoch());
  if (only_to_it) {
    FlushNotices();  // notices drained before it reach the node first
    auto c = conn_of_.find(e.node_id);
    if (c != conn_of_.end()) {
      messenger_->Notify(c->second, MakeMeta(pb::CLUSTER_EVENT, pb::SCHEDULER, 0), ToBuffer(ev)).IgnoreError();
    }
    return;
  }
  if (IsNodeNotice(e.kind)) {
    // Held until the drain's next other event or its end (FlushNotices): K notices in a
    // row cost each member one frame, the first notice with the others in `more`.
    if (has_notices_) {
      *notices_.add_more() = std::move(ev);
    } else {
      notices_ = std::move(ev);
      has_notices_ = true;
    }
    return;
  }
  Broadcast(MakeMeta(pb::CLUSTER_EVENT, pb::SCHEDULER, 0), ToBuffer(ev));
}

}  // namespace pscore::node
