#include "pscore/node/server/data_handler.h"

namespace pscore::node {

struct Responder::State {
  comm::EventLoop* loop;
  comm::AliveToken::Watch alive;
  std::function<void(const Status&, Payload)> send;  // runs on the loop thread
  std::atomic<bool> answered{false};

  void Answer(const Status& st, Payload payload) {
    if (answered.exchange(true)) return;  // send is taken once, here
    loop->Run([watch = alive, fn = std::move(send), st, payload = std::move(payload)]() mutable {
      if (watch) fn(st, std::move(payload));
    });
  }
  ~State() {
    if (!answered.load()) Answer(Status(Code::kInternal, "handler did not answer"), nullptr);
  }
};

Responder Responder::Make(comm::EventLoop* loop, comm::AliveToken::Watch alive,
                          std::function<void(const Status&, Payload)> send) {
  Responder r;
  r.state_ = std::make_shared<State>();
  r.state_->loop = loop;
  r.state_->alive = std::move(alive);
  r.state_->send = std::move(send);
  return r;
}

void Responder::Reply(Payload payload) const { state_->Answer(Status::Ok(), std::move(payload)); }
void Responder::Fail(const Status& status) const { state_->Answer(status, nullptr); }

}  // namespace pscore::node
