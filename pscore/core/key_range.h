// Key partitioning: which server owns which uint64 key.
//
// Keys are not partitioned by raw value: users typically use small dense keys
// (0..N), and range partitioning of raw values would put every one of them on
// server 0. Instead each key has a *position*,
//
//   KeyPosition(key) = key * 0x9E3779B97F4A7C15  (mod 2^64),
//
// a bijection of uint64 (the multiplier is odd, so it is invertible mod 2^64)
// that spreads consecutive keys evenly over the whole space. The position space
// [0, 2^64) is cut into num_servers contiguous ranges of (near-)equal size:
// server s owns every position p with floor(p * n / 2^64) == s. Ranges and
// ServerForKey depend only on the server count, so every node recomputes the
// same partition after a scale-out or scale-in.
//
// Pure functions; any thread may call them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace pscore {
namespace core {

// Fibonacci-hashing multiplier (2^64 / golden ratio, rounded to odd).
inline constexpr uint64_t kKeyPositionMultiplier = 0x9E3779B97F4A7C15ULL;

// The position of a key in the partitioned space (see file comment).
inline uint64_t KeyPosition(uint64_t key) { return key * kKeyPositionMultiplier; }

// A contiguous range of key *positions* (not raw keys). Half-open [begin, end),
// except that a range whose end is UINT64_MAX also contains UINT64_MAX: 2^64
// does not fit in a uint64, so the last range of a partition stores
// end == UINT64_MAX and is inclusive there. Only the last range of a partition
// (of at most 2^63 servers) can end at UINT64_MAX, so the rule is unambiguous.
struct KeyRange {
  uint64_t begin = 0;
  uint64_t end = 0;

  bool ContainsPosition(uint64_t position) const {
    return position >= begin && (position < end || (end == UINT64_MAX && position == UINT64_MAX));
  }
  bool ContainsKey(uint64_t key) const { return ContainsPosition(KeyPosition(key)); }
  bool operator==(const KeyRange& o) const { return begin == o.begin && end == o.end; }
};

// The num_servers ranges of the position space, in server-rank order. They are
// contiguous, disjoint and cover [0, UINT64_MAX] exactly once. Sizes differ by
// at most one. Empty for num_servers <= 0.
std::vector<KeyRange> PartitionKeys(int num_servers);

// The rank of the server owning a key position: floor(position * n / 2^64), in O(1);
// agrees with PartitionKeys. Returns -1 when num_servers <= 0. Inline: a worker asks it
// for every key of a push or pull.
inline int ServerForPosition(uint64_t position, int num_servers) {
  if (num_servers <= 0) return -1;
  __extension__ typedef unsigned __int128 Uint128;
  const Uint128 scaled = static_cast<Uint128>(position) * static_cast<uint64_t>(num_servers);
  return static_cast<int>(scaled >> 64);
}

// The same for a key.
inline int ServerForKey(uint64_t key, int num_servers) { return ServerForPosition(KeyPosition(key), num_servers); }

// Per server, the [first, last) index range of `keys` it owns. `keys` must be
// sorted by KeyPosition (SortKeysByPosition does that); for such a list the
// slices are contiguous, in rank order, and together cover every index once.
// For a list not sorted by position the slices are still well formed but do not
// describe ownership. Empty for num_servers <= 0.
std::vector<std::pair<int, int>> SliceByServer(const std::vector<uint64_t>& sorted_keys,
                                               int num_servers);

// Sorts keys by KeyPosition, the order SliceByServer expects.
void SortKeysByPosition(std::vector<uint64_t>* keys);

// Replication (docs/reliability.md): the range of server rank `range` is held by the
// ranks range, range+1, ..., range+R-1 (mod num_servers), R = min(replicas, num_servers),
// in that order (its replica chain). Empty when range is not in [0, num_servers).
std::vector<int> ReplicaChain(int range, int num_servers, int replicas);

// Whether `rank` is in the replica chain of `range`.
bool HoldsRange(int rank, int range, int num_servers, int replicas);

// The primary of `range`: the first rank of its chain that `live` marks live (live[rank]
// != 0; ranks past live.size() count as live). -1 when every replica is down.
int PrimaryOf(int range, int num_servers, int replicas, const std::vector<char>& live);

// What a resyncing server `rank` copies: each range whose chain holds it, in range order,
// with the range's primary under `live` (-1 when no copy is live). Empty with one replica.
std::vector<std::pair<int, int>> ResyncSources(int rank, int num_servers, int replicas,
                                               const std::vector<char>& live);

}  // namespace core
}  // namespace pscore
