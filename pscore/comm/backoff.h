// Backoff: the retry policy of comm's dialers (Transport::Connect, TcpClient): waits that
// double from `initial` up to `max`. A value type; whoever retries owns one.
#pragma once

#include <algorithm>

#include "pscore/core/clock.h"

namespace pscore::comm {

class Backoff {
 public:
  Backoff(Duration initial, Duration max) : initial_(initial), max_(max), next_(initial) {}

  // The wait before the next attempt; the one after it is twice as long, up to max.
  Duration Next() {
    const Duration wait = next_;
    next_ = std::min<Duration>(next_ * 2, max_);
    return wait;
  }
  // What Next() would return now, without moving on.
  Duration Peek() const { return next_; }
  // Back to the initial wait (after a success that lasted).
  void Reset() { next_ = initial_; }

 private:
  Duration initial_;
  Duration max_;
  Duration next_;
};

}  // namespace pscore::comm
