// MemoryBudget: a cap on bytes of one kind held at once, drawn on by every Transport (and
// every connection of it) it is given to, e.g. the memory held for frames received in part.
// Shared by pointer; any thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace pscore::comm {

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit) : limit_(limit) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Takes `n` bytes if the total stays within the limit; false (nothing taken) otherwise.
  bool TryAcquire(uint64_t n) {
    uint64_t held = held_.load(std::memory_order_relaxed);
    do {
      if (n > limit_ || held > limit_ - n) {
        refusals_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
    } while (!held_.compare_exchange_weak(held, held + n, std::memory_order_relaxed));
    return true;
  }
  void Release(uint64_t n) { held_.fetch_sub(n, std::memory_order_relaxed); }

  uint64_t limit() const { return limit_; }
  uint64_t held() const { return held_.load(std::memory_order_relaxed); }
  uint64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> held_{0};
  std::atomic<uint64_t> refusals_{0};
};

}  // namespace pscore::comm
