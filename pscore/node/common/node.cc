#include "pscore/node/common/node.h"

#include <algorithm>
#include <random>
#include <set>

#include "pscore/core/cluster_manager.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

namespace {

core::SchedulerWatch::Config WatchConfig(const NodeOptions& o) {
  core::SchedulerWatch::Config c;
  c.silence_timeout = o.scheduler_timeout_ms > 0 ? Duration(std::chrono::milliseconds(o.scheduler_timeout_ms))
                                                 : Duration(o.heartbeat_timeout * 2);
  c.give_up_after = o.recovery_timeout;
  return c;
}

uint64_t FreshIncarnation() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return v == 0 ? 1 : v;
}

}  // namespace

Node::Node(NodeOptions options, comm::EventLoop* loop)
    : options_(std::move(options)),
      owned_loop_(loop == nullptr ? std::make_unique<comm::EventLoop>(RoleLabel(options_.role)) : nullptr),
      loop_(loop == nullptr ? owned_loop_.get() : loop),
      incarnation_(FreshIncarnation()),
      watch_(WatchConfig(options_), &clock_) {
  if (options_.node_id.empty()) {
    options_.node_id = RoleLabel(options_.role) + "-" + std::to_string(incarnation_ % 1000000007);
  }
  comm::Messenger::Handlers h;
  h.on_request = [this](ConnId c, Frame&& f) { OnFrame(c, std::move(f)); };
  h.on_close = [this](ConnId c, const Status& why) {
    unserved_.erase(c);
    OnPeerClosed(c, why);
  };
  h.stream = [this](ConnId c, const pb::MessageMeta& meta, uint64_t tail) { return OnRequestStream(c, meta, tail); };
  messenger_ = std::make_unique<comm::Messenger>(
      loop_, MakeTransportOptions(options_.max_message_bytes, options_.cluster_token, options_.accept, options_.tls), std::move(h));
}

Node::~Node() { Stop(); }

void Node::SetCallbacks(Callbacks cb) { callbacks_ = std::move(cb); }

Status Node::Start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return Status(Code::kFailedPrecondition, options_.node_id + " was stopped: a node starts once");
  }
  if (owned_loop_ && !owned_loop_->running()) PSCORE_RETURN_IF_ERROR(owned_loop_->Start());
  std::future<Status> registered = start_promise_.get_future();
  CHECK(!loop_->InLoopThread()) << "Node::Start on the loop thread";
  Status st(Code::kCancelled, "the event loop is stopping");
  loop_->RunAndWait([this, &st] { st = StartOnLoop(); });
  if (!st.ok()) return st;
  if (registered.wait_for(options_.connect_timeout + std::chrono::seconds(5)) != std::future_status::ready) {
    return Status(Code::kTimeout, "registration with the scheduler did not finish in time");
  }
  return registered.get();
}

// Loop thread: the role's start (servers listen), then dial the scheduler.
Status Node::StartOnLoop() {
  PSCORE_RETURN_IF_ERROR(StartRole());
  comm::ConnectOptions co;
  co.timeout = options_.connect_timeout;
  comm::TcpClient::Callbacks cb;
  cb.on_connected = [this](ConnId c) { OnSchedulerConnected(c); };
  cb.on_lost = [this](const Status& why) {
    LOG(WARNING) << options_.node_id << ": lost the scheduler link (" << why << "); reconnecting";
    registered_ = false;
  };
  cb.on_failed = [this](const Status& why) { OnSchedulerFailed(why); };
  scheduler_ = std::make_unique<comm::TcpClient>(&messenger_->transport(), options_.scheduler_host,
                                                 options_.scheduler_port, co, /*reconnect=*/true, cb);
  scheduler_->Start();
  stop_hook_ = loop_->AddStopHook([this] { CloseOnLoop(); });
  return Status::Ok();
}

Status Node::Stopped() const { return Status(Code::kCancelled, options_.node_id + " stopped"); }

