#include "pscore/comm/tcp_client.h"

namespace pscore::comm {

TcpClient::TcpClient(Transport* transport, std::string host, int port, ConnectOptions options,
                     bool reconnect, Callbacks callbacks)
    : transport_(transport),
      host_(std::move(host)),
      port_(port),
      target_(host_ + ":" + std::to_string(port_)),
      options_(options),
      reconnect_(reconnect),
      callbacks_(std::move(callbacks)),
      alive_(std::make_shared<TcpClient*>(this)) {}

TcpClient::~TcpClient() { Stop(); }

void TcpClient::Start() {
  stopped_ = false;
  Dial();
}

void TcpClient::Dial() {
  std::weak_ptr<TcpClient*> weak = alive_;
  transport_->Connect(host_, port_, options_, [weak](Result<ConnId> r) {
    auto alive = weak.lock();
    if (!alive) return;
    TcpClient* self = *alive;
    if (self->stopped_) {
      if (r.ok()) self->transport_->Close(*r, Status(Code::kCancelled, "client stopped"));
      return;
    }
    if (!r.ok()) {
      LOG(WARNING) << "cannot reach " << self->target_ << ": " << r.status();
      if (self->callbacks_.on_failed) self->callbacks_.on_failed(r.status());
      return;
    }
    self->conn_ = *r;
    self->transport_->WatchClose(self->conn_, [weak](const Status& why) {
      auto alive2 = weak.lock();
      if (!alive2) return;
      TcpClient* c = *alive2;
      c->conn_ = kNoConn;
      if (c->stopped_) return;
      if (c->callbacks_.on_lost) c->callbacks_.on_lost(why);
      if (c->reconnect_ && !c->stopped_) c->Redial();
    });
    self->connected_at_ = std::chrono::steady_clock::now();
    if (self->callbacks_.on_connected) self->callbacks_.on_connected(self->conn_);
  });
}

void TcpClient::Redial() {
  if (std::chrono::steady_clock::now() - connected_at_ >= options_.max_backoff) {
    redial_backoff_ = Duration::zero();
    Dial();
    return;
  }
  redial_backoff_ = redial_backoff_ == Duration::zero()
                        ? options_.initial_backoff
                        : std::min<Duration>(redial_backoff_ * 2, options_.max_backoff);
  VLOG(1) << target_ << ": the connection lasted under " << ToMillis(options_.max_backoff) << " ms; dialing again in "
          << ToMillis(redial_backoff_) << " ms";
  std::weak_ptr<TcpClient*> weak = alive_;
  redial_timer_ = transport_->loop()->AddTimer(redial_backoff_, Duration::zero(), [weak] {
    auto alive = weak.lock();
    if (!alive) return;
    TcpClient* self = *alive;
    self->redial_timer_ = 0;
    if (!self->stopped_) self->Dial();
  });
}

void TcpClient::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (redial_timer_ != 0) transport_->loop()->CancelTimer(redial_timer_);
  redial_timer_ = 0;
  if (conn_ != kNoConn) {
    ConnId c = conn_;
    conn_ = kNoConn;
    transport_->Close(c, Status(Code::kCancelled, "client stopped"));
  }
}

}  // namespace pscore::comm
