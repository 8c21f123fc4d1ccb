// Memory for the parameter store's runs (param_store.h): blocks of 64 B to 64 KiB, in
// size classes of 2^k and 1.5 x 2^k bytes, carved from 4 MiB slabs advised into huge pages
// (AdviseHugePages, buffer.h) and kept per class once freed, for the next run of any store
// of the process (slabs are never given back). A store creating millions of keys takes
// tens of thousands of such blocks; from the heap every 4 KiB page of them is a page fault
// of its own, from a slab one fault serves 2 MiB. Larger blocks, and every block in a build
// with AddressSanitizer (which then checks their bounds), come from operator new.
// Thread-safe.
#pragma once

#include <cstddef>
#include <vector>

namespace pscore::core {

void* AllocateRunMemory(size_t bytes);
// `bytes` as given to the AllocateRunMemory that returned p.
void FreeRunMemory(void* p, size_t bytes);
// False in a build with AddressSanitizer: every block then comes from operator new.
bool RunMemoryFromSlabs();

// A std::allocator for RunVector: stateless, every instance equal.
template <typename T>
struct RunAllocator {
  using value_type = T;
  RunAllocator() = default;
  template <typename U>
  RunAllocator(const RunAllocator<U>&) {}  // NOLINT: converting, as allocators are
  T* allocate(size_t n) { return static_cast<T*>(AllocateRunMemory(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { FreeRunMemory(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const RunAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const RunAllocator<U>&) const {
    return false;
  }
};

template <typename T>
using RunVector = std::vector<T, RunAllocator<T>>;

}  // namespace pscore::core
