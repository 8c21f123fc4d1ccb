// Handoff: the answer of a blocking call, handed by the loop thread to the user thread that
// waits for it. std::promise::set_value makes a futex call whatever the waiter does (libstdc++
// sets the result under std::call_once, and glibc's pthread_once wakes with a futex call on
// every first run); Put here makes one only when the taker is asleep in Take: one system
// call fewer per blocking call on the loop thread that answers the calls of many threads.
// Shared by the two sides (a std::shared_ptr): a taker that gave up (TakeFor) leaves it to
// the putter.
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <utility>

#include "pscore/core/clock.h"

namespace pscore::node {

template <typename T>
class Handoff {
 public:
  // Once per Handoff (a second value is dropped).
  void Put(T value) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (value_) return;
      value_.emplace(std::move(value));
    }
    ready_.notify_one();  // a futex call only when the taker waits
  }
  // Blocks until Put.
  T Take() {
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [this] { return value_.has_value(); });
    return std::move(*value_);
  }
  // The value, or nullopt when none came within `timeout`.
  std::optional<T> TakeFor(Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ready_.wait_for(lock, timeout, [this] { return value_.has_value(); })) return std::nullopt;
    return std::move(*value_);
  }

 private:
  std::mutex mu_;
  std::condition_variable ready_;
  std::optional<T> value_;  // mu_
};

}  // namespace pscore::node