// Loop thread: closes what the node owns on the loop (also run as the loop's stop hook).
void Node::CloseOnLoop() {
  closed_ = true;
  auto parked = std::move(parked_calls_);
  parked_calls_.clear();
  for (auto& [serial, call] : parked) call->done(Stopped(), call->reissued);
  if (heartbeat_timer_ != 0) loop_->CancelTimer(heartbeat_timer_);
  heartbeat_timer_ = 0;
  if (watch_timer_ != 0) loop_->CancelTimer(watch_timer_);
  watch_timer_ = 0;
  if (register_retry_timer_ != 0) loop_->CancelTimer(register_retry_timer_);
  register_retry_timer_ = 0;
  for (auto& [conn, timer] : leave_timers_) loop_->CancelTimer(timer);
  leave_timers_.clear();
  scheduler_.reset();
  StopRole();
  messenger_->Shutdown();
}

void Node::OnSchedulerConnected(ConnId conn) {
  VLOG(1) << options_.node_id << ": connected to the scheduler (conn " << conn << ")";
  Register();
}

void Node::OnSchedulerFailed(const Status& why) {
  Status st(Code::kUnavailable, options_.node_id + " cannot reach the scheduler at " +
                                    scheduler_->target() + ": " + why.message());
  LOG(ERROR) << st;
  if (!start_done_) {
    start_done_ = true;
    start_promise_.set_value(st);
  }
  Terminate(st);
}

void Node::Register() {
  if (registering_ || scheduler_ == nullptr || !scheduler_->connected()) return;
  registering_ = true;
  pb::RegisterMessage msg;
  msg.set_ip(options_.host);
  msg.set_port(listen_port_);
  msg.set_node_id(options_.node_id);
  msg.set_role(options_.role);
  msg.set_incarnation(incarnation_);
  msg.set_protocol_version(kProtocolVersion);
  msg.set_requested_rank(rank_ >= 0 ? rank_ : options_.rank);
  msg.set_host_name(options_.host_name);
  for (auto& d : options_.devices) *msg.add_devices() = d;
  messenger_->Call(scheduler_->conn(), MakeMeta(pb::REGISTER, options_.role, rank_), ToBuffer(msg),
                   options_.request_timeout, [this](Result<Frame> r) {
    registering_ = false;
    pb::RegisterRespMessage resp;
    Status st = r.ok() ? ParsePayload(*r, &resp) : r.status();
    if (!st.ok()) {
      if (st.code() == Code::kUnavailable) return;  // the link is lost: it registers again when back
      if (st.code() == Code::kTimeout) return RetryRegister(st);
      LOG(ERROR) << options_.node_id << ": registration refused: " << st;
      if (!start_done_) {
        start_done_ = true;
        start_promise_.set_value(st);
      }
      Terminate(st);
      return;
    }
    registered_ = true;
    register_backoff_ = Duration::zero();
    SchedulerAnswered();
    if (session_id_ != 0 && resp.session_id() != session_id_) {
      LOG(WARNING) << RoleLabel(options_.role) << " " << options_.node_id << ": the scheduler opened a new session ("
                   << session_id_ << " -> " << resp.session_id() << "): the state of the old one is gone";
    }
    session_id_ = resp.session_id();
    rank_ = resp.rank_id();
    LOG(INFO) << RoleLabel(options_.role) << " " << options_.node_id << " registered as rank " << rank_;
    PublishSnapshot();
    ReissueParked();
    if (heartbeat_timer_ == 0) {
      heartbeat_timer_ = loop_->AddTimer(options_.heartbeat_interval, options_.heartbeat_interval,
                                         [this] { Heartbeat(); });
    }
    if (watch_timer_ == 0 && !closed_) {
      watch_.Start();
      // Eight checks per silence timeout: a silence is reported at most 1/8 late.
      const Duration period = std::max<Duration>(watch_.config().silence_timeout / 8, std::chrono::milliseconds(5));
      watch_timer_ = loop_->AddTimer(period, period, [this] { WatchScheduler(); });
    }
    if (!start_done_) {
      start_done_ = true;
      start_promise_.set_value(Status::Ok());
    }
  });
}

