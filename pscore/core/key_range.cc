#include "pscore/core/key_range.h"

#include <algorithm>

namespace pscore {
namespace core {
namespace {

__extension__ typedef unsigned __int128 Uint128;

// First position owned by server `s` of `n`: ceil(s * 2^64 / n). This is the
// exact inverse of ServerForPosition's floor(p * n / 2^64), so the ranges and
// the O(1) lookup can never disagree. Returns 2^64 for s == n (as a Uint128).
Uint128 FirstPosition(int s, int n) {
  const Uint128 numerator = static_cast<Uint128>(static_cast<uint64_t>(s)) << 64;
  const Uint128 denominator = static_cast<Uint128>(static_cast<uint64_t>(n));
  return (numerator + denominator - 1) / denominator;
}

}  // namespace

std::vector<KeyRange> PartitionKeys(int num_servers) {
  std::vector<KeyRange> ranges;
  if (num_servers <= 0) return ranges;
  ranges.reserve(static_cast<size_t>(num_servers));
  for (int s = 0; s < num_servers; ++s) {
    KeyRange r;
    r.begin = static_cast<uint64_t>(FirstPosition(s, num_servers));
    const Uint128 next = FirstPosition(s + 1, num_servers);
    // 2^64 (end of the last range) is stored as UINT64_MAX, inclusive.
    r.end = s + 1 == num_servers ? UINT64_MAX : static_cast<uint64_t>(next);
    ranges.push_back(r);
  }
  return ranges;
}

std::vector<std::pair<int, int>> SliceByServer(const std::vector<uint64_t>& sorted_keys,
                                               int num_servers) {
  std::vector<std::pair<int, int>> slices;
  if (num_servers <= 0) return slices;
  slices.reserve(static_cast<size_t>(num_servers));
  auto by_position = [](uint64_t key, uint64_t position) { return KeyPosition(key) < position; };
  auto first = sorted_keys.begin();
  for (int s = 0; s < num_servers; ++s) {
    auto last = sorted_keys.end();
    if (s + 1 < num_servers) {
      const uint64_t next_begin = static_cast<uint64_t>(FirstPosition(s + 1, num_servers));
      last = std::lower_bound(first, sorted_keys.end(), next_begin, by_position);
    }
    slices.emplace_back(static_cast<int>(first - sorted_keys.begin()),
                        static_cast<int>(last - sorted_keys.begin()));
    first = last;
  }
  return slices;
}

void SortKeysByPosition(std::vector<uint64_t>* keys) {
  std::sort(keys->begin(), keys->end(),
            [](uint64_t a, uint64_t b) { return KeyPosition(a) < KeyPosition(b); });
}

std::vector<int> ReplicaChain(int range, int num_servers, int replicas) {
  std::vector<int> chain;
  if (num_servers <= 0 || range < 0 || range >= num_servers) return chain;
  const int r = std::clamp(replicas, 1, num_servers);
  chain.reserve(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) chain.push_back((range + i) % num_servers);
  return chain;
}

bool HoldsRange(int rank, int range, int num_servers, int replicas) {
  if (num_servers <= 0 || rank < 0 || rank >= num_servers || range < 0 || range >= num_servers) return false;
  const int r = std::clamp(replicas, 1, num_servers);
  return (rank - range + num_servers) % num_servers < r;
}

int PrimaryOf(int range, int num_servers, int replicas, const std::vector<char>& live) {
  for (int rank : ReplicaChain(range, num_servers, replicas)) {
    if (static_cast<size_t>(rank) >= live.size() || live[static_cast<size_t>(rank)] != 0) return rank;
  }
  return -1;
}

std::vector<std::pair<int, int>> ResyncSources(int rank, int num_servers, int replicas,
                                               const std::vector<char>& live) {
  std::vector<std::pair<int, int>> out;
  if (std::clamp(replicas, 1, std::max(num_servers, 1)) <= 1) return out;
  for (int range = 0; range < num_servers; ++range) {
    if (HoldsRange(rank, range, num_servers, replicas)) out.emplace_back(range, PrimaryOf(range, num_servers, replicas, live));
  }
  return out;
}

}  // namespace core
}  // namespace pscore
