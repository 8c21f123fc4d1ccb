#include "pscore/core/buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "pscore/core/sanitizers.h"

namespace pscore {

namespace {
constexpr uintptr_t kHuge = uintptr_t{2} << 20;
}  // namespace

void AdviseHugePages(void* data, size_t bytes) {
#ifdef MADV_HUGEPAGE
  if (bytes < 2 * kHuge) return;
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t last = (begin + bytes) & ~(kHuge - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);  // advice only
#else
  (void)data;
  (void)bytes;
#endif
}

namespace {

// Released large blocks by capacity. Never destroyed (blocks may be released during
// static destruction); what it holds stays reachable, so leak checkers do not report it.
struct IdleBlock {
  char* data;
  uint64_t released;  // the pool's release count when it came back
};

struct LargeBlockPool {
  std::mutex mu;
  std::map<size_t, std::vector<IdleBlock>> free_blocks;  // guarded by mu
  size_t pooled = 0;                                      // bytes in free_blocks; guarded by mu
  uint64_t releases = 0;                                  // guarded by mu
  // Off by default under AddressSanitizer: a reused block would hide a use after free.
  size_t limit = kAddressSanitizer ? 0 : Buffer::kDefaultPoolLimit;  // guarded by mu
};

LargeBlockPool& Pool() {
  static auto* pool = new LargeBlockPool;
  return *pool;
}

// Takes blocks (largest first) out of the pool until it holds at most `limit`; mu held.
// The caller frees them after unlocking (freeing a large block unmaps it, which is slow,
// and other threads' acquires and releases wait on mu).
using Block = std::pair<char*, size_t>;  // a mapping and its capacity

void TrimLocked(LargeBlockPool& pool, size_t limit, std::vector<Block>* evicted) {
  while (pool.pooled > limit && !pool.free_blocks.empty()) {
    auto last = std::prev(pool.free_blocks.end());
    evicted->emplace_back(last->second.back().data, last->first);
    last->second.pop_back();
    pool.pooled -= last->first;
    if (last->second.empty()) pool.free_blocks.erase(last);
  }
}

// Blocks from kMappedBytes on are anonymous mappings of their own, so one that is still
// being filled can grow without a copy (Buffer::Grow moves its pages with mremap). Smaller
// ones come from the heap (one mapping each would spend the process's mappings).
bool Mapped(size_t capacity) { return capacity >= Buffer::kMappedBytes; }

// A pooled mapping is cut down for a request of at least 1/kMostCut of it. A smaller one
// is mapped fresh, which costs little next to the warm memory a cut would give away: a
// pull's 8 MiB of keys must not take the 256 MiB block its answer is about to need, nor a
// frame decoder's first 256 KiB chunk an 8 MiB block.
constexpr size_t kMostCut = 8;

size_t RoundUpToPage(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// A mapped block is advised whole, not only where it covers whole huge pages: advice on
// part of a mapping splits it in several, and mremap cannot move a range that spans more
// than one (Buffer::Grow would fail with EFAULT and the payload be copied instead).
void AdviseHugeMapping(char* block, size_t capacity) {
#ifdef MADV_HUGEPAGE
  if (capacity >= 2 * kHuge) madvise(block, capacity, MADV_HUGEPAGE);  // advice only
#else
  (void)block;
  (void)capacity;
#endif
}

char* NewBlock(size_t capacity) {
  if (!Mapped(capacity)) return new char[capacity];  // 16-byte aligned, as malloc is
  void* p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();  // as new[] would: fatal (docs/design.md, Layers (errors))
  AdviseHugeMapping(static_cast<char*>(p), capacity);  // not written yet: the reader fills it
  return static_cast<char*>(p);
}

void FreeBlock(char* block, size_t capacity) {
  if (Mapped(capacity)) {
    munmap(block, capacity);
  } else {
    delete[] block;
  }
}

void FreeAll(const std::vector<Block>& blocks) {
  for (const Block& b : blocks) FreeBlock(b.first, b.second);
}

}  // namespace

size_t Buffer::PooledCapacity(size_t size) {
  // Round up to a multiple of a quarter of the largest power of two <= size: at most 25%
  // more than asked, and few distinct capacities for a stream of similar payloads.
  size_t top = size_t{1} << (63 - __builtin_clzll(size));
  size_t step = top >= 4 ? top / 4 : 1;
  return (size + step - 1) / step * step;
}

char* Buffer::TakePooledBlock(size_t capacity, size_t* got) {
  LargeBlockPool& pool = Pool();
  char* block = nullptr;
  size_t had = 0;
  size_t keep = 0;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    // The smallest block that holds `capacity`: a message of a size between the ones in
    // use (a pull's request beside the pushes' payloads) reuses mapped memory instead of
    // faulting in fresh pages. One more than twice as large, up to kMostCut times, is cut
    // down to the need when both are mappings (its tail goes back to the kernel, its head
    // is warm), so a buffer never pins a block much larger; a heap block cannot be cut.
    auto it = pool.free_blocks.lower_bound(capacity);
    if (it == pool.free_blocks.end()) return nullptr;
    had = keep = it->first;
    if (had / 2 > capacity) {
      if (!Mapped(capacity) || had / kMostCut > capacity) return nullptr;
      keep = RoundUpToPage(capacity);
    }
    block = it->second.back().data;
    it->second.pop_back();
    pool.pooled -= had;
    if (it->second.empty()) pool.free_blocks.erase(it);
  }
  // The pool no longer lists the block; unmapping its tail is slow, so outside mu.
  if (keep < had) munmap(block + keep, had - keep);
  *got = keep;
  return block;
}

std::shared_ptr<Buffer> Buffer::TakePooled(size_t size) {
  if (size < kPooledBytes) return nullptr;
  size_t capacity = 0;
  char* block = TakePooledBlock(PooledCapacity(size), &capacity);
  if (block == nullptr) return nullptr;
  return std::make_shared<Buffer>(Private{}, size, block, capacity);
}

bool Buffer::Grow(size_t size) {
  if (capacity_ == 0 || size < size_) return false;
  if (size > capacity_) {
    if (!Mapped(capacity_)) return false;
    const size_t capacity = PooledCapacity(size);
#ifdef PSCORE_TSAN
    // ThreadSanitizer does not follow pages that mremap moves: a destination it picks keeps
    // the shadow of what other threads did at that address before, and races that are not
    // there are reported. Here the block moves onto a range mmap just returned (whose shadow
    // mmap resets), with MREMAP_FIXED; the pages still move, nothing is copied.
    void* fresh = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fresh == MAP_FAILED) return false;
    void* moved = mremap(data_, capacity_, capacity, MREMAP_MAYMOVE | MREMAP_FIXED, fresh);
    if (moved == MAP_FAILED) {
      munmap(fresh, capacity);
      return false;
    }
#else
    void* moved = mremap(data_, capacity_, capacity, MREMAP_MAYMOVE);
    if (moved == MAP_FAILED) return false;
#endif
    data_ = static_cast<char*>(moved);
    capacity_ = capacity;
    AdviseHugeMapping(data_, capacity_);
  }
  size_ = size;
  return true;
}

