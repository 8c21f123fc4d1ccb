// Monotonic clock abstraction so core logic can be driven by a fake clock in tests.
// SteadyClock is thread-safe; FakeClock is for single-threaded tests.
#pragma once

#include <chrono>
#include <cstdint>

namespace pscore {

using TimePoint = std::chrono::steady_clock::time_point;
using Duration = std::chrono::steady_clock::duration;
using Millis = std::chrono::milliseconds;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class SteadyClock : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

class FakeClock : public Clock {
 public:
  TimePoint Now() const override { return now_; }
  void Advance(Duration d) { now_ += d; }

 private:
  TimePoint now_{std::chrono::hours(1)};
};

inline int64_t ToMillis(Duration d) {
  return std::chrono::duration_cast<Millis>(d).count();
}

}  // namespace pscore
