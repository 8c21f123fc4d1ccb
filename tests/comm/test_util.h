// Helpers shared by the comm tests: bounded waits on futures, running code on a loop
// thread and getting its result back, frame encoding, and a raw blocking socket client
// used to send malformed or slow input. Test-only; any thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/event_loop.h"
#include "comm/frame.h"
#include "core/buffer.h"
#include "proto/comm.pb.h"

namespace pscore::comm::testing {

inline constexpr auto kWait = std::chrono::seconds(20);

// Waits for f with a deadline; FAILs the test (never hangs) on timeout.
template <typename T>
T Await(std::future<T>& f, std::chrono::milliseconds timeout = kWait) {
  if (f.wait_for(timeout) != std::future_status::ready) {
    FAIL("timed out after " << timeout.count() << " ms waiting for a result");
  }
  return f.get();
}

// Runs fn on the loop thread and returns its result (waits with a deadline).
template <typename F>
auto OnLoop(EventLoop& loop, F fn) -> decltype(fn()) {
  using R = decltype(fn());
  auto p = std::make_shared<std::promise<R>>();
  auto f = p->get_future();
  loop.Post([p, fn = std::move(fn)]() mutable {
    if constexpr (std::is_void_v<R>) {
      fn();
      p->set_value();
    } else {
      p->set_value(fn());
    }
  });
  return Await(f);
}

// A value set once from any thread and awaited with a deadline from the test thread.
template <typename T>
class OneShot {
 public:
  OneShot() : future_(promise_.get_future()) {}
  void Set(T v) {
    std::lock_guard<std::mutex> lock(mu_);
    if (set_) return;
    set_ = true;
    promise_.set_value(std::move(v));
  }
  T Get(std::chrono::milliseconds timeout = kWait) { return Await(future_, timeout); }
  bool ready() const { return future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }

 private:
  std::mutex mu_;
  bool set_ = false;
  std::promise<T> promise_;
  std::future<T> future_;
};

// The exact bytes of one frame on the wire.
inline std::string EncodeFrame(const pb::MessageMeta& meta, std::string_view payload) {
  std::string m = meta.SerializeAsString();
  std::string out = EncodeHeader(FrameHeader{kMagic, static_cast<uint32_t>(m.size()), payload.size()});
  out += m;
  out.append(payload.data(), payload.size());
  return out;
}

inline pb::MessageMeta TestMeta(uint64_t request_id, int32_t user_cmd = 0) {
  pb::MessageMeta m;
  m.set_cmd(pb::SEND_DATA);
  m.set_request_id(request_id);
  m.set_user_cmd(user_cmd);
  return m;
}

// A plain blocking TCP client socket with receive timeouts (so reads never hang).
class RawSocket {
 public:
  RawSocket() = default;
  ~RawSocket() { Close(); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  // rcvbuf > 0 shrinks the receive buffer before connecting (for backpressure tests).
  bool Connect(int port, int rcvbuf = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) return false;
    if (rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  bool SendAll(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  // Reads exactly n bytes; false on EOF, error or the 5 s receive timeout.
  bool RecvAll(char* out, size_t n) {
    while (n > 0) {
      ssize_t r = ::recv(fd_, out, n, 0);
      if (r <= 0) return false;
      out += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  // Reads one frame; false on EOF, timeout or a malformed header.
  bool RecvFrame(pb::MessageMeta* meta, std::string* payload) {
    char head[kHeaderBytes];
    if (!RecvAll(head, kHeaderBytes)) return false;
    FrameHeader h = LoadHeader(head);
    if (h.magic != kMagic) return false;
    std::string m(h.meta_len, '\0');
    if (!RecvAll(m.data(), m.size()) || !meta->ParseFromString(m)) return false;
    payload->assign(h.data_len, '\0');
    return RecvAll(payload->data(), payload->size());
  }
  // True once the peer has closed (recv returns 0 or a reset) within the timeout.
  bool WaitClosed() {
    char buf[4096];
    for (;;) {
      ssize_t r = ::recv(fd_, buf, sizeof(buf), 0);
      if (r == 0) return true;
      if (r < 0) return errno == ECONNRESET;
    }
  }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace pscore::comm::testing