char* Buffer::AcquireLarge(size_t capacity, size_t* got) {
  if (char* pooled = TakePooledBlock(capacity, got)) return pooled;
  *got = capacity;
  return NewBlock(capacity);
}

void Buffer::ReleaseLarge(char* block, size_t capacity) {
  LargeBlockPool& pool = Pool();
  std::vector<Block> evicted;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    const uint64_t now = ++pool.releases;
    // The sizes in use now are the ones worth keeping: room is made by freeing blocks of
    // other capacities. Smaller ones always (a stream of 64 MiB pushes after 16 MiB ones
    // must not find the pool full of 16 MiB blocks); larger ones only once they have sat
    // idle through kIdleReleases releases (a step's 8 MiB pull request must not push out
    // the 256 MiB block its answer takes next, but a pool full of blocks of a size no
    // longer used makes room). Without room enough that way, the released block is freed.
    auto evictable = [&](size_t cap, const IdleBlock& b) {
      return cap != capacity && (cap < capacity || now - b.released > kIdleReleases);
    };
    if (capacity <= pool.limit && pool.pooled + capacity > pool.limit) {
      const size_t need = pool.pooled + capacity - pool.limit;
      size_t can_free = 0;
      for (auto it = pool.free_blocks.begin(); can_free < need && it != pool.free_blocks.end(); ++it) {
        if (it->first == capacity) continue;
        for (const IdleBlock& b : it->second) {
          if (evictable(it->first, b)) can_free += it->first;
        }
      }
      for (auto it = pool.free_blocks.begin(); can_free >= need && pool.pooled + capacity > pool.limit &&
                                               it != pool.free_blocks.end();) {
        std::vector<IdleBlock>& blocks = it->second;
        for (size_t i = 0; i < blocks.size() && pool.pooled + capacity > pool.limit;) {
          if (!evictable(it->first, blocks[i])) {
            ++i;
            continue;
          }
          evicted.emplace_back(blocks[i].data, it->first);
          pool.pooled -= it->first;
          blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i));
        }
        it = blocks.empty() ? pool.free_blocks.erase(it) : std::next(it);
      }
    }
    if (capacity <= pool.limit && pool.pooled + capacity <= pool.limit) {
      pool.free_blocks[capacity].push_back(IdleBlock{block, now});
      pool.pooled += capacity;
      block = nullptr;
    }
  }
  FreeAll(evicted);
  if (block != nullptr) FreeBlock(block, capacity);
}

void Buffer::SetPoolLimit(size_t bytes) {
  LargeBlockPool& pool = Pool();
  std::vector<Block> evicted;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    pool.limit = bytes;
    TrimLocked(pool, bytes, &evicted);
  }
  FreeAll(evicted);
}

size_t Buffer::PoolLimit() {
  LargeBlockPool& pool = Pool();
  std::lock_guard<std::mutex> lock(pool.mu);
  return pool.limit;
}

size_t Buffer::PooledBytes() {
  LargeBlockPool& pool = Pool();
  std::lock_guard<std::mutex> lock(pool.mu);
  return pool.pooled;
}

BufferPtr Payload::Flatten() const {
  if (tail.empty()) return head;
  BufferPtr out = Buffer::Allocate(size());
  char* at = out->data();
  if (head && head->size() > 0) {
    std::memcpy(at, head->data(), head->size());
    at += head->size();
  }
  for (const Slice& s : tail) {
    if (s.size > 0) std::memcpy(at, s.data, s.size);
    at += s.size;
  }
  return out;
}

}  // namespace pscore
