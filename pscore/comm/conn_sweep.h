// ConnSweep: the periodic pass over a connection table that closes the connections which
// outstayed a timeout (the Transport's: partial frames, silent peers; the HttpServer's:
// slow requests, idle keep-alives, unread answers, lingering refusals). Its timer runs at a
// quarter of the shortest timeout the table enforces, so a connection is cut within 1.25
// times its timeout. A pass decides first and closes after, so closing never disturbs the
// walk over the table. Loop thread only; the owner stops it before it goes away.
#pragma once

#include <functional>

#include "pscore/core/clock.h"

namespace pscore::comm {

class EventLoop;

class ConnSweep {
 public:
  // The period for a table whose shortest timeout is `shortest`: a quarter of it, at least
  // 10 ms, at most `longest`.
  static Duration Period(Duration shortest, Duration longest = Duration::max());

  // Runs `pass` every `period` from now on; no-op while already running.
  void Start(EventLoop* loop, Duration period, std::function<void()> pass);
  // Idempotent.
  void Stop();
  bool running() const { return timer_ != 0; }

 private:
  EventLoop* loop_ = nullptr;
  uint64_t timer_ = 0;  // the loop's TimerId
};

}  // namespace pscore::comm
