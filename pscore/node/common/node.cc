// Node: lifecycle (start, close, stop), frame dispatch, the snapshot other threads read,
// and termination. Registration is in node_registration.cc, metadata and scaling in
// node_metadata.cc, control calls in node_control_calls.cc, the coordination client in
// node_client.cc, server links in peer_links.cc.
#include "pscore/node/common/node.h"

#include <algorithm>
#include <random>

#include "pscore/node/common/peer_links.h"
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
  messenger_->set_poll_spin(options_.poll_spin);
  links_ = std::make_unique<PeerLinks>(options_, loop_, messenger_.get(), [this] { return rank_; });
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
  if (registered.wait_for(options_.connect_timeout + options_.join_timeout + std::chrono::seconds(5)) !=
      std::future_status::ready) {
    return Status(Code::kTimeout, "registration with the scheduler did not finish in time");
  }
  return registered.get();
}

// Loop thread: the role's start (servers listen), then dial the scheduler.
Status Node::StartOnLoop() {
  DCHECK(loop_->InLoopThread());
  PSCORE_RETURN_IF_ERROR(StartRole());
  comm::ConnectOptions co;
  co.timeout = options_.connect_timeout;
  comm::TcpClient::Callbacks cb;
  cb.on_connected = [this](ConnId c) { OnSchedulerConnected(c); };
  cb.on_lost = [this](const Status& why) {
    LOG(WARNING) << options_.node_id << ": lost the scheduler link (" << why << "); reconnecting";
    registered_ = false;
    CloseDirectCalls("lost the scheduler link");
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
  DCHECK(loop_->InLoopThread());
  closed_ = true;
  direct_calls_.Stop();
  auto parked = std::move(parked_calls_);
  parked_calls_.clear();
  for (auto& [serial, call] : parked) call->done(Stopped(), call->reissued);
  if (heartbeat_timer_ != 0) loop_->CancelTimer(heartbeat_timer_);
  heartbeat_timer_ = 0;
  if (watch_timer_ != 0) loop_->CancelTimer(watch_timer_);
  watch_timer_ = 0;
  if (register_retry_timer_ != 0) loop_->CancelTimer(register_retry_timer_);
  register_retry_timer_ = 0;
  links_->CancelTimers();
  scheduler_.reset();
  StopRole();
  messenger_->Shutdown();
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
  direct_calls_.Stop();  // a caller blocked on the direct way ends now, as any call after Stop
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

void Node::OnFrame(ConnId conn, Frame&& frame) {
  DCHECK(loop_->InLoopThread());
  if (scheduler_ != nullptr && conn == scheduler_->conn()) {
    SchedulerAnswered();
    HandleSchedulerPush(conn, std::move(frame));
  } else {
    OnPeerRequest(conn, std::move(frame));
  }
}

void Node::OnPeerRequest(ConnId conn, Frame&& frame) {
  DCHECK(loop_->InLoopThread());
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

// Loop thread: what other threads read (rank(), metadata(), WaitForReady...).
void Node::PublishSnapshot() {
  DCHECK(loop_->InLoopThread());
  std::lock_guard<std::mutex> lock(mu_);
  rank_snapshot_ = rank_;
  session_snapshot_ = session_id_;
  state_snapshot_ = scale_.state();
  epoch_snapshot_ = scale_.epoch();
  metadata_snapshot_ = metadata_;
  if (scale_.state() == pb::CLUSTER_READY) ready_seen_ = true;
  cv_.notify_all();
}

bool Node::Terminate(const Status& why) {
  DCHECK(loop_->InLoopThread());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (terminated_) return false;
    terminated_ = true;
    termination_ = why;
    cv_.notify_all();
  }
  ended_ = true;
  if (heartbeat_timer_ != 0) loop_->CancelTimer(heartbeat_timer_);
  heartbeat_timer_ = 0;
  if (watch_timer_ != 0) loop_->CancelTimer(watch_timer_);
  watch_timer_ = 0;
  FailParked(/*all=*/true, why.ok() ? "the job ended" : why.message());
  if (!why.ok() && callbacks_.on_fatal) callbacks_.on_fatal(why);
  return true;
}

// The scheduler ends the job; error_code kAborted says it failed, and the message why
// (bounded: it is shown in one log line). One last heartbeat acknowledges the end: a
// scheduler that had not heard from this member lately does not know the notice arrived,
// and waits for a word from it (SchedulerNode::AwaitUntold) before it exits.
void Node::TerminateAsTold(const pb::ClusterEventMessage& end) {
  DCHECK(loop_->InLoopThread());
  Status outcome = Status::Ok();
  if (end.error_code() == static_cast<int>(Code::kAborted)) {
    constexpr size_t kMaxReason = 4096;
    std::string why = end.message().substr(0, kMaxReason);
    if (why.rfind("job failed", 0) != 0) why = "job failed: " + why;
    outcome = Status(Code::kAborted, why);
  }
  if (!Terminate(outcome)) return;
  if (!outcome.ok()) LOG(ERROR) << RoleLabel(options_.role) << " " << options_.node_id << ": " << outcome.message();
  Heartbeat();
}

int Node::rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rank_snapshot_;
}

uint64_t Node::session() const {
  std::lock_guard<std::mutex> lock(mu_);
  return session_snapshot_;
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

int Node::server_num() const {
  std::lock_guard<std::mutex> lock(mu_);
  return metadata_snapshot_.server_num();  // read in place: no copy of the entries
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

std::string Node::ServerAddress(int rank) const { return links_->Address(rank); }

bool Node::IsServerAddress(const std::string& addr) const { return links_->IsServerAddress(addr); }

void Node::WithServerConn(int rank, std::function<void(Result<ConnId>)> cb, Duration connect_timeout) {
  DCHECK(loop_->InLoopThread());
  if (closed()) return cb(Stopped());  // a shared loop runs on after Stop
  links_->Link(rank, std::move(cb), connect_timeout);
}

void Node::FailDialsNotIn(const std::set<std::string>& current) { links_->FailDialsNotIn(current); }

bool Node::HasServerLink(const std::string& addr) const { return links_->Linked(addr); }

void Node::CloseServerLink(const std::string& addr, const Status& why) { links_->Close(addr, why); }

}  // namespace pscore::node
