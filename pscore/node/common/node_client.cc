// Node, second half: blocking client calls to the scheduler (ready, finish,
// coordination services) and links to servers by rank.
#include "pscore/core/cluster_manager.h"
#include "pscore/node/common/node.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

namespace {

// Control calls a member re-issues after it lost the scheduler: each is idempotent when
// sent again (barriers name their round, KV SET/DELETE end in the same state, FINISH is
// counted once per node).
bool Reissuable(pb::NodeCommand cmd) {
  return cmd == pb::BARRIER || cmd == pb::KV_REQUEST || cmd == pb::FINISH;
}

}  // namespace

void Node::CallSchedulerAsync(pb::NodeCommand cmd, const google::protobuf::MessageLite& msg, Duration timeout,
                              std::function<void(Result<Frame>)> done) {
  CallSchedulerReissuable(cmd, msg, timeout, [done = std::move(done)](Result<Frame> r, bool) { done(std::move(r)); });
}

void Node::CallSchedulerReissuable(pb::NodeCommand cmd, const google::protobuf::MessageLite& msg, Duration timeout,
                                   std::function<void(Result<Frame>, bool reissued)> done) {
  auto call = std::make_shared<ControlCall>();
  call->cmd = cmd;
  call->payload = ToBuffer(msg);
  call->timeout = timeout;
  call->done = std::move(done);
  call->reissuable = Reissuable(cmd);
  bool queued = loop_->Run([this, call] { SendControlCall(call); });
  if (!queued) call->done(Stopped(), false);
}

// Loop thread.
void Node::SendControlCall(std::shared_ptr<ControlCall> call) {
  if (closed()) return call->done(Stopped(), call->reissued);  // a shared loop runs on after Stop
  const bool linked = scheduler_ != nullptr && scheduler_->connected();
  if (!linked || (call->reissuable && !registered_)) {
    Status why(Code::kUnavailable, "not connected to the scheduler");
    if (ParkControlCall(call, why, clock_.Now(), 0)) return;
    return call->done(why, call->reissued);
  }
  const ConnId conn = scheduler_->conn();
  const TimePoint sent = clock_.Now();
  messenger_->Call(conn, SchedulerMeta(call->cmd), call->payload, call->timeout,
                   [this, call, sent, conn, session = session_id_](Result<Frame> r) {
                     if (core::IsStaleSession(r.status())) OnStaleSession(session, r.status());
                     if (!r.ok() && !closed() && ParkControlCall(call, r.status(), sent, conn)) return;
                     call->done(std::move(r), call->reissued);
                   });
}

// Loop thread. A call is parked when the scheduler link it used is lost (kUnavailable), its
// deadline passed while the scheduler answered nothing at all since it was sent (a stopped
// scheduler), or it was refused as made under a stale session (nothing was done; the node
// registers again). It is sent again at the next registration.
bool Node::ParkControlCall(const std::shared_ptr<ControlCall>& call, const Status& why, TimePoint sent,
                           ConnId conn) {
  if (!call->reissuable || scheduler_ == nullptr) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (terminated_) return false;
  }
  const bool lost = why.code() == Code::kUnavailable;
  const bool silent = why.code() == Code::kTimeout && watch_.since_answer() >= clock_.Now() - sent;
  const bool stale = core::IsStaleSession(why);
  if (!lost && !silent && !stale) return false;
  if (!call->lost_since) call->lost_since = clock_.Now();
  call->reissued = true;
  VLOG(1) << options_.node_id << ": " << pb::NodeCommand_Name(call->cmd) << " to the scheduler lost (" << why
          << "); re-issued once registered again";
  if (registered_ && scheduler_->connected() && (scheduler_->conn() != conn || stale)) {
    // Registered again already (on a new link, or in a new session): send it now.
    loop_->Run([this, call] { SendControlCall(call); });
    return true;
  }
  parked_calls_.emplace(++parked_serial_, call);
  return true;
}

// Loop thread, after a registration: every parked call goes out again.
void Node::ReissueParked() {
  if (parked_calls_.empty()) return;
  LOG(INFO) << RoleLabel(options_.role) << " " << options_.node_id << ": re-issuing " << parked_calls_.size()
            << " control call(s) to the scheduler at " << scheduler_->target();
  auto calls = std::move(parked_calls_);
  parked_calls_.clear();
  for (auto& [serial, call] : calls) SendControlCall(call);
}

