// Node: registration with the scheduler, heartbeats, and the watch that tells a silent
// scheduler from a live one. Loop thread throughout.
#include <algorithm>

#include "pscore/core/cluster_manager.h"
#include "pscore/node/common/node.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

void Node::OnSchedulerConnected(ConnId conn) {
  DCHECK(loop_->InLoopThread());
  VLOG(1) << options_.node_id << ": connected to the scheduler (conn " << conn << ")";
  Register();
}

void Node::OnSchedulerFailed(const Status& why) {
  DCHECK(loop_->InLoopThread());
  Status st(Code::kUnavailable, options_.node_id + " cannot reach the scheduler at " +
                                    scheduler_->target() + ": " + why.message());
  LOG(ERROR) << st;
  SettleStart(st);
  Terminate(st);
}

void Node::SettleStart(const Status& st) {
  DCHECK(loop_->InLoopThread());
  if (start_done_) return;
  start_done_ = true;
  start_promise_.set_value(st);
}

void Node::Register() {
  DCHECK(loop_->InLoopThread());
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
    if (ended_) {  // told to end meanwhile (a node that left in a scale-in)
      return SettleStart(Status(Code::kCancelled, options_.node_id + " was told to end while registering"));
    }
    pb::RegisterRespMessage resp;
    Status st = r.ok() ? ParsePayload(*r, &resp) : r.status();
    if (st.ok()) return OnRegistered(resp);
    if (st.code() == Code::kUnavailable) return;  // the link is lost: it registers again when back
    if (st.code() == Code::kTimeout) return RetryRegister(st);
    if (const JoinRefusal kind = JoinRefusalOf(st); kind != JoinRefusal::kNone) {
      if (WaitToJoin(st, kind)) return;
      const int64_t waited = ToMillis(clock_.Now() - *refused_since_);
      if (waited > 0) {
        const char* why = kind == JoinRefusal::kQuotaFull ? "no scale-out made room" : "the scale-in did not end";
        st = Status(st.code(), st.message() + " (registered again for " + std::to_string(waited) + " ms: " + why + ")");
      }
    }
    LOG(ERROR) << options_.node_id << ": registration refused: " << st;
    SettleStart(st);
    Terminate(st);
  });
}

void Node::OnRegistered(const pb::RegisterRespMessage& resp) {
  DCHECK(loop_->InLoopThread());
  registered_ = true;
  register_backoff_.Reset();
  if (refused_since_) {
    LOG(INFO) << RoleLabel(options_.role) << " " << options_.node_id << ": admitted after "
              << ToMillis(clock_.Now() - *refused_since_) << " ms of " << join_refusals_;
    refused_since_.reset();
    join_refusals_.clear();
    last_join_refusal_ = JoinRefusal::kNone;
    join_backoff_.Reset();
  }
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
  OpenDirectCalls();
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
  SettleStart(Status::Ok());
}

// A REGISTER unanswered within request_timeout while the link stays up (a scheduler stalled
// that long) is sent again, after a backoff doubling from 100 ms to 5 s; the scheduler takes
// a repeat from the same incarnation as a retry. A lost link registers again on reconnect.
void Node::RetryRegister(const Status& why) {
  DCHECK(loop_->InLoopThread());
  if (closed_ || registered_ || register_retry_timer_ != 0) return;
  const Duration wait = register_backoff_.Next();
  LOG(WARNING) << RoleLabel(options_.role) << " " << options_.node_id << ": registration not answered (" << why
               << "); sending it again in " << ToMillis(wait) << " ms";
  RegisterAfter(wait);
}

// A node started before the scale-out that makes room for it (an operator may start the new
// processes first, as a rendezvous waits for late members) is refused "quota full"; one that
// comes while a scale-in runs, "scale-in running" (and "quota full" after it, unless the
// scale-in is rolled back). Either registers again, at waits doubling from 100 ms to 1 s,
// until join_timeout has passed since the first refusal. False: the refusal stands.
Node::JoinRefusal Node::JoinRefusalOf(const Status& refusal) {
  if (core::IsQuotaFull(refusal)) return JoinRefusal::kQuotaFull;
  if (core::IsScaleInRunning(refusal)) return JoinRefusal::kScaleInRunning;
  return JoinRefusal::kNone;
}

