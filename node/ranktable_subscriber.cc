#include "node/ranktable_subscriber.h"

#include <future>

#include "node/wire.h"

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
    if (on_close_ && !stopped_) on_close_(why);
  };
  comm::TransportOptions t;
  t.auth_token = options_.cluster_token;
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
  loop_->Run([this, result] {
    comm::ConnectOptions co;
    co.timeout = options_.timeout;
    messenger_->transport().Connect(options_.host, options_.port, co, [this, result](Result<comm::ConnId> c) {
      if (!c.ok()) return result->set_value(c.status());
      conn_ = *c;
      pb::ClientInfo info;
      info.set_jobid(options_.job_id);
      info.set_role(options_.role);
      messenger_->Call(conn_, MakeMeta(pb::SUBSCRIBE_RANKTABLE, pb::ADMIN_CLIENT, 0), ToBuffer(info),
                       options_.timeout, [this, result](Result<comm::Frame> r) {
                         if (!r.ok() && conn_ != comm::kNoConn) {
                           messenger_->transport().Close(conn_, r.status());
                         }
                         result->set_value(r.status());
                       });
    });
  });
  return done.get();
}

void RankTableSubscriber::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (!loop_->running()) return;
  loop_->RunAndWait([this] { messenger_->Shutdown(); });
}

void RankTableSubscriber::OnFrame(comm::ConnId conn, comm::Frame&& frame) {
  if (frame.meta.cmd() != pb::RANKTABLE_STREAM) {
    VLOG(1) << "rank-table subscriber: ignored " << pb::NodeCommand_Name(frame.meta.cmd());
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