// A REGISTER unanswered within request_timeout while the link stays up (a scheduler stalled
// that long) is sent again, after a backoff doubling from 100 ms to 5 s; the scheduler takes
// a repeat from the same incarnation as a retry. A lost link registers again on reconnect.
void Node::RetryRegister(const Status& why) {
  if (closed_ || registered_ || register_retry_timer_ != 0) return;
  constexpr Duration kFirst = std::chrono::milliseconds(100);
  constexpr Duration kMax = std::chrono::seconds(5);
  register_backoff_ = register_backoff_ == Duration::zero() ? kFirst : std::min(register_backoff_ * 2, kMax);
  LOG(WARNING) << RoleLabel(options_.role) << " " << options_.node_id << ": registration not answered (" << why
               << "); sending it again in " << ToMillis(register_backoff_) << " ms";
  register_retry_timer_ = loop_->AddTimer(register_backoff_, Duration::zero(), [this] {
    register_retry_timer_ = 0;
    if (!registered_) Register();
  });
}

pb::MessageMeta Node::SchedulerMeta(pb::NodeCommand cmd) const {
  pb::MessageMeta meta = MakeMeta(cmd, options_.role, rank_);
  meta.set_session_id(session_id_);
  return meta;
}

void Node::OnStaleSession(uint64_t carried, const Status& why) {
  if (closed_ || carried != session_id_) return;
  LOG(WARNING) << RoleLabel(options_.role) << " " << options_.node_id << ": " << why << "; registering again";
  registered_ = false;
  Register();
}

void Node::Heartbeat() {
  if (!registered_ || scheduler_ == nullptr || !scheduler_->connected()) return;
  pb::HeartbeatMessage msg;
  msg.set_node_id(options_.node_id);
  msg.set_known_epoch(epoch_);
  msg.set_incarnation(incarnation_);
  msg.set_node_state(state_ == pb::CLUSTER_READY ? pb::NODE_READY : pb::NODE_STARTING);
  messenger_->Call(scheduler_->conn(), SchedulerMeta(pb::HEARTBEAT), ToBuffer(msg),
                   options_.heartbeat_interval * 3, [this, session = session_id_](Result<Frame> r) {
    const Code code = r.ok() ? Code::kOk : r.status().code();
    if (code == Code::kOk || code == Code::kNotFound || code == Code::kAborted || code == Code::kFailedPrecondition) {
      SchedulerAnswered();
    }
    if (!r.ok()) {
      // kAborted: this process is in error at the scheduler, or another incarnation holds
      // its node id; it stays so until reset (the beat still counts as alive).
      if (code == Code::kAborted) {
        LOG_EVERY_N(ERROR, 20) << options_.node_id << ": heartbeat refused: " << r.status();
      }
      if (core::IsStaleSession(r.status())) return OnStaleSession(session, r.status());
      if (code == Code::kNotFound || code == Code::kFailedPrecondition) {
        LOG(WARNING) << options_.node_id << ": the scheduler does not know us (" << r.status()
                     << "); registering again";
        registered_ = false;
        Register();
      }
      return;
    }
    pb::HeartbeatRespMessage resp;
    if (!ParsePayload(*r, &resp).ok()) return;
    if (resp.has_metadata()) ApplyMetadata(resp.metadata());  // a scheduler that still inlines it
    // A worker whose metadata omits the workers learns a new rank (ranks made dense) here.
    if (options_.role == pb::WORKER && metadata_.omitted_workers() > 0 && resp.rank_id() != rank_ &&
        resp.rank_id() >= 0 && resp.rank_id() < core::kMaxRoleTotal) {
      LOG(INFO) << options_.node_id << ": rank " << rank_ << " -> " << resp.rank_id();
      rank_ = resp.rank_id();
      metadata_.set_rank_id(rank_);
      PublishSnapshot();
    }
    if (resp.epoch() > epoch_ && resp.cluster_state() != pb::ClUSTER_STARTING) {
      // We missed a membership change: fetch it. Its state comes with the metadata, so
      // nothing here acts on a state whose membership we do not have yet.
      FetchMetadata(resp.epoch());
      return;
    }
    ApplyState(resp.cluster_state());
  });
}

