#include "pscore/comm/tcp_listener.h"

#include <uv.h>

#include "pscore/comm/address.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/uv_status.h"

namespace pscore::comm {

// The listening handle, a member of its TcpListener (handle data points back).
struct TcpListener::Handle {
  uv_tcp_t tcp;
};

bool AcceptCap::Admit(size_t open) {
  if (max_open_ == 0 || open < max_open_) return true;
  ++refused_;
  TimePoint now = std::chrono::steady_clock::now();
  if (now - last_log_ > std::chrono::seconds(1)) {
    last_log_ = now;
    LOG(WARNING) << who_ << ": refusing accepted connections: " << open << " open, the cap is " << max_open_ << " ("
                 << refused_ << " refused so far)";
  }
  return false;
}

TcpListener::TcpListener(EventLoop* loop, std::string who, Callbacks callbacks)
    : loop_(loop), who_(std::move(who)), callbacks_(std::move(callbacks)), handle_(new Handle) {
  handle_->tcp.data = this;
}

TcpListener::~TcpListener() { delete handle_; }

Result<TcpListener*> TcpListener::Open(EventLoop* loop, const std::string& host, int port, std::string who,
                                       Callbacks callbacks) {
  DCHECK(loop->InLoopThread());
  sockaddr_storage addr;
  PSCORE_RETURN_IF_ERROR(ResolveAddress(host, port, &addr));
  auto* l = new TcpListener(loop, std::move(who), std::move(callbacks));
  uv_tcp_init(loop->uv_loop(), &l->handle_->tcp);
  const std::string where = JoinHostPort(host, port);
  int rc = uv_tcp_bind(&l->handle_->tcp, reinterpret_cast<const sockaddr*>(&addr), 0);
  const char* step = "bind ";
  if (rc == 0) {
    step = "listen ";
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&l->handle_->tcp), 1024,
                   [](uv_stream_t* server, int status) { OnConnection(server->data, status); });
  }
  if (rc < 0) {
    l->Close();
    return UvStatus(rc, step + where);
  }
  l->port_ = BoundPort(&l->handle_->tcp);
  l->address_ = JoinHostPort(host, l->port_);
  return l;
}

void TcpListener::OnConnection(void* server, int status) {
  auto* self = static_cast<TcpListener*>(server);
  if (status < 0) {
    LOG(WARNING) << self->who_ << ": accept on " << self->address_ << ": " << uv_strerror(status);
    return;
  }
  self->Accept();
}

void TcpListener::Accept() {
  DCHECK(loop_->InLoopThread());
  auto* tcp = new uv_tcp_t;
  uv_tcp_init(loop_->uv_loop(), tcp);
  if (uv_accept(reinterpret_cast<uv_stream_t*>(&handle_->tcp), reinterpret_cast<uv_stream_t*>(tcp)) != 0) {
    CloseAndFree(tcp);
    return;
  }
  if (callbacks_.admit && !callbacks_.admit()) {
    CloseAndFree(tcp);
    return;
  }
  callbacks_.accepted(tcp);
}

void TcpListener::Close() {
  DCHECK(loop_->InLoopThread());
  callbacks_ = Callbacks();
  uv_close(reinterpret_cast<uv_handle_t*>(&handle_->tcp),
           [](uv_handle_t* h) { delete static_cast<TcpListener*>(h->data); });
}

}  // namespace pscore::comm