// Loop thread.
void Node::FailParked(bool all, const std::string& why) {
  const TimePoint now = clock_.Now();
  const std::string target = scheduler_ != nullptr ? scheduler_->target()
                                                   : options_.scheduler_host + ":" +
                                                         std::to_string(options_.scheduler_port);
  for (auto it = parked_calls_.begin(); it != parked_calls_.end();) {
    std::shared_ptr<ControlCall> call = it->second;
    const Duration waited = now - *call->lost_since;
    if (!all && waited < options_.recovery_timeout) {
      ++it;
      continue;
    }
    it = parked_calls_.erase(it);
    call->done(Status(Code::kUnavailable, pb::NodeCommand_Name(call->cmd) + " to the scheduler at " + target +
                                              " failed: no scheduler for " + std::to_string(ToMillis(waited)) +
                                              " ms (recovery timeout " +
                                              std::to_string(ToMillis(options_.recovery_timeout)) + " ms)" +
                                              (why.empty() ? "" : "; " + why)),
               call->reissued);
  }
}

Result<Frame> Node::CallScheduler(pb::NodeCommand cmd, const google::protobuf::MessageLite& msg,
                                  Duration timeout) {
  CHECK(!loop_->OnRunningLoop()) << "blocking pscore call on the loop thread";
  auto promise = std::make_shared<std::promise<Result<Frame>>>();
  auto fut = promise->get_future();
  CallSchedulerAsync(cmd, msg, timeout, [promise](Result<Frame> r) { promise->set_value(std::move(r)); });
  // A re-issued call is always answered: by the scheduler, at the recovery timeout, or when
  // the node terminates or stops.
  if (Reissuable(cmd)) return fut.get();
  // The messenger enforces the deadline; the margin only guards against a stopped loop.
  if (fut.wait_for(timeout + std::chrono::seconds(5)) != std::future_status::ready) {
    return Status(Code::kTimeout, pb::NodeCommand_Name(cmd) + " to the scheduler: no answer");
  }
  return fut.get();
}

Status Node::WaitForReady(Duration timeout) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, timeout, [this] { return ready_seen_ || terminated_; })) {
      if (ready_seen_) return Status::Ok();
      return termination_.ok() ? Status(Code::kAborted, "the job ended before it was ready") : termination_;
    }
  }
  pb::AdminRequest req;
  req.set_op("status");
  Result<Frame> r = CallScheduler(pb::ADMIN, req, std::chrono::seconds(5));
  pb::AdminResponse resp;
  if (!r.ok() || !ParsePayload(*r, &resp).ok()) {
    return Status(Code::kTimeout, "cluster not ready after " + std::to_string(ToMillis(timeout)) +
                                      " ms (scheduler status unavailable)");
  }
  int missing_w = std::max(0, resp.worker_num() - resp.registered_workers());
  int missing_s = std::max(0, resp.server_num() - resp.registered_servers());
  return Status(Code::kTimeout, "cluster not ready after " + std::to_string(ToMillis(timeout)) +
                                    " ms: " + std::to_string(missing_w + missing_s) + " node(s) missing (" +
                                    std::to_string(missing_w) + " workers, " + std::to_string(missing_s) +
                                    " servers)");
}

Status Node::Finish(Duration timeout) {
  pb::FinishMessage msg;
  msg.set_node_id(options_.node_id);
  msg.set_timeout_ms(ToMillis(timeout));
  Result<Frame> r = CallScheduler(pb::FINISH, msg, timeout + std::chrono::seconds(2));
  return r.status();
}

Status Node::WaitForTermination(Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return terminated_; })) {
    return Status(Code::kTimeout, "the job did not end within " + std::to_string(ToMillis(timeout)) + " ms");
  }
  return termination_;
}

namespace {

pb::KvRequest KvRequestFor(pb::KvRequest::Op op, const std::string& key) {
  pb::KvRequest req;
  req.set_op(op);
  req.set_key(key);
  return req;
}

// The value of a GET or TRY_GET answer.
Result<std::string> KvValue(Result<Frame> r) {
  if (!r.ok()) return r.status();
  pb::KvResponse resp;
  PSCORE_RETURN_IF_ERROR(ParsePayload(*r, &resp));
  return std::move(*resp.mutable_value());
}

}  // namespace

Status Node::KvSet(const std::string& key, const std::string& value, bool overwrite) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto fut = promise->get_future();
  CHECK(!loop_->OnRunningLoop()) << "blocking pscore call on the loop thread";
  KvSetAsync(key, value, overwrite, [promise](Status st) { promise->set_value(std::move(st)); });
  return fut.get();  // answered by the messenger's deadline, a re-issue's end or Stop
}

Result<std::string> Node::KvGet(const std::string& key, Duration timeout) {
  pb::KvRequest req = KvRequestFor(pb::KvRequest::GET, key);
  req.set_timeout_ms(ToMillis(timeout));
  return KvValue(CallScheduler(pb::KV_REQUEST, req, timeout + std::chrono::seconds(2)));
}

Result<std::string> Node::KvTryGet(const std::string& key) {
  return KvValue(CallScheduler(pb::KV_REQUEST, KvRequestFor(pb::KvRequest::TRY_GET, key), options_.request_timeout));
}

