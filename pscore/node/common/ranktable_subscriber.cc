#include "pscore/node/common/ranktable_subscriber.h"

#include <future>

#include "pscore/node/common/wire.h"

namespace pscore::node {

RankTableSubscriber::RankTableSubscriber(RankTableSubscriberOptions options, TableCallback on_table,
                                         CloseCallback on_close, comm::EventLoop* loop)
    : options_(std::move(options)),
      on_table_(std::move(on_table)),
      on_close_(std::move(on_close)),
      owned_loop_(loop == nullptr ? std::make_unique<comm::EventLoop>("ranktable-sub") : nullptr),
      loop_(loop == nullptr ? owned_loop_.get() : loop) {
  comm::Messenger::Handlers h;
  h.on_request = [this](comm::ConnId c, comm::Frame&& f) { OnFrame(c, std::move(f)); };
  h.on_close = [this](comm::ConnId c, const Status& why) {
    if (c != conn_) return;
    conn_ = comm::kNoConn;
    OnLost(why);
  };
  comm::TransportOptions t;
  t.auth_token = options_.cluster_token;
  t.tls = options_.tls;
  messenger_ = std::make_unique<comm::Messenger>(loop_, t, std::move(h));
}

RankTableSubscriber::~RankTableSubscriber() {
  Stop();
  if (owned_loop_) owned_loop_->Stop().IgnoreError();
  if (loop_->running() && !loop_->InLoopThread()) {
    // The messenger must die on the loop thread of a shared loop.
    loop_->RunAndWait([this] { messenger_.reset(); });
  }
}

Status RankTableSubscriber::Start() {
  if (owned_loop_ && !owned_loop_->running()) PSCORE_RETURN_IF_ERROR(owned_loop_->Start());
  auto result = std::make_shared<std::promise<Status>>();
  std::future<Status> done = result->get_future();
  if (!loop_->Run([this, result] { Subscribe([result](Status st) { result->set_value(std::move(st)); }); })) {
    return Status(Code::kCancelled, "rank table subscriber stopped");
  }
  return done.get();
}

Result<uint64_t> RankTableSubscriber::Register() {
  if (owned_loop_ && !owned_loop_->running()) PSCORE_RETURN_IF_ERROR(owned_loop_->Start());
  auto result = std::make_shared<std::promise<Result<uint64_t>>>();
  std::future<Result<uint64_t>> done = result->get_future();
  bool queued = loop_->Run([this, result] {
    comm::ConnectOptions co;
    co.timeout = options_.timeout;
    messenger_->transport().Connect(options_.host, options_.port, co, [this, result](Result<comm::ConnId> c) {
      if (!c.ok()) return result->set_value(c.status());
      pb::ClientInfo info;
      info.set_jobid(options_.job_id);
      info.set_role(options_.role);
      const comm::ConnId conn = *c;
      messenger_->Call(conn, MakeMeta(pb::REGISTER_RANKTABLE, pb::ADMIN_CLIENT, 0), ToBuffer(info),
                       options_.timeout, [this, conn, result](Result<comm::Frame> r) {
                         messenger_->transport().Close(conn, Status::Ok());  // not conn_: no OnLost
                         if (!r.ok()) return result->set_value(r.status());
                         pb::RankTableRegistration reg;
                         Status st = ParsePayload(*r, &reg);
                         if (!st.ok()) return result->set_value(st);
                         options_.registration = reg.registration();
                         result->set_value(reg.registration());
                       });
    });
  });
  if (!queued) return Status(Code::kCancelled, "rank table subscriber stopped");
  return done.get();
}

void RankTableSubscriber::Subscribe(std::function<void(Status)> done) {
  DCHECK(loop_->InLoopThread());
  comm::ConnectOptions co;
  co.timeout = options_.timeout;
  messenger_->transport().Connect(options_.host, options_.port, co, [this, done](Result<comm::ConnId> c) {
    if (!c.ok()) return done(c.status());
    pb::ClientInfo info;
    info.set_jobid(options_.job_id);
    info.set_role(options_.role);
    info.set_registration(options_.registration);
    const comm::ConnId conn = *c;
    messenger_->Call(conn, MakeMeta(pb::SUBSCRIBE_RANKTABLE, pb::ADMIN_CLIENT, 0), ToBuffer(info), options_.timeout,
                     [this, conn, done](Result<comm::Frame> r) {
                       if (!r.ok()) {
                         messenger_->transport().Close(conn, r.status());  // not conn_: no OnLost
                       } else {
                         conn_ = conn;
                       }
                       done(r.status());
                     });
  });
}

// The subscribed link closed.
void RankTableSubscriber::OnLost(const Status& why) {
  DCHECK(loop_->InLoopThread());
  if (stopped_) return;
  if (options_.reconnect_for <= Duration::zero()) {
    if (on_close_) on_close_(why);
    return;
  }
  LOG(WARNING) << "rank-table subscriber: stream lost (" << why << "); subscribing again for up to "
               << ToMillis(options_.reconnect_for) << " ms";
  lost_.fetch_add(1);
  lost_at_ = SteadyClock().Now();
  backoff_.Reset();
  RetryLater(why);
}

void RankTableSubscriber::RetryLater(const Status& last) {
  DCHECK(loop_->InLoopThread());
  const Duration left = options_.reconnect_for - (SteadyClock().Now() - lost_at_);
  if (left <= Duration::zero()) {
    if (on_close_) on_close_(last);
    return;
  }
  retry_timer_ = loop_->AddTimer(std::min(backoff_.Next(), left), Duration::zero(), [this] {
    retry_timer_ = 0;
    if (stopped_) return;
    Subscribe([this](Status st) {
      if (stopped_) return;
      if (st.ok()) {
        resubscribed_.fetch_add(1);
        LOG(INFO) << "rank-table subscriber: subscribed again";
        return;
      }
      // A scheduler that does not run this job (or no longer has the registration), or a
      // registration superseded meanwhile: subscribing again cannot help.
      if (st.code() == Code::kNotFound || st.code() == Code::kAborted) {
        if (on_close_) on_close_(st);
        return;
      }
      RetryLater(st);
    });
  });
}

void RankTableSubscriber::Stop() {
  if (stopped_.exchange(true)) return;
  if (!loop_->running()) return;
  loop_->RunAndWait([this] {
    if (retry_timer_ != 0) loop_->CancelTimer(retry_timer_);
    retry_timer_ = 0;
    messenger_->Shutdown();
  });
}

void RankTableSubscriber::OnFrame(comm::ConnId conn, comm::Frame&& frame) {
  DCHECK(loop_->InLoopThread());
  if (frame.meta.cmd() != pb::RANKTABLE_STREAM) {
    VLOG(1) << "rank-table subscriber: ignored " << pb::NodeCommand_Name(frame.meta.cmd());
    return;
  }
  if (Status end = comm::StatusOf(frame.meta); !end.ok()) {
    // The stream's final push: why the scheduler ended it (a later registration of the job).
    if (conn != conn_) return;
    LOG(WARNING) << "rank-table subscriber: stream ended: " << end;
    conn_ = comm::kNoConn;  // so its close is not a loss to recover from
    messenger_->transport().Close(conn, end);
    if (!stopped_ && on_close_) on_close_(end);
    return;
  }
  pb::RankTableStream msg;
  Status st = ParsePayload(frame, &msg);
  if (!st.ok()) {
    LOG(WARNING) << "rank-table subscriber: " << st;
    return;
  }
  received_.fetch_add(1);
  if (on_table_) on_table_(msg);
}

}  // namespace pscore::node
