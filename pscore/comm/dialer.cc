#include "pscore/comm/dialer.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <uv.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/uv_status.h"

namespace pscore::comm {

Dialer::Dialer(EventLoop* loop, const sockaddr_storage& addr, std::string target, ConnectOptions options,
               AdoptFn adopt, FinishedFn finished, DoneFn done)
    : loop_(loop),
      addr_(addr),
      target_(std::move(target)),
      options_(options),
      adopt_(std::move(adopt)),
      finished_(std::move(finished)),
      done_(std::move(done)),
      deadline_(std::chrono::steady_clock::now() + options.timeout),
      backoff_(options.initial_backoff, options.max_backoff),
      req_(new uv_connect_t) {
  req_->data = this;
}

Dialer::~Dialer() { delete req_; }

void Dialer::Start() { Attempt(); }

void Dialer::Finish(Result<ConnId> result) {
  auto done = std::move(done_);
  if (finished_) finished_(this);
  delete this;
  if (done) done(std::move(result));
}

void Dialer::OnConnect(uv_connect_t* req, int status) {
  auto* d = static_cast<Dialer*>(req->data);
  uv_tcp_t* tcp = d->tcp_;
  d->tcp_ = nullptr;
  if (d->deadline_timer_ != 0 && !d->cancelled_) d->loop_->CancelTimer(d->deadline_timer_);
  d->deadline_timer_ = 0;
  d->Connected(tcp, status);
}

void Dialer::Connected(uv_tcp_t* tcp, int status) {
  DCHECK(loop_->InLoopThread());
  if (timed_out_) {
    // The deadline closed the attempt (a peer that drops SYNs would leave it to the
    // kernel's retries, about two minutes).
    Finish(Status(Code::kTimeout, "connect to " + target_ + ": no connection within " +
                                      std::to_string(ToMillis(options_.timeout)) + " ms (" +
                                      std::to_string(attempts_) + " attempts)"));
    return;
  }
  if (cancelled_ || status == UV_ECANCELED) {
    if (status == 0) CloseAndFree(tcp);
    Finish(Status(Code::kCancelled, "connect to " + target_ + " cancelled"));
    return;
  }
  if (status == 0) {
    SetUserTimeout(tcp);
    // The dial ends when the connection reports itself ready (after the token handshake,
    // if any). A peer that closes it during the handshake with no verdict (it refused the
    // connection at accept, or it restarted) is one more failed attempt; a refused proof
    // (kPermissionDenied) ends the dial. On shutdown the close answers it kCancelled.
    adopt_(tcp, [this](Result<ConnId> r) {
      if (r.ok() || cancelled_ || r.status().code() == Code::kPermissionDenied) {
        Finish(std::move(r));
        return;
      }
      RetryLater(r.status());
    });
    return;
  }
  CloseAndFree(tcp);
  RetryLater(UvStatus(status, "connect to " + target_));
}

void Dialer::SetUserTimeout(uv_tcp_t* tcp) const {
  if (options_.user_timeout <= Duration::zero()) return;
  uv_os_fd_t fd;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(tcp), &fd) != 0) return;
  const auto ms = static_cast<unsigned int>(std::min<int64_t>(ToMillis(options_.user_timeout), INT32_MAX));
  if (::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms)) != 0) {
    LOG(WARNING) << "connect to " << target_ << ": TCP_USER_TIMEOUT not set: " << std::strerror(errno);
  }
}

void Dialer::RetryLater(Status error) {
  last_error_ = std::move(error);
  TimePoint now = std::chrono::steady_clock::now();
  if (now + backoff_.Peek() >= deadline_) {
    Finish(Status(last_error_.code() == Code::kTimeout ? Code::kTimeout : Code::kUnavailable,
                  last_error_.message() + " (gave up after " + std::to_string(attempts_) + " attempts)"));
    return;
  }
  const Duration wait = backoff_.Next();
  VLOG(1) << last_error_ << "; retrying in " << ToMillis(wait) << " ms";
  retry_timer_ = loop_->AddTimer(wait, Duration::zero(), [this] {
    retry_timer_ = 0;
    Attempt();
  });
}

void Dialer::Attempt() {
  DCHECK(loop_->InLoopThread());
  ++attempts_;
  tcp_ = new uv_tcp_t;
  uv_tcp_init(loop_->uv_loop(), tcp_);
  int rc = uv_tcp_connect(req_, tcp_, reinterpret_cast<const sockaddr*>(&addr_), &OnConnect);
  if (rc < 0) {
    uv_tcp_t* tcp = tcp_;
    tcp_ = nullptr;
    CloseAndFree(tcp);
    Finish(UvStatus(rc, "connect to " + target_));
    return;
  }
  const Duration left = std::max<Duration>(Duration::zero(), deadline_ - std::chrono::steady_clock::now());
  deadline_timer_ = loop_->AddTimer(left, Duration::zero(), [this] {
    deadline_timer_ = 0;
    if (tcp_ == nullptr) return;
    timed_out_ = true;  // OnConnect runs with UV_ECANCELED and ends the dial
    uv_tcp_t* tcp = tcp_;
    tcp_ = nullptr;
    CloseAndFree(tcp);
  });
}

void Dialer::Cancel() {
  DCHECK(loop_->InLoopThread());
  cancelled_ = true;
  finished_ = nullptr;  // the transport has let go of *this already
  if (deadline_timer_ != 0) loop_->CancelTimer(deadline_timer_);
  deadline_timer_ = 0;
  if (retry_timer_ != 0) {
    loop_->CancelTimer(retry_timer_);
    Finish(Status(Code::kCancelled, "connect to " + target_ + " cancelled"));
  } else if (tcp_ != nullptr) {
    // Answer now, while the owner of the callback is surely alive: it may be destroyed
    // before OnConnect runs (with UV_ECANCELED), which then only frees *this.
    auto done = std::move(done_);
    done_ = nullptr;
    uv_tcp_t* tcp = tcp_;
    tcp_ = nullptr;
    CloseAndFree(tcp);
    if (done) done(Status(Code::kCancelled, "connect to " + target_ + " cancelled"));
  }
}

}  // namespace pscore::comm
