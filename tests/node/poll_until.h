// PollUntil: asks `pred` every 5 ms until it holds (true) or `timeout` passed (false), for
// state a test can only read, not wait on (counters, files, another thread's progress).
#pragma once

#include <chrono>
#include <thread>

namespace pscore::testing {

template <typename Pred>
bool PollUntil(Pred pred, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace pscore::testing
