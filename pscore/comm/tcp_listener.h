// TcpListener: a listening TCP socket on an EventLoop, the one accept path of comm (the
// Transport's listeners and the HTTP server). Each accepted socket goes to the owner as an
// initialised uv_tcp_t that the owner then owns, unless the owner's admit check refuses it:
// then it is closed at once (accepting drains the kernel's backlog).
// Made and closed by its owner on the loop thread; it frees itself in its close callback.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "pscore/core/clock.h"
#include "pscore/core/status.h"

struct uv_tcp_s;

namespace pscore::comm {

class EventLoop;

// A cap on accepted connections open at once. Over it Admit counts a refusal and logs a
// line, at most one a second (a flood of refusals must not flood the log).
class AcceptCap {
 public:
  AcceptCap(std::string who, size_t max_open) : who_(std::move(who)), max_open_(max_open) {}
  // True when one more may open beside the `open` ones (always with a cap of 0).
  bool Admit(size_t open);
  uint64_t refused() const { return refused_; }

 private:
  std::string who_;
  size_t max_open_;
  uint64_t refused_ = 0;
  TimePoint last_log_{};
};

class TcpListener {
 public:
  struct Callbacks {
    std::function<bool()> admit;              // optional: false refuses the socket
    std::function<void(uv_tcp_s*)> accepted;  // takes ownership of the handle
  };
  // Binds host:port (port 0 picks a free one) and listens. `who` names the listener in logs.
  static Result<TcpListener*> Open(EventLoop* loop, const std::string& host, int port, std::string who,
                                   Callbacks callbacks);
  // Stops listening; no callback runs after this. *this is freed once libuv lets go.
  void Close();
  int port() const { return port_; }
  // host:port as bound (the port picked when 0 was asked for).
  const std::string& address() const { return address_; }

 private:
  struct Handle;
  TcpListener(EventLoop* loop, std::string who, Callbacks callbacks);
  ~TcpListener();
  static void OnConnection(void* server, int status);
  void Accept();

  EventLoop* loop_;
  std::string who_;
  Callbacks callbacks_;
  Handle* handle_;
  int port_ = 0;
  std::string address_;
};

}  // namespace pscore::comm
