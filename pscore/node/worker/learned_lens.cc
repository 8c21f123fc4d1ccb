#include "pscore/node/worker/learned_lens.h"

#include <numeric>

#include "pscore/core/kv_codec.h"

namespace pscore::node {

// A pull of many small keys (never learned) asks too: the offsets are written only while
// every key so far is known, so it costs a lookup, not a pass over memory of its size.
bool LearnedLens::Layout(const std::vector<uint64_t>& keys, std::vector<uint64_t>* offsets, uint64_t* total) {
  offsets->clear();
  *total = 0;
  if (keys.empty()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (lens_.empty() || lens_.find(keys.front()) == lens_.end()) return false;
  offsets->reserve(keys.size());
  for (uint64_t key : keys) {
    auto it = lens_.find(key);
    if (it == lens_.end()) return false;
    offsets->push_back(*total);
    *total += it->second;
  }
  return true;
}

// Only answers of at least 64 KiB per key on average are learned: a lookup per key is
// nothing beside their values.
void LearnedLens::Learn(const std::vector<uint64_t>& keys, const KeyIndices& indices, const uint32_t* lens) {
  const size_t n = indices.size();
  if (n == 0 || std::accumulate(lens, lens + n, uint64_t{0}) * sizeof(float) < core::kZeroCopyBytes * n) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (lens_.size() + n > kMax) lens_.clear();
  for (size_t j = 0; j < n; ++j) lens_[keys[indices[j]]] = lens[j];
}

void LearnedLens::Forget(const std::vector<uint64_t>& keys, const std::vector<uint64_t>& expect_off, uint64_t total,
                         const std::vector<uint32_t>& lens) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t end = i + 1 < keys.size() ? expect_off[i + 1] : total;
    const uint64_t expected = end - expect_off[i];
    if (lens[i] == expected) continue;
    auto it = lens_.find(keys[i]);
    if (it != lens_.end() && it->second == expected) lens_.erase(it);
  }
}

}  // namespace pscore::node