// One fetch in flight at a time. An answer older than the newest epoch a heartbeat showed
// meanwhile (the membership changed again mid-fetch) is applied and fetched again, as long
// as each answer moves us forward; a failed fetch is retried by the next heartbeat.
void Node::FetchMetadata(uint64_t epoch) {
  metadata_wanted_ = std::max(metadata_wanted_, epoch);
  if (metadata_fetching_ || closed_ || scheduler_ == nullptr || !scheduler_->connected()) return;
  metadata_fetching_ = true;
  messenger_->Call(scheduler_->conn(), SchedulerMeta(pb::FETCH_METADATA), nullptr,
                   options_.heartbeat_interval * 3, [this, session = session_id_](Result<Frame> r) {
    metadata_fetching_ = false;
    if (closed_) return;
    if (core::IsStaleSession(r.status())) return OnStaleSession(session, r.status());
    pb::SendMetadataMessage md;
    if (!r.ok() || !ParsePayload(*r, &md).ok()) {
      VLOG(1) << options_.node_id << ": metadata fetch failed: " << r.status();
      return;
    }
    const uint64_t before = epoch_;
    ApplyMetadata(std::move(md));
    if (epoch_ > before && epoch_ < metadata_wanted_) FetchMetadata(metadata_wanted_);
  });
}

// Loop thread: any answer or push from the scheduler shows it runs.
void Node::SchedulerAnswered() {
  const std::optional<Duration> silence = watch_.Answered();
  if (!silence || scheduler_ == nullptr) return;
  LOG(WARNING) << RoleLabel(options_.role) << " " << options_.node_id << ": the scheduler at "
               << scheduler_->target() << " answers again after " << ToMillis(*silence) << " ms of silence";
}

// Loop thread, on watch_timer_: the data plane runs on while the scheduler is silent; the
// link is redialed, and past the recovery timeout the node gives up.
void Node::WatchScheduler() {
  if (closed_ || scheduler_ == nullptr) return;
  FailParked(/*all=*/false, "");
  const core::SchedulerWatch::Verdict verdict = watch_.Check();
  const std::string who = RoleLabel(options_.role) + " " + options_.node_id;
  const int64_t silent_ms = ToMillis(watch_.since_answer());
  switch (verdict) {
    case core::SchedulerWatch::Verdict::kAlive:
      return;
    case core::SchedulerWatch::Verdict::kGiveUp: {
      Status st(Code::kUnavailable, "gave up on the scheduler at " + scheduler_->target() + ": no answer for " +
                                        std::to_string(silent_ms) + " ms (recovery timeout " +
                                        std::to_string(ToMillis(watch_.config().give_up_after)) + " ms)");
      LOG(ERROR) << who << ": " << st;
      Terminate(st);
      return;
    }
    case core::SchedulerWatch::Verdict::kSilent:
      LOG(WARNING) << who << ": the scheduler at " << scheduler_->target() << " has not answered for " << silent_ms
                   << " ms; serving on and redialing it (giving up after "
                   << ToMillis(watch_.config().give_up_after) << " ms)";
      [[fallthrough]];
    case core::SchedulerWatch::Verdict::kRedial:
      // A stopped scheduler keeps the socket open: only a fresh link shows it is back.
      if (scheduler_->connected()) {
        VLOG(1) << who << ": closing the silent scheduler link (conn " << scheduler_->conn() << ")";
        messenger_->transport().Close(scheduler_->conn(),
                                      Status(Code::kTimeout, "scheduler silent for " + std::to_string(silent_ms) + " ms"));
      }
      return;
  }
}

