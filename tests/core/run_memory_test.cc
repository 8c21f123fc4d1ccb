// The store's run memory (run_memory.h): blocks of every size class hold what is written
// to them, never overlap while held, are aligned for their values, come back for the next
// block of their class once freed, and stay whole under allocation from several threads.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "pscore/core/run_memory.h"

#include <catch2/catch.hpp>

namespace pscore::core {
namespace {

struct Held {
  unsigned char* p;
  size_t bytes;
  unsigned char fill;
};

// Allocates `count` blocks of sizes from 1 B to 80 KiB (past the largest class), each
// filled with its own byte; checks every one still holds it, then frees them all. Returns
// the blocks found misaligned or changed (no Catch macro: threads call it).
int AllocateFillCheck(uint32_t seed, int count) {
  std::mt19937 rng(seed);
  std::vector<Held> held;
  int bad = 0;
  for (int i = 0; i < count; ++i) {
    const size_t bytes = 1 + rng() % (80 * 1024);
    auto* p = static_cast<unsigned char*>(AllocateRunMemory(bytes));
    if (reinterpret_cast<uintptr_t>(p) % alignof(uint64_t) != 0) ++bad;
    const auto fill = static_cast<unsigned char>(rng());
    std::memset(p, fill, bytes);
    held.push_back({p, bytes, fill});
  }
  for (const Held& h : held) {
    if (!std::all_of(h.p, h.p + h.bytes, [&](unsigned char b) { return b == h.fill; })) ++bad;
  }
  for (const Held& h : held) FreeRunMemory(h.p, h.bytes);
  return bad;
}

TEST_CASE("run memory: blocks of every class hold their bytes and do not overlap", "[core][paramstore]") {
  REQUIRE(AllocateFillCheck(1, 2000) == 0);
  // Held blocks never share a byte (sorted by address, each ends before the next starts).
  std::vector<std::pair<uintptr_t, size_t>> spans;
  for (size_t bytes = 1; bytes <= 70 * 1024; bytes = bytes * 5 / 4 + 1) {
    for (int k = 0; k < 3; ++k) spans.emplace_back(reinterpret_cast<uintptr_t>(AllocateRunMemory(bytes)), bytes);
  }
  std::vector<std::pair<uintptr_t, size_t>> sorted = spans;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i) REQUIRE(sorted[i - 1].first + sorted[i - 1].second <= sorted[i].first);
  for (const auto& s : spans) FreeRunMemory(reinterpret_cast<void*>(s.first), s.second);
}

TEST_CASE("run memory: a freed block of a class serves the next block of that class", "[core][paramstore]") {
  void* a = AllocateRunMemory(4096);
  FreeRunMemory(a, 4096);
  void* b = AllocateRunMemory(4000);  // the same class (4 KiB)
  // From slabs the block comes back; from operator new (AddressSanitizer) it may not.
  if (RunMemoryFromSlabs()) CHECK(b == a);
  std::memset(b, 1, 4000);
  FreeRunMemory(b, 4000);
}

TEST_CASE("run memory: threads allocating and freeing at once keep every block whole", "[core][paramstore]") {
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([t, &bad] {
      for (uint32_t round = 0; round < 5; ++round) bad[t] += AllocateFillCheck(100 + t * 10 + round, 300);
    });
  }
  for (std::thread& th : threads) th.join();
  for (int b : bad) REQUIRE(b == 0);
}

TEST_CASE("run memory: a RunVector grows, shrinks and moves like a std::vector", "[core][paramstore]") {
  RunVector<uint64_t> v;
  for (uint64_t i = 0; i < 20000; ++i) v.push_back(i * 3);  // past the largest class: operator new
  RunVector<uint64_t> w = v;
  v.resize(100);
  v.shrink_to_fit();
  RunVector<uint64_t> moved = std::move(w);
  REQUIRE(moved.size() == 20000);
  for (uint64_t i = 0; i < 20000; ++i) REQUIRE(moved[i] == i * 3);
  REQUIRE(v.size() == 100);
  for (uint64_t i = 0; i < 100; ++i) REQUIRE(v[i] == i * 3);
}

}  // namespace
}  // namespace pscore::core