void Node::KvSetAsync(const std::string& key, const std::string& value, bool overwrite,
                      std::function<void(Status)> done) {
  pb::KvRequest req = KvRequestFor(pb::KvRequest::SET, key);
  req.set_value(value);
  req.set_overwrite(overwrite);
  CallSchedulerReissuable(
      pb::KV_REQUEST, req, options_.request_timeout,
      [this, key, value, overwrite, done = std::move(done)](Result<Frame> r, bool reissued) {
        if (overwrite || !reissued || r.status().code() != Code::kAlreadyExists) return done(r.status());
        // A re-issued SET that must not overwrite may find the value its first send stored:
        // that is its own success, not a conflict.
        Status conflict = r.status();
        KvTryGetAsync(key, [value, conflict, done](Result<std::string> got) {
          done(got.ok() && *got == value ? Status::Ok() : conflict);
        });
      });
}

void Node::KvGetAsync(const std::string& key, Duration timeout, std::function<void(Result<std::string>)> done) {
  pb::KvRequest req = KvRequestFor(pb::KvRequest::GET, key);
  req.set_timeout_ms(ToMillis(timeout));
  CallSchedulerAsync(pb::KV_REQUEST, req, timeout + std::chrono::seconds(2),
                     [done = std::move(done)](Result<Frame> r) { done(KvValue(std::move(r))); });
}

void Node::KvTryGetAsync(const std::string& key, std::function<void(Result<std::string>)> done) {
  CallSchedulerAsync(pb::KV_REQUEST, KvRequestFor(pb::KvRequest::TRY_GET, key), options_.request_timeout,
                     [done = std::move(done)](Result<Frame> r) { done(KvValue(std::move(r))); });
}

Result<std::vector<std::pair<std::string, std::string>>> Node::KvList(const std::string& dir) {
  pb::KvRequest req;
  req.set_op(pb::KvRequest::LIST);
  req.set_key(dir);
  Result<Frame> r = CallScheduler(pb::KV_REQUEST, req, options_.request_timeout);
  if (!r.ok()) return r.status();
  pb::KvResponse resp;
  PSCORE_RETURN_IF_ERROR(ParsePayload(*r, &resp));
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& e : resp.entries()) out.emplace_back(e.key(), e.value());
  return out;
}

Status Node::KvDelete(const std::string& key) {
  pb::KvRequest req;
  req.set_op(pb::KvRequest::DELETE);
  req.set_key(key);
  return CallScheduler(pb::KV_REQUEST, req, options_.request_timeout).status();
}

namespace {

pb::BarrierRequest BarrierRequestFor(const std::string& id, Duration timeout, const std::string& node_id,
                                     const std::vector<std::string>& participants, uint64_t round) {
  pb::BarrierRequest req;
  req.set_round(round);
  req.set_id(id);
  req.set_timeout_ms(ToMillis(timeout));
  req.set_node_id(node_id);
  for (const auto& p : participants) req.add_participants(p);
  return req;
}

}  // namespace

uint64_t Node::NextBarrierRound(const std::string& id) {
  std::lock_guard<std::mutex> lock(rounds_mu_);
  return ++barrier_rounds_[id];
}

uint64_t Node::BarrierRound(const std::string& id) const {
  std::lock_guard<std::mutex> lock(rounds_mu_);
  auto it = barrier_rounds_.find(id);
  return it == barrier_rounds_.end() ? 0 : it->second;
}

Result<uint64_t> Node::ResumeBarrierRound(const std::string& id) {
  pb::BarrierRequest req;
  req.set_id(id);
  req.set_node_id(options_.node_id);
  req.set_query_round(true);
  Result<Frame> r = CallScheduler(pb::BARRIER, req, options_.request_timeout);
  if (!r.ok()) return r.status();
  pb::BarrierResponse resp;
  PSCORE_RETURN_IF_ERROR(ParsePayload(*r, &resp));
  std::lock_guard<std::mutex> lock(rounds_mu_);
  barrier_rounds_[id] = resp.generation();
  return static_cast<uint64_t>(resp.generation());
}

Status Node::Barrier(const std::string& id, Duration timeout, std::vector<std::string> participants) {
  pb::BarrierRequest req = BarrierRequestFor(id, timeout, options_.node_id, participants, NextBarrierRound(id));
  return CallScheduler(pb::BARRIER, req, timeout + std::chrono::seconds(2)).status();
}

void Node::BarrierAsync(const std::string& id, Duration timeout, std::vector<std::string> participants,
                        std::function<void(Status)> done) {
  pb::BarrierRequest req = BarrierRequestFor(id, timeout, options_.node_id, participants, NextBarrierRound(id));
  CallSchedulerAsync(pb::BARRIER, req, timeout + std::chrono::seconds(2),
                     [done = std::move(done)](Result<Frame> r) { done(r.status()); });
}