void Node::OnFrame(ConnId conn, Frame&& frame) {
  if (scheduler_ != nullptr && conn == scheduler_->conn()) {
    SchedulerAnswered();
    HandleSchedulerPush(conn, std::move(frame));
  } else {
    OnPeerRequest(conn, std::move(frame));
  }
}

void Node::InjectForTest(ConnId conn, Frame&& frame, bool from_scheduler) {
  loop_->RunAndWait([&] {
    if (from_scheduler) {
      HandleSchedulerPush(conn, std::move(frame));
    } else {
      TrustPeerForTest(conn);
      OnPeerRequest(conn, std::move(frame));
    }
  });
}

void Node::OnPeerRequest(ConnId conn, Frame&& frame) {
  const std::string what = UnservedCommandName(frame.meta.cmd());
  LOG_FIRST_N(WARNING, 10) << options_.node_id << ": conn " << conn << " sent " << what << ", which a "
                           << RoleLabel(options_.role) << " does not serve";
  messenger_->Reply(conn, frame.meta, Status(Code::kInvalidArgument, "a " + RoleLabel(options_.role) +
                                                                        " does not serve " + what))
      .IgnoreError();
  if (++unserved_[conn] >= kMaxUnservedCommands) {
    messenger_->transport().CloseAfterFlush(conn, Status(Code::kProtocol, std::to_string(kMaxUnservedCommands) + " commands a " +
                                                                    RoleLabel(options_.role) + " does not serve"));
  }
}

void Node::HandleSchedulerPush(ConnId conn, Frame&& frame) {
  switch (frame.meta.cmd()) {
    case pb::SEND_METADATA: {
      pb::SendMetadataMessage md;
      if (ParsePayload(frame, &md).ok()) ApplyMetadata(std::move(md));
      break;
    }
    case pb::CLUSTER_EVENT: {
      pb::ClusterEventMessage ev;
      if (!ParsePayload(frame, &ev).ok()) break;
      // Notices coalesced by the scheduler: each handled in order as if sent alone.
      google::protobuf::RepeatedPtrField<pb::ClusterEventMessage> more;
      more.Swap(ev.mutable_more());
      HandleClusterEvent(ev);
      for (pb::ClusterEventMessage& m : more) {
        m.clear_more();  // one level only
        HandleClusterEvent(m);
      }
      break;
    }
    case pb::SEND_EVENT: {
      pb::EventRespMessage ev;
      if (ParsePayload(frame, &ev).ok() && callbacks_.on_user_event) {
        callbacks_.on_user_event(ev.node_id(), ev.event(), ev.payload());
      }
      break;
    }
    case pb::SCALE_OUT: {
      pb::ScaleOutMessage msg;
      if (!ParsePayload(frame, &msg).ok()) break;
      if (msg.epoch() < epoch_) {
        LOG(WARNING) << options_.node_id << ": ignored stale SCALE_OUT of epoch " << msg.epoch();
        break;
      }
      LOG(INFO) << options_.node_id << ": scale-out to " << msg.worker_num() << " workers, "
                << msg.server_num() << " servers";
      ApplyState(pb::CLUSTER_SCALE_OUT);
      if (callbacks_.on_scale_out) callbacks_.on_scale_out(msg);
      break;
    }
    case pb::SCALE_IN: {
      pb::ScaleInMessage msg;
      if (!ParsePayload(frame, &msg).ok()) break;
      if (msg.epoch() < epoch_ || msg.epoch() <= scale_in_epoch_) {
        LOG(WARNING) << options_.node_id << ": ignored stale SCALE_IN of epoch " << msg.epoch();
        break;
      }
      LOG(INFO) << options_.node_id << ": scale-in to " << msg.worker_num() << " workers, " << msg.server_num()
                << " servers" << (msg.is_node_scale_in() ? "; this node leaves" : "");
      scale_in_epoch_ = msg.epoch();
      scale_in_handed_over_ = false;
      ApplyState(pb::CLUSTER_SCALE_IN);
      if (callbacks_.on_scale_in) callbacks_.on_scale_in(msg);
      uint64_t epoch = msg.epoch();
      OnScaleInStart(msg, [this, epoch] {
        loop_->Run([this, epoch] {
          if (scale_in_epoch_ != epoch) return;
          scale_in_handed_over_ = true;
          SendScaleDone(pb::SCALE_IN_DONE, epoch_ > epoch ? epoch_ : epoch);
        });
      });
      break;
    }
    case pb::TERMINATE: {
      pb::ClusterEventMessage end;  // how the job ended; empty: it finished
      if (!ParsePayload(frame, &end).ok()) end.Clear();
      LOG(INFO) << options_.node_id << ": terminated by the scheduler";
      TerminateAsTold(end);
      break;
    }
    default:
      LOG(WARNING) << options_.node_id << ": unexpected " << pb::NodeCommand_Name(frame.meta.cmd())
                   << " from the scheduler";
  }
}

