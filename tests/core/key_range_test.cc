#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "pscore/core/key_range.h"

// Catch2 last: glog (via pscore/core/status.h) also defines CHECK, and the last
// definition wins. We want Catch's.
#include <catch2/catch.hpp>

namespace pscore {
namespace core {
namespace {

// Inverse of the position multiplier mod 2^64 (Newton's iteration doubles the
// number of correct low bits each step), so tests can pick a key by position.
uint64_t InverseMultiplier() {
  uint64_t inv = kKeyPositionMultiplier;  // Correct to 3 bits for an odd number.
  for (int i = 0; i < 6; ++i) inv *= 2 - kKeyPositionMultiplier * inv;
  return inv;
}

uint64_t KeyAtPosition(uint64_t position) { return position * InverseMultiplier(); }

// Positions worth probing for n servers: the ends of the space, every range
// boundary +-1, and random samples.
std::vector<uint64_t> ProbePositions(const std::vector<KeyRange>& ranges, std::mt19937_64* rng) {
  std::vector<uint64_t> probes = {0, 1, 2, UINT64_MAX, UINT64_MAX - 1, 1ULL << 63};
  for (const KeyRange& r : ranges) {
    for (uint64_t b : {r.begin, r.end}) {
      probes.push_back(b);
      probes.push_back(b - 1);
      probes.push_back(b + 1);
    }
  }
  for (int i = 0; i < 200; ++i) probes.push_back((*rng)());
  return probes;
}

TEST_CASE("position multiplier is a bijection and inverse works", "[core][keyrange]") {
  CHECK(kKeyPositionMultiplier * InverseMultiplier() == 1);
  for (uint64_t p : std::vector<uint64_t>{0, 1, 12345, UINT64_MAX}) CHECK(KeyPosition(KeyAtPosition(p)) == p);
}

TEST_CASE("partitions cover the position space exactly once for 1..17 servers",
          "[core][keyrange]") {
  for (int n = 1; n <= 17; ++n) {
    INFO("servers " << n);
    const std::vector<KeyRange> ranges = PartitionKeys(n);
    REQUIRE(ranges.size() == static_cast<size_t>(n));
    CHECK(ranges.front().begin == 0);
    CHECK(ranges.back().end == UINT64_MAX);
    for (int s = 0; s + 1 < n; ++s) {
      CHECK(ranges[s].end == ranges[s + 1].begin);  // Contiguous, no gap, no overlap.
      CHECK(ranges[s].end > ranges[s].begin);
      CHECK(ranges[s].end != UINT64_MAX);
    }
    // Near-equal: sizes differ by at most one (the last one counts UINT64_MAX too).
    const uint64_t base = UINT64_MAX / static_cast<uint64_t>(n);
    for (int s = 0; s < n; ++s) {
      uint64_t size = ranges[s].end - ranges[s].begin + (s + 1 == n ? 1 : 0);
      if (n == 1) CHECK(size == 0);  // 2^64 wraps to 0: the whole space.
      else CHECK((size == base || size == base + 1));
    }
  }
  CHECK(PartitionKeys(0).empty());
  CHECK(PartitionKeys(-3).empty());
}

TEST_CASE("every probed key lies in exactly one range and ServerForKey agrees",
          "[core][keyrange]") {
  std::mt19937_64 rng(42);
  for (int n = 1; n <= 17; ++n) {
    INFO("servers " << n);
    const std::vector<KeyRange> ranges = PartitionKeys(n);
    for (uint64_t position : ProbePositions(ranges, &rng)) {
      for (uint64_t key : {position, KeyAtPosition(position)}) {
        int owners = 0;
        int owner = -1;
        for (int s = 0; s < n; ++s) {
          if (ranges[s].ContainsKey(key)) {
            ++owners;
            owner = s;
          }
        }
        INFO("key " << key);
        REQUIRE(owners == 1);
        CHECK(ServerForKey(key, n) == owner);
        CHECK(ServerForPosition(KeyPosition(key), n) == owner);
      }
    }
  }
  CHECK(ServerForKey(5, 0) == -1);
}

TEST_CASE("small dense keys spread evenly over servers", "[core][keyrange]") {
  const int n = 8;
  std::vector<int> counts(n, 0);
  for (uint64_t key = 0; key < 8000; ++key) ++counts[ServerForKey(key, n)];
  for (int c : counts) {
    CHECK(c > 800);  // Raw-value ranges would put all 8000 on server 0.
    CHECK(c < 1200);
  }
}

TEST_CASE("SliceByServer gives contiguous per-server index ranges", "[core][keyrange]") {
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 1000; ++k) keys.push_back(k * 7 + 3);
  keys.push_back(UINT64_MAX);
  keys.push_back(0);
  SortKeysByPosition(&keys);
  for (int n = 1; n <= 17; ++n) {
    INFO("servers " << n);
    const auto slices = SliceByServer(keys, n);
    REQUIRE(slices.size() == static_cast<size_t>(n));
    int expected_first = 0;
    for (int s = 0; s < n; ++s) {
      CHECK(slices[s].first == expected_first);
      CHECK(slices[s].second >= slices[s].first);
      for (int i = slices[s].first; i < slices[s].second; ++i) CHECK(ServerForKey(keys[i], n) == s);
      expected_first = slices[s].second;
    }
    CHECK(expected_first == static_cast<int>(keys.size()));
  }
  CHECK(SliceByServer(keys, 0).empty());
  const auto empty = SliceByServer({}, 3);
  REQUIRE(empty.size() == 3);
  for (const auto& s : empty) CHECK((s.first == 0 && s.second == 0));
}

TEST_CASE("a resyncing server copies each range its chain holds from the range's live primary",
          "[core][keyrange][resync]") {
  // 3 servers, 2 copies: rank 1 holds range 1 (chain 1, 2) and range 0 (chain 0, 1).
  CHECK(ResyncSources(1, 3, 2, {1, 0, 1}) == std::vector<std::pair<int, int>>{{0, 0}, {1, 2}});
  // Rank 0 holds ranges 0 and 2 (chain 2, 0); with rank 2 down too range 2 has no live copy.
  CHECK(ResyncSources(0, 3, 2, {0, 1, 0}) == std::vector<std::pair<int, int>>{{0, 1}, {2, -1}});
  CHECK(ResyncSources(0, 3, 3, {0, 1, 1}) == std::vector<std::pair<int, int>>{{0, 1}, {1, 1}, {2, 2}});
  CHECK(ResyncSources(0, 3, 1, {0, 1, 1}).empty());  // one copy: nothing to copy from
}

}  // namespace
}  // namespace core
}  // namespace pscore
