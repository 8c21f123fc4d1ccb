// Node: control calls to the scheduler. A BARRIER, KV_REQUEST or FINISH call that loses
// the scheduler is parked and sent again once the node has registered again.
#include "pscore/comm/address.h"
#include "pscore/core/cluster_manager.h"
#include "pscore/node/common/handoff.h"
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
  CallSchedulerReissuable(cmd, ToBuffer(msg), timeout, std::move(done));
}

void Node::CallSchedulerReissuable(pb::NodeCommand cmd, BufferPtr payload, Duration timeout,
                                   std::function<void(Result<Frame>, bool reissued)> done) {
  auto call = std::make_shared<ControlCall>();
  call->cmd = cmd;
  call->payload = std::move(payload);
  call->timeout = timeout;
  loop_calls_out_.fetch_add(1, std::memory_order_acq_rel);
  call->done = [this, done = std::move(done)](Result<Frame> r, bool reissued) {
    loop_calls_out_.fetch_sub(1, std::memory_order_acq_rel);
    done(std::move(r), reissued);
  };
  call->reissuable = Reissuable(cmd);
  bool queued = loop_->Run([this, call] { SendControlCall(call); });
  if (!queued) call->done(Stopped(), false);
}

std::optional<Result<Frame>> Node::CallDirect(pb::NodeCommand cmd, const BufferPtr& payload, Duration timeout) {
  if (cmd != pb::KV_REQUEST && cmd != pb::BARRIER) return std::nullopt;
  if (loop_calls_out_.load(std::memory_order_acquire) != 0) return std::nullopt;
  uint64_t session = 0;
  std::optional<Result<Frame>> answer = direct_calls_.TryCall(cmd, payload, timeout, &session);
  if (answer && core::IsStaleSession(answer->status())) {
    // Nothing was done. The loop registers again before it takes the call, which it then
    // parks and re-issues under the new session.
    loop_->Run([this, session, why = answer->status()] { OnStaleSession(session, why); });
    return std::nullopt;
  }
  return answer;
}

void Node::OpenDirectCalls() {
  DCHECK(loop_->InLoopThread());
  if (closed_ || !registered_ || scheduler_ == nullptr || !scheduler_->connected()) return;
  direct_calls_.Open(SchedulerMeta(pb::KV_REQUEST));
}

void Node::CloseDirectCalls(const char* why) {
  DCHECK(loop_->InLoopThread());
  direct_calls_.Close(why);
}

void Node::SendControlCall(std::shared_ptr<ControlCall> call) {
  DCHECK(loop_->InLoopThread());
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
                     // Stop closed the link under it (kUnavailable): the call ends as stopped.
                     if (!r.ok() && closed()) return call->done(Stopped(), call->reissued);
                     if (!r.ok() && ParkControlCall(call, r.status(), sent, conn)) return;
                     call->done(std::move(r), call->reissued);
                   });
}

// A call is parked when the scheduler link it used is lost (kUnavailable), its
// deadline passed while the scheduler answered nothing at all since it was sent (a stopped
// scheduler), or it was refused as made under a stale session (nothing was done; the node
// registers again). It is sent again at the next registration.
bool Node::ParkControlCall(const std::shared_ptr<ControlCall>& call, const Status& why, TimePoint sent,
                           ConnId conn) {
  DCHECK(loop_->InLoopThread());
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

// After a registration: every parked call goes out again.
void Node::ReissueParked() {
  DCHECK(loop_->InLoopThread());
  if (parked_calls_.empty()) return;
  LOG(INFO) << RoleLabel(options_.role) << " " << options_.node_id << ": re-issuing " << parked_calls_.size()
            << " control call(s) to the scheduler at " << scheduler_->target();
  auto calls = std::move(parked_calls_);
  parked_calls_.clear();
  for (auto& [serial, call] : calls) SendControlCall(call);
}

void Node::FailParked(bool all, const std::string& why) {
  DCHECK(loop_->InLoopThread());
  const TimePoint now = clock_.Now();
  const std::string target = scheduler_ != nullptr
                                 ? scheduler_->target()
                                 : comm::JoinHostPort(options_.scheduler_host, options_.scheduler_port);
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
  return CallScheduler(cmd, ToBuffer(msg), timeout);
}

Result<Frame> Node::CallScheduler(pb::NodeCommand cmd, BufferPtr payload, Duration timeout) {
  CHECK(!loop_->OnRunningLoop()) << "blocking pscore call on the loop thread";
  if (std::optional<Result<Frame>> direct = CallDirect(cmd, payload, timeout)) return std::move(*direct);
  auto answer = std::make_shared<Handoff<Result<Frame>>>();
  CallSchedulerReissuable(cmd, std::move(payload), timeout,
                          [answer](Result<Frame> r, bool) { answer->Put(std::move(r)); });
  // A re-issued call is always answered: by the scheduler, at the recovery timeout, or when
  // the node terminates or stops.
  if (Reissuable(cmd)) return answer->Take();
  // The messenger enforces the deadline; the margin only guards against a stopped loop.
  std::optional<Result<Frame>> got = answer->TakeFor(timeout + std::chrono::seconds(5));
  if (!got) return Status(Code::kTimeout, pb::NodeCommand_Name(cmd) + " to the scheduler: no answer");
  return std::move(*got);
}

}  // namespace pscore::node
