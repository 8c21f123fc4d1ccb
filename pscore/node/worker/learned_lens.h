// LearnedLens: the float counts of keys seen in pull answers written from the store (64 KiB
// or more per key on average). A Pull whose keys are all known allocates its result before
// sending and has the answers read into it; a PullInto given no layout takes them as its
// layout. Owned by WorkerNode; written on its loop thread, read by calling threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "pscore/node/worker/key_indices.h"

namespace pscore::node {

class LearnedLens {
 public:
  // Entries kept at most; past it the table starts over (a bound, rarely reached).
  static constexpr size_t kMax = 1 << 16;

  // Any thread: every key's offset in a result of `keys` back to back, and the total;
  // false when a key's size is not known (then *offsets holds no meaning).
  bool Layout(const std::vector<uint64_t>& keys, std::vector<uint64_t>* offsets, uint64_t* total);
  // Loop thread: remembers the sizes of the keys `indices` of `keys` from one answer (lens
  // in the same order) when the answer was written from the store.
  void Learn(const std::vector<uint64_t>& keys, const KeyIndices& indices, const uint32_t* lens);
  // Loop thread: a result laid out by `expect_off` (total floats) got `lens`. A key whose
  // answer did not teach its new size (a small one) has the old one forgotten.
  void Forget(const std::vector<uint64_t>& keys, const std::vector<uint64_t>& expect_off, uint64_t total,
              const std::vector<uint32_t>& lens);

 private:
  std::mutex mu_;
  std::unordered_map<uint64_t, uint32_t> lens_;  // guarded by mu_
};

}  // namespace pscore::node
