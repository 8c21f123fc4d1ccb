#include "pscore/node/worker/scratch_arrays.h"

#include "pscore/core/buffer.h"

namespace pscore::node {

// The smallest kept array that holds n elements (a large one serves a small request only
// up to twice its need, so one huge pull does not pin its arrays to every later one).
template <typename T>
std::vector<T> ScratchArrays::Take(std::vector<std::vector<T>>& kept, size_t n) {
  if (n * sizeof(T) < kMinBytes) return {};
  std::lock_guard<std::mutex> lock(mu_);
  size_t best = kept.size();
  for (size_t i = 0; i < kept.size(); ++i) {
    const size_t cap = kept[i].capacity();
    if (cap >= n && cap <= 2 * n && (best == kept.size() || cap < kept[best].capacity())) best = i;
  }
  if (best == kept.size()) return {};
  std::vector<T> out = std::move(kept[best]);
  kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(best));
  bytes_ -= out.capacity() * sizeof(T);
  return out;
}

// Room is made by letting the oldest kept arrays go.
template <typename T>
void ScratchArrays::Keep(std::vector<std::vector<T>>& kept, std::vector<T>&& v) {
  const size_t bytes = v.capacity() * sizeof(T);
  if (bytes < kMinBytes) return;
  const size_t limit = Buffer::PoolLimit();
  if (bytes > limit) return;
  std::vector<T> mine = std::move(v);
  mine.clear();
  std::vector<std::vector<T>> gone;  // freed after the lock
  std::lock_guard<std::mutex> lock(mu_);
  while (!kept.empty() && (bytes_ + bytes > limit || kept.size() >= kMaxKept)) {
    bytes_ -= kept.front().capacity() * sizeof(T);
    gone.push_back(std::move(kept.front()));
    kept.erase(kept.begin());
  }
  if (bytes_ + bytes > limit) return;  // the other type's arrays hold the room
  bytes_ += bytes;
  kept.push_back(std::move(mine));
}

template std::vector<uint64_t> ScratchArrays::Take(std::vector<std::vector<uint64_t>>&, size_t);
template std::vector<const float*> ScratchArrays::Take(std::vector<std::vector<const float*>>&, size_t);
template void ScratchArrays::Keep(std::vector<std::vector<uint64_t>>&, std::vector<uint64_t>&&);
template void ScratchArrays::Keep(std::vector<std::vector<const float*>>&, std::vector<const float*>&&);

}  // namespace pscore::node
