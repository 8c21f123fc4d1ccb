#include "pscore/core/run_memory.h"

#include <array>
#include <cstdlib>
#include <mutex>
#include <new>

#include "pscore/core/buffer.h"
#include "pscore/core/sanitizers.h"

namespace pscore::core {

namespace {

// Under AddressSanitizer every block comes from operator new, so that run bounds are checked.
constexpr bool kFromOperatorNew = kAddressSanitizer;

constexpr size_t kSlabBytes = size_t{4} << 20;
constexpr size_t kSlabAlign = size_t{2} << 20;  // a huge page
constexpr size_t kClasses = 21;                 // 64, 96, 128, 192, ..., 49152, 65536

// Class c holds blocks of ClassBytes(c): 64 << c/2, times 1.5 for odd c. Every size is a
// multiple of 32, so blocks carved back to back from an aligned slab stay 32-aligned.
constexpr size_t ClassBytes(size_t c) { return (size_t{64} << (c / 2)) * (c % 2 == 0 ? 2 : 3) / 2; }
constexpr size_t kMostBytes = ClassBytes(kClasses - 1);
static_assert(kMostBytes == 64 * 1024, "classes end at 64 KiB");

size_t ClassOf(size_t bytes) {
  size_t c = 0;
  while (ClassBytes(c) < bytes) ++c;  // at most 21 steps, against a page fault saved
  return c;
}

struct FreeBlock {
  FreeBlock* next;
};

struct Pool {
  std::mutex mu;
  std::array<FreeBlock*, kClasses> free{};
  char* slab = nullptr;  // the slab being carved, from slab_used on
  size_t slab_used = kSlabBytes;
};

// Never destroyed: runs of stores with static lifetime may be freed during static
// destruction; what it holds stays reachable, so leak checkers do not report it.
Pool& ThePool() {
  static Pool* pool = new Pool;
  return *pool;
}

}  // namespace

bool RunMemoryFromSlabs() { return !kFromOperatorNew; }

void* AllocateRunMemory(size_t bytes) {
  if (kFromOperatorNew || bytes > kMostBytes) return ::operator new(bytes);
  const size_t c = ClassOf(bytes);
  const size_t size = ClassBytes(c);
  Pool& pool = ThePool();
  std::lock_guard<std::mutex> lock(pool.mu);
  if (FreeBlock* b = pool.free[c]) {
    pool.free[c] = b->next;
    return b;
  }
  if (kSlabBytes - pool.slab_used < size) {
    // What is left of the old slab (less than 64 KiB of 4 MiB) stays unused.
    void* slab = std::aligned_alloc(kSlabAlign, kSlabBytes);
    if (slab == nullptr) throw std::bad_alloc();
    AdviseHugePages(slab, kSlabBytes);
    pool.slab = static_cast<char*>(slab);
    pool.slab_used = 0;
  }
  void* p = pool.slab + pool.slab_used;
  pool.slab_used += size;
  return p;
}

void FreeRunMemory(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (kFromOperatorNew || bytes > kMostBytes) return ::operator delete(p);
  Pool& pool = ThePool();
  std::lock_guard<std::mutex> lock(pool.mu);
  const size_t c = ClassOf(bytes);
  pool.free[c] = new (p) FreeBlock{pool.free[c]};
}

}  // namespace pscore::core