void Node::HandleClusterEvent(const pb::ClusterEventMessage& ev) {
  if (ev.kind() == pb::ClusterEventMessage::STATE_CHANGED) {
    if (ev.cluster_state() == pb::CLUSTER_EXIT) TerminateAsTold(ev);
    if (ev.cluster_state() == pb::CLUSTER_NEW_INSTANCE && callbacks_.on_new_instance) {
      callbacks_.on_new_instance();
    }
    ApplyState(ev.cluster_state());
  }
  OnClusterEvent(ev);
  if (callbacks_.on_cluster_event) callbacks_.on_cluster_event(ev);
}

void Node::ApplyMetadata(pb::SendMetadataMessage md) {
  if (md.epoch() < epoch_) {
    LOG(WARNING) << options_.node_id << ": ignored stale metadata of epoch " << md.epoch() << " < " << epoch_;
    return;
  }
  // The totals size per-server work on this node (a worker groups every push by server):
  // a count no scheduler would send is refused here, not trusted.
  if (md.worker_num() < 0 || md.worker_num() > core::kMaxRoleTotal || md.server_num() < 0 ||
      md.server_num() > core::kMaxRoleTotal || md.omitted_workers() < 0 ||
      md.omitted_workers() > core::kMaxRoleTotal || md.worker_ids_size() > core::kMaxRoleTotal ||
      md.worker_ids_size() != md.worker_ranks_size()) {
    LOG(WARNING) << options_.node_id << ": ignored metadata of epoch " << md.epoch() << " with impossible totals: "
                 << md.worker_num() << " workers, " << md.server_num() << " servers, "
                 << md.worker_ids_size() << " worker ids with " << md.worker_ranks_size() << " ranks";
    return;
  }
  // Every member gets the same bytes: our rank is that of our own entry, found by node id
  // (the message's rank_id is what a scheduler that sets it per member said). A worker's
  // view of a large membership has no worker entries: it keeps the rank it was told (at
  // registration, then in each heartbeat answer).
  const auto& own = options_.role == pb::SERVER ? md.servers_meta() : md.workers_meta();
  if (options_.role == pb::WORKER && md.omitted_workers() > 0) md.set_rank_id(rank_);
  for (const pb::ServersMeta& m : own) {
    if (m.node_id() != options_.node_id) continue;
    md.set_rank_id(m.rank_id());
    break;
  }
  epoch_ = md.epoch();
  metadata_ = md;
  rank_ = md.rank_id();
  std::map<int, std::string> addrs;
  for (const pb::ServersMeta& s : md.servers_meta()) {
    addrs[s.rank_id()] = s.ip() + ":" + std::to_string(s.port());
  }
  // Links to servers no longer in the membership are closed once their requests had
  // time to finish (a leaving server usually exits first and closes them itself).
  std::set<std::string> current;
  std::map<std::string, std::string> down;  // address -> node id of a server marked down
  for (const pb::ServersMeta& s : md.servers_meta()) {
    // Replicated ranges (docs/reliability.md): a server marked down is read and written no
    // more, so a dial to it ends at once and its ranges' next replica is used. A resyncing
    // one is still dialled: its ranges' primaries forward pushes to it.
    const std::string addr = s.ip() + ":" + std::to_string(s.port());
    if (md.replicas() >= 2 && !s.is_alive() && !s.resyncing()) {
      down[addr] = s.node_id();
      continue;
    }
    current.insert(addr);
  }
  // Its link is closed at once, too: a silent server (stopped, cut off) never closes it
  // itself, and requests in flight on it would wait out request_timeout. They fail
  // kUnavailable now and their callers send them to the range's new primary (a push keeps
  // its id: a late apply on the old primary is deduplicated wherever it is forwarded).
  for (const auto& [addr, id] : down) {
    if (server_conn_.count(addr) == 0) continue;
    CloseServerLink(addr, Status(Code::kUnavailable, "server " + id + " (" + addr +
                                                         ") marked down by the scheduler (epoch " +
                                                         std::to_string(md.epoch()) + ")"));
  }
  for (auto& [addr, conn] : server_conn_) {
    if (current.count(addr) || leave_timers_.count(conn)) continue;
    ConnId c = conn;
    // Cancelled by CloseOnLoop: on a shared loop the timer may outlive the node.
    leave_timers_[c] = loop_->AddTimer(options_.request_timeout, Duration::zero(), [this, c] {
      leave_timers_.erase(c);
      messenger_->transport().Close(c, Status(Code::kCancelled, "server left the membership"));
    });
  }
  server_addr_ = std::move(addrs);
  FailDialsNotIn(current);
  PublishSnapshot();
  if (callbacks_.on_metadata) callbacks_.on_metadata(md);
  ApplyState(md.cluster_state());
  OnMetadataApplied();
  MaybeFinishScaleOut(md);
  // A republish during scale-in restarts the done round at the new epoch.
  if (md.cluster_state() == pb::CLUSTER_SCALE_IN && scale_in_handed_over_ && md.epoch() > scale_in_epoch_) {
    SendScaleDone(pb::SCALE_IN_DONE, md.epoch());
  }
}

