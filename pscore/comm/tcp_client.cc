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
      redial_backoff_(options_.initial_backoff, options_.max_backoff) {}

TcpClient::~TcpClient() { Stop(); }

void TcpClient::Start() {
  stopped_ = false;
  Dial();
}

void TcpClient::Dial() {
  DCHECK(transport_->loop()->InLoopThread());
  transport_->Connect(host_, port_, options_, [self = this, alive = alive_.watch()](Result<ConnId> r) {
    if (!alive) return;
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
    self->transport_->WatchClose(self->conn_, [c = self, alive](const Status& why) {
      if (!alive) return;
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
  DCHECK(transport_->loop()->InLoopThread());
  if (std::chrono::steady_clock::now() - connected_at_ >= options_.max_backoff) {
    redial_backoff_.Reset();
    Dial();
    return;
  }
  const Duration wait = redial_backoff_.Next();
  VLOG(1) << target_ << ": the connection lasted under " << ToMillis(options_.max_backoff) << " ms; dialing again in "
          << ToMillis(wait) << " ms";
  redial_timer_ = transport_->loop()->AddTimer(wait, Duration::zero(), [self = this, alive = alive_.watch()] {
    if (!alive) return;
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
