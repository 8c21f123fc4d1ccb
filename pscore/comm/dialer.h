// Dialer: one outgoing connection of a Transport, attempted again after each failure with
// the Backoff policy until ConnectOptions::timeout. Comm-internal: made by
// Transport::Connect, it frees itself when it finishes (answering `done` once). Loop
// thread only.
#pragma once

#include <sys/socket.h>

#include <functional>
#include <string>

#include "pscore/comm/backoff.h"
#include "pscore/comm/transport_types.h"
#include "pscore/core/status.h"

struct uv_tcp_s;
struct uv_connect_s;

namespace pscore::comm {

class EventLoop;

class Dialer {
 public:
  using DoneFn = std::function<void(Result<ConnId>)>;
  // Hands a connected socket to the transport; `ready` runs once the connection may carry
  // frames, or with why it closed before that.
  using AdoptFn = std::function<void(uv_tcp_s* tcp, DoneFn ready)>;
  // The dial is over: the transport forgets it (not called after Cancel).
  using FinishedFn = std::function<void(Dialer*)>;

  Dialer(EventLoop* loop, const ::sockaddr_storage& addr, std::string target, ConnectOptions options,
         AdoptFn adopt, FinishedFn finished, DoneFn done);
  Dialer(const Dialer&) = delete;
  Dialer& operator=(const Dialer&) = delete;

  void Start();
  // The transport shuts down: `done` is answered kCancelled now (an attempt in flight frees
  // *this later, when libuv lets go of it).
  void Cancel();

 private:
  ~Dialer();
  static void OnConnect(uv_connect_s* req, int status);
  void Connected(uv_tcp_s* tcp, int status);
  void SetUserTimeout(uv_tcp_s* tcp) const;  // ConnectOptions::user_timeout, when set
  void Attempt();
  // A failed attempt: another after the backoff, or the dial ends if that would pass the
  // deadline.
  void RetryLater(Status error);
  void Finish(Result<ConnId> result);  // deletes *this

  EventLoop* loop_;
  ::sockaddr_storage addr_;
  std::string target_;
  ConnectOptions options_;
  AdoptFn adopt_;
  FinishedFn finished_;
  DoneFn done_;
  TimePoint deadline_;
  Backoff backoff_;
  uv_tcp_s* tcp_ = nullptr;  // the attempt in flight, if any
  uv_connect_s* req_;
  uint64_t retry_timer_ = 0;
  uint64_t deadline_timer_ = 0;  // ends an attempt still in flight at the deadline
  bool timed_out_ = false;
  bool cancelled_ = false;
  Status last_error_;
  int attempts_ = 0;
};

}  // namespace pscore::comm
