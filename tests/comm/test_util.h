// Include this header first in every comm test (see the CHECK note below).
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

#include <glog/logging.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/frame.h"
#include "pscore/comm/messenger.h"
#include "pscore/core/buffer.h"
#include "pscore/proto/comm.pb.h"

// glog and Catch2 both define CHECK. Every comm test includes this header, which pulls in
// glog first and then makes CHECK Catch's non-fatal assertion, so a failed CHECK is
// reported by Catch instead of aborting the process.
#include <catch2/catch.hpp>
#undef CHECK
#define CHECK(...) \
  INTERNAL_CATCH_TEST("CHECK", Catch::ResultDisposition::ContinueOnFailure, __VA_ARGS__)

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
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (set_) return;
      set_ = true;
    }
    // Outside the lock: the waiter may return and destroy *this as soon as the value is
    // set, and unlocking mu_ afterwards touched a dead object (ThreadSanitizer).
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

// A raw listening socket on 127.0.0.1 at an ephemeral port (written to *addr), which
// accepts nothing by itself: for peers that misbehave at accept. -1 on failure.
inline int ListenOnLoopback(int backlog, sockaddr_in* addr) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  *addr = sockaddr_in{};
  addr->sin_family = AF_INET;
  addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(*addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(addr), sizeof(*addr)) != 0 || ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(addr), &len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

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
  // Takes an accepted socket (same timeouts as Connect).
  void Adopt(int fd) {
    Close();
    fd_ = fd;
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }

 private:
  int fd_ = -1;
};

// A blocking listening socket on 127.0.0.1 (ephemeral port), for a peer whose bytes a
// test writes by hand.
class RawListener {
 public:
  ~RawListener() {
    if (fd_ >= 0) ::close(fd_);
  }
  // Returns the bound port, or 0 on failure.
  int Start() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd_, 8) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return 0;
    }
    timeval tv{5, 0};  // accept gives up after 5 s
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return ntohs(addr.sin_port);
  }
  bool Accept(RawSocket* s) {
    int fd = ::accept(fd_, nullptr, nullptr);
    if (fd < 0) return false;
    s->Adopt(fd);
    return true;
  }

 private:
  int fd_ = -1;
};

// Requests with these user_cmd values are treated specially by EchoServer.
inline constexpr int32_t kCmdSilent = 99;  // never answered
inline constexpr int32_t kCmdSplit = 98;   // echoed as an 8-byte head + the rest as a tail slice

// A Messenger on its own loop that answers every request with its own payload, and
// records every open and close (with the reason) for the test thread to wait on.
class EchoServer {
 public:
  explicit EchoServer(TransportOptions options = TransportOptions(), std::string name = "server")
      : loop_(name) {
    Messenger::Handlers h;
    h.on_request = [this](ConnId c, Frame&& f) {
      ++requests_;
      if (f.meta.user_cmd() == kCmdSilent) return;
      if (f.meta.user_cmd() == kCmdSplit && f.payload && f.payload->size() > 8) {
        Payload p;
        p.head = Buffer::FromString(std::string(f.payload->view().substr(0, 8)));
        p.tail.push_back(Slice{f.payload, f.payload->data() + 8, f.payload->size() - 8});
        messenger_->Reply(c, f.meta, Status::Ok(), std::move(p)).IgnoreError();
        return;
      }
      messenger_->Reply(c, f.meta, Status::Ok(), std::move(f.payload)).IgnoreError();
    };
    h.on_open = [this](ConnId c, bool accepted) {
      std::lock_guard<std::mutex> lock(mu_);
      opened_.push_back(c);
      cv_.notify_all();
    };
    h.on_close = [this](ConnId c, const Status& why) {
      std::lock_guard<std::mutex> lock(mu_);
      closed_.emplace_back(c, why);
      cv_.notify_all();
    };
    messenger_ = std::make_unique<Messenger>(&loop_, options, std::move(h));
  }
  ~EchoServer() { Stop().IgnoreError(); }

  // Starts the loop and listens on 127.0.0.1:port (0 = any); returns the bound port.
  int Start(int port = 0) {
    REQUIRE(loop_.Start().ok());
    Result<int> r = OnLoop(loop_, [&] { return messenger_->transport().Listen("127.0.0.1", port); });
    REQUIRE(r.ok());
    port_ = *r;
    return port_;
  }
  // Stops the loop (closing every connection) and frees the messenger.
  Status Stop() {
    if (stopped_) return Status::Ok();
    stopped_ = true;
    Status st = loop_.Stop();
    messenger_.reset();
    return st;
  }

  // Waits until at least n connections were accepted; returns the n-th one's id.
  ConnId WaitOpened(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, kWait, [&] { return opened_.size() >= n; })) {
      FAIL("server never saw connection #" << n);
    }
    return opened_[n - 1];
  }
  // Waits for the close of connection `id`; returns its reason.
  Status WaitClosed(ConnId id) {
    std::unique_lock<std::mutex> lock(mu_);
    Status found(Code::kInternal, "not closed");
    bool ok = cv_.wait_for(lock, kWait, [&] {
      for (auto& [c, why] : closed_) {
        if (c == id) {
          found = why;
          return true;
        }
      }
      return false;
    });
    if (!ok) FAIL("server never closed connection " << id);
    return found;
  }
  bool IsClosed(ConnId id) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [c, why] : closed_) {
      if (c == id) return true;
    }
    return false;
  }

  EventLoop& loop() { return loop_; }
  Messenger& messenger() { return *messenger_; }
  int port() const { return port_; }
  uint64_t requests() const { return requests_.load(); }

 private:
  EventLoop loop_;
  std::unique_ptr<Messenger> messenger_;
  int port_ = 0;
  bool stopped_ = false;
  std::atomic<uint64_t> requests_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ConnId> opened_;
  std::vector<std::pair<ConnId, Status>> closed_;
};

// One synchronous echo round trip over a raw socket; true when the answer matches.
inline bool RawEcho(RawSocket& s, uint64_t request_id, const std::string& payload) {
  if (!s.SendAll(EncodeFrame(TestMeta(request_id), payload))) return false;
  pb::MessageMeta meta;
  std::string got;
  if (!s.RecvFrame(&meta, &got)) return false;
  return meta.is_response() && meta.request_id() == request_id && got == payload;
}

}  // namespace pscore::comm::testing
