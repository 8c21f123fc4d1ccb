// Buffer storage: small buffers inside the object, large ones from the pool of released
// blocks (reused, bounded by the pool limit), every size aligned and intact.
#include <cstdint>
#include <set>
#include <vector>

#include "core/pool_limit_guard.h"
#include "pscore/core/buffer.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore {
namespace {

void Fill(Buffer& b, uint8_t seed) {
  for (size_t i = 0; i < b.size(); ++i) b.data()[i] = static_cast<char>(seed + i * 31);
}

bool Holds(const Buffer& b, uint8_t seed) {
  for (size_t i = 0; i < b.size(); ++i) {
    if (b.data()[i] != static_cast<char>(seed + i * 31)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("buffer: every size is 16-byte aligned and keeps its bytes", "[core][buffer]") {
  std::vector<BufferPtr> held;
  for (size_t size : {size_t{0}, size_t{1}, Buffer::kSmallBytes, Buffer::kSmallBytes + 1, size_t{4096},
                      Buffer::kPooledBytes - 1, Buffer::kPooledBytes, Buffer::kMappedBytes - 1,
                      Buffer::kMappedBytes, size_t{3} << 20}) {
    BufferPtr b = Buffer::Allocate(size);
    REQUIRE(b->size() == size);
    CHECK(reinterpret_cast<uintptr_t>(b->data()) % 16 == 0);
    Fill(*b, static_cast<uint8_t>(size));
    held.push_back(b);
  }
  for (const BufferPtr& b : held) CHECK(Holds(*b, static_cast<uint8_t>(b->size())));
}

TEST_CASE("buffer: pooled capacities round up by at most a quarter", "[core][buffer]") {
  CHECK(Buffer::PooledCapacity(size_t{1} << 20) == size_t{1} << 20);
  CHECK(Buffer::PooledCapacity((size_t{1} << 20) + 1) == (size_t{1} << 20) + (size_t{1} << 18));
  CHECK(Buffer::PooledCapacity((size_t{16} << 20) + 24) == size_t{20} << 20);
  for (size_t size = Buffer::kPooledBytes; size < (size_t{1} << 30); size = size * 3 / 2 + 7) {
    size_t cap = Buffer::PooledCapacity(size);
    CHECK(cap >= size);
    CHECK(cap <= size + size / 4);
    CHECK(Buffer::PooledCapacity(cap) == cap);  // a capacity is its own class
  }
}

TEST_CASE("buffer: a released large block is reused, within the pool limit", "[core][buffer]") {
  PoolLimitGuard guard;
  Buffer::SetPoolLimit(0);  // empty: earlier tests may have left blocks in it
  Buffer::SetPoolLimit(Buffer::kDefaultPoolLimit);
  const size_t size = (size_t{2} << 20) + 100;
  const char* first = nullptr;
  {
    BufferPtr b = Buffer::Allocate(size);
    first = b->data();
  }
  CHECK(Buffer::PooledBytes() >= Buffer::PooledCapacity(size));
  BufferPtr again = Buffer::Allocate(size - 50);  // the same capacity class
  CHECK(again->data() == first);
  CHECK(again->size() == size - 50);
  Fill(*again, 7);
  CHECK(Holds(*again, 7));

  // Two at once: the second is a fresh block.
  BufferPtr other = Buffer::Allocate(size);
  CHECK(other->data() != again->data());
  again.reset();
  other.reset();

  // A full pool makes room for the size released now by freeing blocks of other sizes.
  const size_t big = size * 4;
  Buffer::SetPoolLimit(Buffer::PooledCapacity(big) + Buffer::PooledCapacity(size));
  Buffer::SetPoolLimit(0);
  Buffer::SetPoolLimit(Buffer::PooledCapacity(big) + Buffer::PooledCapacity(size));
  { BufferPtr b1 = Buffer::Allocate(size), b2 = Buffer::Allocate(size); }  // two small ones pooled
  CHECK(Buffer::PooledBytes() == 2 * Buffer::PooledCapacity(size));
  { BufferPtr b = Buffer::Allocate(big); }
  CHECK(Buffer::PooledBytes() == Buffer::PooledCapacity(big) + Buffer::PooledCapacity(size));

  // Lowering the limit frees what the pool holds; with limit 0 nothing is kept.
  Buffer::SetPoolLimit(0);
  CHECK(Buffer::PooledBytes() == 0);
  { BufferPtr b = Buffer::Allocate(size); }
  CHECK(Buffer::PooledBytes() == 0);

  // A limit smaller than a block keeps none of that size.
  Buffer::SetPoolLimit(size);
  { BufferPtr b = Buffer::Allocate(size); }
  CHECK(Buffer::PooledBytes() == 0);
  Buffer::SetPoolLimit(Buffer::PooledCapacity(size));
  { BufferPtr b = Buffer::Allocate(size); }
  CHECK(Buffer::PooledBytes() == Buffer::PooledCapacity(size));
}

TEST_CASE("buffer: a pooled block serves a smaller request, one request at a time", "[core][buffer]") {
  PoolLimitGuard guard;
  Buffer::SetPoolLimit(0);  // empty: earlier tests may have left blocks in it
  Buffer::SetPoolLimit(Buffer::kDefaultPoolLimit);
  const size_t size = size_t{8} << 20;
  const char* first = nullptr;
  {
    BufferPtr b = Buffer::Allocate(size);
    Fill(*b, 3);
    first = b->data();
  }
  REQUIRE(Buffer::PooledBytes() == Buffer::PooledCapacity(size));
  // A smaller request of at least half takes it whole: its size is its own, the old bytes
  // past it are not part of it.
  BufferPtr reused = Buffer::Allocate(size * 5 / 8);
  CHECK(reused->data() == first);
  CHECK(reused->size() == size * 5 / 8);
  CHECK(Buffer::PooledBytes() == 0);
  // Held at once, two requests never share memory.
  BufferPtr other = Buffer::Allocate(size * 5 / 8);
  CHECK(other->data() != reused->data());
  CHECK((other->data() >= reused->data() + reused->size() || other->data() + other->size() <= reused->data()));
  Fill(*reused, 9);
  Fill(*other, 11);
  CHECK(Holds(*reused, 9));
  CHECK(Holds(*other, 11));
  // Released, the block goes back under its own capacity: a full-size request takes it.
  reused.reset();
  BufferPtr full = Buffer::Allocate(size);
  CHECK(full->data() == first);
  // A block larger than asked grows within it in place, then beyond it, keeping its bytes.
  full.reset();
  BufferPtr grows = Buffer::Allocate(size * 5 / 8);
  CHECK(grows->data() == first);
  Fill(*grows, 5);
  REQUIRE(grows->Grow(size * 7 / 8));
  CHECK(grows->data() == first);
  REQUIRE(grows->Grow(size * 3 / 2));
  CHECK(grows->size() == size * 3 / 2);
  for (size_t i = 0; i < size * 5 / 8; ++i) {
    if (grows->data()[i] != static_cast<char>(5 + i * 31)) FAIL("byte " << i << " changed by Grow");
  }
}

TEST_CASE("buffer: a mapped block grows step by step past the huge-page sizes - every step moves its pages, none refused",
          "[core][buffer]") {
  // As a frame decoder grows a payload: from a 256 KiB chunk, doubling, to 64 MiB. Huge-page
  // advice on part of a block would split its mapping, and the next step's mremap fail.
  PoolLimitGuard guard;
  Buffer::SetPoolLimit(0);  // nothing pooled: every block is mapped fresh
  BufferPtr b = Buffer::Allocate((size_t{256} << 10) + 40);
  Fill(*b, 6);
  size_t filled = b->size();
  for (size_t size = (size_t{512} << 10) + 80; size <= (size_t{64} << 20); size = size * 2) {
    INFO("grown to " << size);
    REQUIRE(b->Grow(size));
    CHECK(b->size() == size);
    // Written as a payload is, so the pages the next step moves are in use.
    for (size_t i = filled; i < size; ++i) b->data()[i] = static_cast<char>(6 + i * 31);
    filled = size;
  }
  CHECK(Holds(*b, 6));
}

TEST_CASE("buffer: a pooled heap block below kMappedBytes is reused, and grows only within its capacity",
          "[core][buffer]") {
  PoolLimitGuard guard;
  Buffer::SetPoolLimit(0);  // empty: earlier tests may have left blocks in it
  Buffer::SetPoolLimit(Buffer::kDefaultPoolLimit);
  const size_t size = Buffer::kPooledBytes * 3 - 40;  // a 64 KiB push's frame, say
  REQUIRE(Buffer::PooledCapacity(size) < Buffer::kMappedBytes);
  const char* first = nullptr;
  {
    BufferPtr b = Buffer::Allocate(size);
    Fill(*b, 1);
    CHECK(Holds(*b, 1));
    first = b->data();
  }
  CHECK(Buffer::PooledBytes() == Buffer::PooledCapacity(size));
  BufferPtr again = Buffer::Allocate(size - 8);
  CHECK(again->data() == first);
  CHECK(Buffer::PooledBytes() == 0);
  // Within the block's capacity it grows in place; past it, not (no pages of its own to
  // move), and the caller copies into a larger buffer.
  Fill(*again, 4);
  REQUIRE(again->Grow(Buffer::PooledCapacity(size)));
  CHECK(again->data() == first);
  CHECK_FALSE(again->Grow(Buffer::kMappedBytes * 2));
  CHECK(again->size() == Buffer::PooledCapacity(size));
  for (size_t i = 0; i < size - 8; ++i) {
    if (again->data()[i] != static_cast<char>(4 + i * 31)) FAIL("byte " << i << " changed by Grow");
  }
  // Lowering the limit hands heap blocks back as it unmaps mapped ones.
  again.reset();
  CHECK(Buffer::PooledBytes() == Buffer::PooledCapacity(size));
  Buffer::SetPoolLimit(0);
  CHECK(Buffer::PooledBytes() == 0);
}

TEST_CASE("buffer: a pooled mapping 2 to 8 times a mapped request's size is cut down to it",
          "[core][buffer]") {
  PoolLimitGuard guard;
  Buffer::SetPoolLimit(0);  // empty: earlier tests may have left blocks in it
  Buffer::SetPoolLimit(Buffer::kDefaultPoolLimit);
  const size_t big = size_t{32} << 20;  // a step's large push, say
  const size_t small = size_t{5} << 20;  // and its pull's answer
  const char* first = nullptr;
  {
    BufferPtr b = Buffer::Allocate(big);
    first = b->data();
  }
  REQUIRE(Buffer::PooledBytes() == Buffer::PooledCapacity(big));
  // A request under Buffer::kMappedBytes gets a heap block, and one under an eighth of
  // the block a fresh mapping (a pull's keys before its answer): the block stays.
  {
    BufferPtr heap = Buffer::Allocate(Buffer::kPooledBytes * 2);
    BufferPtr keys = Buffer::Allocate(big / 8 - (size_t{1} << 20));
    CHECK(heap->data() != first);
    CHECK(keys->data() != first);
    CHECK(Buffer::PooledBytes() == Buffer::PooledCapacity(big));
  }
  const size_t keys_pooled = Buffer::PooledCapacity(big / 8 - (size_t{1} << 20));
  {  // the next request of that size takes that mapping, back in the pool, not the block
    BufferPtr b = Buffer::Allocate(big / 8 - (size_t{1} << 20));
    CHECK(b->data() != first);
  }
  // A mapped request takes the warm head of the mapping; the rest is unmapped, not kept.
  const size_t pooled_heap = Buffer::PooledBytes() - Buffer::PooledCapacity(big) - keys_pooled;
  BufferPtr answer = Buffer::Allocate(small);
  CHECK(answer->data() == first);
  CHECK(Buffer::PooledBytes() == pooled_heap + keys_pooled);
  Fill(*answer, 13);
  CHECK(Holds(*answer, 13));
  // The next large request is fresh; both go back under their own capacities.
  BufferPtr push = Buffer::Allocate(big);
  CHECK(push->data() != first);
  const char* big_block = push->data();
  answer.reset();
  push.reset();
  CHECK(Buffer::PooledBytes() ==
        pooled_heap + keys_pooled + Buffer::PooledCapacity(small) + Buffer::PooledCapacity(big));
  // From then on a step of the two, in either order, takes both from the pool: the small
  // request's own block fits it best, so it never cuts the large one again.
  for (int step = 0; step < 4; ++step) {
    BufferPtr a, b;
    if (step % 2 == 0) {
      a = Buffer::Allocate(small);
      b = Buffer::Allocate(big);
    } else {
      b = Buffer::Allocate(big);
      a = Buffer::Allocate(small);
    }
    CHECK(a->data() == first);
    CHECK(b->data() == big_block);
    Fill(*b, static_cast<uint8_t>(step));
    CHECK(Holds(*b, static_cast<uint8_t>(step)));
  }
  CHECK(Buffer::PooledBytes() ==
        pooled_heap + keys_pooled + Buffer::PooledCapacity(small) + Buffer::PooledCapacity(big));
  // A cut block still grows in place (its pages move by mremap) and frees cleanly.
  BufferPtr grows = Buffer::Allocate(small);
  Fill(*grows, 21);
  REQUIRE(grows->Grow(small * 3));
  for (size_t i = 0; i < small; ++i) {
    if (grows->data()[i] != static_cast<char>(21 + i * 31)) FAIL("byte " << i << " changed by Grow");
  }
  grows.reset();
  Buffer::SetPoolLimit(0);
  CHECK(Buffer::PooledBytes() == 0);
}

TEST_CASE("buffer: a full pool keeps a recently used larger block over a smaller one released now",
          "[core][buffer]") {
  PoolLimitGuard guard;
  Buffer::SetPoolLimit(0);  // empty: earlier tests may have left blocks in it
  const size_t big = size_t{32} << 20;  // a step's push and its pull's answer, say
  const size_t keys = size_t{2} << 20;  // and the pull's keys (a fresh mapping: under 1/8)
  Buffer::SetPoolLimit(2 * Buffer::PooledCapacity(big));
  const char* first = nullptr;
  const char* second = nullptr;
  {
    BufferPtr a = Buffer::Allocate(big), b = Buffer::Allocate(big);
    first = a->data();
    second = b->data();
  }
  REQUIRE(Buffer::PooledBytes() == 2 * Buffer::PooledCapacity(big));
  // Steps of a small request and the two large ones: the small one, released into the
  // full pool, is freed; both large blocks stay and serve every step.
  for (int step = 0; step < 3 * static_cast<int>(Buffer::kIdleReleases); ++step) {
    { BufferPtr k = Buffer::Allocate(keys); }
    CHECK(Buffer::PooledBytes() == 2 * Buffer::PooledCapacity(big));
    BufferPtr a = Buffer::Allocate(big), b = Buffer::Allocate(big);
    const std::set<const char*> got = {a->data(), b->data()};
    CHECK(got == std::set<const char*>{first, second});
  }
  // Larger blocks left unused while more than kIdleReleases blocks come back make room
  // for the size in use now, the longest unused first, one at a time as needed.
  for (uint64_t i = 0; i + 1 < Buffer::kIdleReleases; ++i) {
    BufferPtr k = Buffer::Allocate(keys);
    k.reset();
    CHECK(Buffer::PooledBytes() == 2 * Buffer::PooledCapacity(big));
  }
  { BufferPtr k = Buffer::Allocate(keys); }
  CHECK(Buffer::PooledBytes() == Buffer::PooledCapacity(big) + Buffer::PooledCapacity(keys));
  // A larger block released into a full pool still frees smaller ones at once.
  { BufferPtr a = Buffer::Allocate(big), b = Buffer::Allocate(big); }
  CHECK(Buffer::PooledBytes() == 2 * Buffer::PooledCapacity(big));
}

}  // namespace pscore