// Scale-out: once the metadata holds every new node, the role moves what it must and
// answers SCALE_OUT_DONE with that metadata's epoch (once per epoch).
void Node::MaybeFinishScaleOut(const pb::SendMetadataMessage& md) {
  if (md.cluster_state() != pb::CLUSTER_SCALE_OUT || md.epoch() <= scale_out_acked_epoch_) return;
  if (md.servers_meta_size() != md.server_num() ||
      md.workers_meta_size() + md.omitted_workers() != md.worker_num()) {
    return;
  }
  scale_out_acked_epoch_ = md.epoch();
  uint64_t epoch = md.epoch();
  OnScaleOutReady(md, [this, epoch] {
    loop_->Run([this, epoch] {
      if (epoch_ == epoch) SendScaleDone(pb::SCALE_OUT_DONE, epoch);
    });
  });
}

void Node::SendScaleDone(pb::NodeCommand cmd, uint64_t epoch) {
  if (scheduler_ == nullptr || !scheduler_->connected()) return;
  BufferPtr payload;
  if (cmd == pb::SCALE_OUT_DONE) {
    pb::ScaleOutDoneMessage msg;
    msg.set_node_id(options_.node_id);
    msg.set_epoch(epoch);
    payload = ToBuffer(msg);
  } else {
    pb::ScaleInDoneMessage msg;
    msg.set_node_id(options_.node_id);
    msg.set_epoch(epoch);
    payload = ToBuffer(msg);
  }
  VLOG(1) << options_.node_id << ": " << pb::NodeCommand_Name(cmd) << " epoch " << epoch;
  messenger_->Call(scheduler_->conn(), SchedulerMeta(cmd), payload, options_.request_timeout,
                   [this, cmd, epoch](Result<Frame> r) {
                     if (!r.ok()) {
                       LOG(WARNING) << options_.node_id << ": " << pb::NodeCommand_Name(cmd) << " of epoch "
                                    << epoch << " refused: " << r.status();
                     }
                   });
}

