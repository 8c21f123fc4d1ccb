// ScratchArrays: a worker's large per-request arrays (a pull's copy of its keys, where each
// key's floats arrived, a part's key indices), kept when a request is done for the next one
// to reuse. Past glibc's mmap threshold every array is fresh memory, whose pages the kernel
// faults in and zeroes on first write: for a pull of millions of keys that costs more than
// the pull's own work. Kept arrays are already mapped. Arrays under kMinBytes are left to
// malloc. At most Buffer::PoolLimit() bytes are kept (none when the pool is off, as in
// AddressSanitizer builds, where reuse would hide a use after free). Any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

namespace pscore::node {

// A part's key indices (size_t) are kept as words too.
static_assert(std::is_same_v<size_t, uint64_t>, "ScratchArrays keeps indices as uint64_t");

class ScratchArrays {
 public:
  static constexpr size_t kMinBytes = size_t{1} << 20;
  // Arrays kept of each type at most.
  static constexpr size_t kMaxKept = 4;

  // An empty vector with room for at least n elements when one is kept, else an empty one.
  std::vector<uint64_t> TakeWords(size_t n) { return Take(words_, n); }
  std::vector<const float*> TakePointers(size_t n) { return Take(pointers_, n); }
  // Keeps v (emptied) when it is large enough and there is room.
  void Give(std::vector<uint64_t>&& v) { Keep(words_, std::move(v)); }
  void Give(std::vector<const float*>&& v) { Keep(pointers_, std::move(v)); }

  size_t kept_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }

 private:
  template <typename T>
  std::vector<T> Take(std::vector<std::vector<T>>& kept, size_t n);
  template <typename T>
  void Keep(std::vector<std::vector<T>>& kept, std::vector<T>&& v);

  mutable std::mutex mu_;
  std::vector<std::vector<uint64_t>> words_;        // guarded by mu_
  std::vector<std::vector<const float*>> pointers_;  // guarded by mu_
  size_t bytes_ = 0;                                 // guarded by mu_: capacity kept, in bytes
};

}  // namespace pscore::node