Status Node::CancelBarrier(const std::string& id) {
  pb::BarrierRequest req;
  req.set_id(id);
  req.set_cancel(true);
  req.set_node_id(options_.node_id);
  return CallScheduler(pb::BARRIER, req, options_.request_timeout).status();
}

Status Node::ReportError(int code, const std::string& message) {
  pb::ErrorReport req;
  req.set_node_id(options_.node_id);
  req.set_error_code(code);
  req.set_message(message);
  return CallScheduler(pb::REPORT_ERROR, req, options_.request_timeout).status();
}

Status Node::SendEvent(uint32_t event, const std::string& payload) {
  pb::EventMessage req;
  req.set_event(event);
  req.set_node_id(options_.node_id);
  req.set_payload(payload);
  return CallScheduler(pb::SEND_EVENT, req, options_.request_timeout).status();
}

std::string Node::ServerAddress(int rank) const {
  auto a = server_addr_.find(rank);
  return a == server_addr_.end() ? std::string() : a->second;
}

bool Node::IsServerAddress(const std::string& addr) const {
  for (auto& [rank, a] : server_addr_) {
    if (a == addr) return true;
  }
  return false;
}

void Node::WithServerConn(int rank, std::function<void(Result<ConnId>)> cb) {
  if (closed()) return cb(Stopped());  // a shared loop runs on after Stop
  auto a = server_addr_.find(rank);
  if (a == server_addr_.end()) {
    return cb(Status(Code::kNotFound, "no server of rank " + std::to_string(rank) + " in the metadata (epoch " +
                                          std::to_string(epoch_) + ")"));
  }
  const std::string addr = a->second;
  auto open = server_conn_.find(addr);
  if (open != server_conn_.end() && messenger_->transport().IsOpen(open->second)) {
    cb(open->second);
    return;
  }
  Dial& dial = dialing_[addr];
  dial.waiters.push_back(std::move(cb));
  if (dial.waiters.size() > 1) return;  // A dial is already under way.
  dial.serial = ++dial_serial_;
  size_t colon = addr.rfind(':');
  std::string host = addr.substr(0, colon);
  int port = std::atoi(addr.c_str() + colon + 1);
  comm::ConnectOptions co;
  co.timeout = options_.connect_timeout;
  messenger_->transport().Connect(host, port, co, [this, addr, serial = dial.serial](Result<ConnId> r) {
    auto d = dialing_.find(addr);
    if (d == dialing_.end() || d->second.serial != serial) {
      // Answered already: the address left the membership while this dial ran.
      if (r.ok()) messenger_->transport().Close(*r, Status(Code::kCancelled, "server left the membership"));
      return;
    }
    auto waiters = std::move(d->second.waiters);
    dialing_.erase(d);
    if (r.ok()) {
      ConnId conn = *r;
      // Say who we are first: servers serve data only to members of the job.
      pb::HelloMessage hello;
      hello.set_node_id(options_.node_id);
      hello.set_role(options_.role);
      hello.set_rank_id(rank_);
      messenger_->Notify(conn, MakeMeta(pb::HELLO, options_.role, rank_), ToBuffer(hello)).IgnoreError();
      server_conn_[addr] = conn;
      messenger_->transport().WatchClose(conn, [this, addr, conn](const Status&) {
        auto it = server_conn_.find(addr);
        if (it != server_conn_.end() && it->second == conn) server_conn_.erase(it);
      });
    }
    for (auto& w : waiters) w(r);
  });
}

void Node::CloseServerLink(const std::string& addr, const Status& why) {
  DCHECK(loop_->InLoopThread());
  auto it = server_conn_.find(addr);
  if (it == server_conn_.end()) return;
  const ConnId conn = it->second;
  server_conn_.erase(it);
  auto timer = leave_timers_.find(conn);
  if (timer != leave_timers_.end()) {
    loop_->CancelTimer(timer->second);
    leave_timers_.erase(timer);
  }
  LOG(WARNING) << options_.node_id << ": closing the link to " << addr << ": " << why;
  messenger_->transport().Close(conn, why);
}

void Node::FailDialsNotIn(const std::set<std::string>& current) {
  DCHECK(loop_->InLoopThread());
  for (auto d = dialing_.begin(); d != dialing_.end();) {
    if (current.count(d->first) != 0) {
      ++d;
      continue;
    }
    const std::string addr = d->first;
    auto waiters = std::move(d->second.waiters);
    d = dialing_.erase(d);
    VLOG(1) << options_.node_id << ": dial to " << addr << " ended: the address left the membership";
    for (auto& w : waiters) {
      w(Status(Code::kUnavailable, "server address " + addr + " left the membership while it was being dialed"));
    }
  }
}

}  // namespace pscore::node