bool Node::WaitToJoin(const Status& refusal, JoinRefusal kind) {
  DCHECK(loop_->InLoopThread());
  const TimePoint now = clock_.Now();
  if (!refused_since_) refused_since_ = now;
  const Duration left = options_.join_timeout - (now - *refused_since_);
  if (last_join_refusal_ != kind) {
    last_join_refusal_ = kind;
    const bool quota = kind == JoinRefusal::kQuotaFull;
    join_refusals_ += std::string(join_refusals_.empty() ? "" : ", then ") +
                      (quota ? "\"quota full\"" : "\"scale-in running\"");
    if (left > Duration::zero()) {
      LOG(WARNING) << RoleLabel(options_.role) << " " << options_.node_id << ": " << refusal
                   << "; registering again until " << (quota ? "a scale-out makes room" : "the scale-in ends")
                   << " (up to " << ToMillis(left) << " ms)";
    }
  }
  if (closed_ || left <= Duration::zero()) return false;
  if (register_retry_timer_ == 0) RegisterAfter(join_backoff_.Next());
  return true;
}

void Node::RegisterAfter(Duration wait) {
  DCHECK(loop_->InLoopThread());
  register_retry_timer_ = loop_->AddTimer(wait, Duration::zero(), [this] {
    register_retry_timer_ = 0;
    if (!registered_) Register();
  });
}

pb::MessageMeta Node::SchedulerMeta(pb::NodeCommand cmd) const {
  DCHECK(loop_->InLoopThread());
  pb::MessageMeta meta = MakeMeta(cmd, options_.role, rank_);
  meta.set_session_id(session_id_);
  return meta;
}

void Node::OnStaleSession(uint64_t carried, const Status& why) {
  DCHECK(loop_->InLoopThread());
  if (closed_ || carried != session_id_) return;
  LOG(WARNING) << RoleLabel(options_.role) << " " << options_.node_id << ": " << why << "; registering again";
  registered_ = false;
  CloseDirectCalls("the scheduler's session changed");
  Register();
}

void Node::Heartbeat() {
  DCHECK(loop_->InLoopThread());
  if (!registered_ || scheduler_ == nullptr || !scheduler_->connected()) return;
  pb::HeartbeatMessage msg;
  msg.set_node_id(options_.node_id);
  msg.set_known_epoch(scale_.epoch());
  msg.set_incarnation(incarnation_);
  msg.set_node_state(scale_.state() == pb::CLUSTER_READY ? pb::NODE_READY : pb::NODE_STARTING);
  messenger_->Call(scheduler_->conn(), SchedulerMeta(pb::HEARTBEAT), ToBuffer(msg), options_.heartbeat_interval * 3,
                   [this, session = session_id_](Result<Frame> r) { OnHeartbeatAnswer(session, std::move(r)); });
}

// `session`: the one the heartbeat was sent under.
void Node::OnHeartbeatAnswer(uint64_t session, Result<Frame> r) {
  DCHECK(loop_->InLoopThread());
  if (ended_) return;  // an answer that was on its way when the node terminated
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
      LOG(WARNING) << options_.node_id << ": the scheduler does not know us (" << r.status() << "); registering again";
      registered_ = false;
      CloseDirectCalls("the scheduler does not know this node");
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
  // A newer epoch: the membership change we missed is fetched; else the state is taken.
  Perform(scale_.OnSchedulerAnswer(resp.epoch(), resp.cluster_state()));
}

// Loop thread: any answer or push from the scheduler shows it runs.
void Node::SchedulerAnswered() {
  DCHECK(loop_->InLoopThread());
  const std::optional<Duration> silence = watch_.Answered();
  if (!silence || scheduler_ == nullptr) return;
  LOG(WARNING) << RoleLabel(options_.role) << " " << options_.node_id << ": the scheduler at "
               << scheduler_->target() << " answers again after " << ToMillis(*silence) << " ms of silence";
}

// Loop thread, on watch_timer_: the data plane runs on while the scheduler is silent; the
// link is redialed, and past the recovery timeout the node gives up.
void Node::WatchScheduler() {
  DCHECK(loop_->InLoopThread());
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

}  // namespace pscore::node