void Node::ApplyState(pb::ClusterState state) {
  if (state == state_) return;
  state_ = state;
  if (state != pb::CLUSTER_SCALE_IN) scale_in_epoch_ = 0;
  PublishSnapshot();
  OnStateApplied(state);
  if (callbacks_.on_state) callbacks_.on_state(state);
  if (state == pb::CLUSTER_EXIT) Terminate(Status::Ok());
}

// The scheduler ends the job; error_code kAborted says it failed, and the message why
// (bounded: it is shown in one log line).
void Node::TerminateAsTold(const pb::ClusterEventMessage& end) {
  if (end.error_code() != static_cast<int>(Code::kAborted)) {
    Terminate(Status::Ok());
    return;
  }
  constexpr size_t kMaxReason = 4096;
  std::string why = end.message().substr(0, kMaxReason);
  if (why.rfind("job failed", 0) != 0) why = "job failed: " + why;
  Status failed(Code::kAborted, why);
  if (Terminate(failed)) LOG(ERROR) << RoleLabel(options_.role) << " " << options_.node_id << ": " << why;
}

void Node::PublishSnapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  rank_snapshot_ = rank_;
  state_snapshot_ = state_;
  epoch_snapshot_ = epoch_;
  metadata_snapshot_ = metadata_;
  if (state_ == pb::CLUSTER_READY) ready_seen_ = true;
  cv_.notify_all();
}

bool Node::Terminate(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (terminated_) return false;
    terminated_ = true;
    termination_ = why;
    cv_.notify_all();
  }
  if (heartbeat_timer_ != 0) loop_->CancelTimer(heartbeat_timer_);
  heartbeat_timer_ = 0;
  if (watch_timer_ != 0) loop_->CancelTimer(watch_timer_);
  watch_timer_ = 0;
  FailParked(/*all=*/true, why.ok() ? "the job ended" : why.message());
  if (!why.ok() && callbacks_.on_fatal) callbacks_.on_fatal(why);
  return true;
}

int Node::rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rank_snapshot_;
}

pb::ClusterState Node::cluster_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_snapshot_;
}

uint64_t Node::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_snapshot_;
}

pb::SendMetadataMessage Node::metadata() const {
  std::lock_guard<std::mutex> lock(mu_);
  return metadata_snapshot_;
}

std::vector<std::string> Node::NodeIds(pb::NodeRole role) const {
  std::lock_guard<std::mutex> lock(mu_);
  const pb::SendMetadataMessage& md = metadata_snapshot_;
  const auto& list = role == pb::SERVER ? md.servers_meta() : md.workers_meta();
  std::vector<std::pair<int, std::string>> ranked;
  for (const pb::ServersMeta& m : list) ranked.emplace_back(m.rank_id(), m.node_id());
  if (role == pb::WORKER) {  // a server's view: ids and ranks only (ApplyMetadata checked the counts)
    for (int i = 0; i < md.worker_ids_size(); ++i) ranked.emplace_back(md.worker_ranks(i), md.worker_ids(i));
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<std::string> out;
  for (auto& [r, id] : ranked) out.push_back(id);
  return out;
}

void Node::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    if (!terminated_) {
      terminated_ = true;
      termination_ = Status(Code::kCancelled, "node stopped");
    }
    cv_.notify_all();
  }
  OnStopCalled();
  if (owned_loop_) {
    owned_loop_->Stop().IgnoreError();  // The stop hook closes everything.
  } else if (loop_->running() && !loop_->InLoopThread()) {
    loop_->RunAndWait([this] {
      if (stop_hook_ != 0) loop_->RemoveStopHook(stop_hook_);
      CloseOnLoop();
    });
  }
}

}  // namespace pscore::node
