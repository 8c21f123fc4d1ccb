// Buffer: an owned, immutable-after-fill byte block shared by pointer.
// Payloads travel as std::shared_ptr<Buffer> so neither send nor receive copies them:
// the sender keeps a reference until the write completes; the receiver reads straight
// into a Buffer sized from the frame header. Any thread may hold a reference.
// Up to kSmallBytes live inside the object (one allocation with the reference count).
// From kPooledBytes on, storage comes from a process-wide pool of released blocks (sizes
// rounded up to a quarter of their power of two; a request takes the smallest pooled block
// that holds it), so a stream of large payloads reuses memory instead of faulting in (and
// the kernel zeroing) fresh pages for each one. Blocks from kMappedBytes on are anonymous
// mappings of their own; one more than twice a mapped request's size, up to 8 times, is
// cut down to it (the tail unmapped, so no buffer pins much more than it holds; a request
// under an eighth of every idle block is mapped fresh). Smaller blocks come
// from the heap, where freeing them would let malloc hand their pages back (madvise, then
// a TLB flush on every core) and fault them in again for the next payload; a heap-sized
// request takes a pooled block of up to twice its size, and is never given a cut one.
// The pool keeps at most PoolLimit() bytes (SetPoolLimit; 0 turns it off; 0 by default in
// AddressSanitizer builds, where reuse would hide a use after free); a released
// block that does not fit frees smaller idle blocks first, and larger ones only once they
// have gone unused for kIdleReleases releases (else it is freed itself). Storage is
// 16-byte aligned either way (a View's bytes are where its owner has them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pscore {

// Advice that [data, data + bytes), memory not yet written, be backed by huge pages
// where it covers whole 2 MiB pages (Linux transparent huge pages; nothing elsewhere,
// and nothing for less than 4 MiB). The first write to a fresh 64 MiB block then costs
// about a third of what 4 KiB page faults do (measured with dataplane_bench at 64 MiB).
// For memory inside a larger allocation (a vector's); a Buffer's own mappings are advised
// whole (buffer.cc), so that mremap can still move them.
void AdviseHugePages(void* data, size_t bytes);

class Buffer {
 public:
  // Uninitialised storage of `size` bytes (no zeroing: the reader fills it).
  static std::shared_ptr<Buffer> Allocate(size_t size) {
    return std::make_shared<Buffer>(Private{}, size);  // object and count in one block
  }
  static std::shared_ptr<Buffer> Copy(const void* data, size_t size) {
    auto b = Allocate(size);
    if (size > 0) std::memcpy(b->data(), data, size);
    return b;
  }
  static std::shared_ptr<Buffer> FromString(std::string_view s) { return Copy(s.data(), s.size()); }
  // `size` bytes at `data`, inside memory that `owner` keeps alive, without a copy (e.g. a
  // small payload in a connection's input buffer). Whoever made the view must not change
  // those bytes again (comm::FrameDecoder never writes below a view it handed out).
  static std::shared_ptr<Buffer> View(std::shared_ptr<const void> owner, char* data, size_t size) {
    return std::make_shared<Buffer>(Private{}, std::move(owner), data, size);
  }

  // A buffer of `size` bytes on a pooled block the pool holds now, or null (no new memory
  // is taken): memory the process already holds, for a payload announced but not yet here.
  static std::shared_ptr<Buffer> TakePooled(size_t size);

  static constexpr size_t kSmallBytes = 64;
  static constexpr size_t kPooledBytes = 16 * 1024;
  static constexpr size_t kMappedBytes = 128 * 1024;
  static constexpr size_t kDefaultPoolLimit = size_t{256} << 20;
  // A full pool makes room for a released block by freeing smaller idle blocks, and
  // larger ones only once they have sat idle through this many releases; else the
  // released block is freed.
  static constexpr uint64_t kIdleReleases = 32;

  // The pool of released large blocks (thread-safe). Lowering the limit frees at once.
  static void SetPoolLimit(size_t bytes);
  static size_t PoolLimit();
  static size_t PooledBytes();  // held by the pool now, not in use
  // The capacity a pooled block of `size` bytes gets (exposed for tests).
  static size_t PooledCapacity(size_t size);

  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view view() const { return std::string_view(data_, size_); }
  // While its only holder still fills it: makes the buffer `size` bytes long (not less
  // than now), its bytes kept, without a copy (within its pooled block's capacity, or a
  // mapped block's pages moved by mremap). False when it cannot: not a pooled block, a
  // heap block too small, or no memory.
  bool Grow(size_t size);

  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (owner_) return;  // a view: the owner's memory
    if (capacity_ != 0) {
      ReleaseLarge(data_, capacity_);
    } else if (data_ != small_) {
      delete[] data_;
    }
  }

 private:
  struct Private {};  // Only Allocate may construct (through make_shared).

 public:
  Buffer(Private, size_t size) : size_(size) {
    if (size <= kSmallBytes) {
      data_ = small_;
    } else if (size >= kPooledBytes) {
      data_ = AcquireLarge(PooledCapacity(size), &capacity_);
    } else {
      data_ = new char[size];
    }
  }
  Buffer(Private, size_t size, char* block, size_t capacity) : data_(block), size_(size), capacity_(capacity) {}
  Buffer(Private, std::shared_ptr<const void> owner, char* data, size_t size)
      : data_(data), size_(size), owner_(std::move(owner)) {}

 private:
  // A block of at least `capacity` bytes (its capacity in *got): pooled, or mapped fresh.
  static char* AcquireLarge(size_t capacity, size_t* got);
  // A pooled block of at least `capacity` bytes (its capacity in *got), cut down when it is
  // a mapping over twice as large; null when none fits (a heap-sized request: up to twice
  // its size; a mapped one: up to 8 times).
  static char* TakePooledBlock(size_t capacity, size_t* got);
  static void ReleaseLarge(char* block, size_t capacity);

  char* data_;
  size_t size_;
  size_t capacity_ = 0;  // non-zero: a pooled block of this capacity
  std::shared_ptr<const void> owner_;  // set: a view into memory it keeps alive
  alignas(16) char small_[kSmallBytes];
};

using BufferPtr = std::shared_ptr<Buffer>;

// Bytes in memory owned elsewhere, kept alive and unchanged by `owner` for as long as
// the slice is held: the zero-copy part of a payload (a store's values, a caller's array).
struct Slice {
  std::shared_ptr<const void> owner;
  const char* data = nullptr;
  size_t size = 0;
};

// What a frame carries: the bytes of `head` followed by the `tail` slices, back to back.
// A BufferPtr (or nullptr) converts to a Payload without a tail, so plain payloads read
// as before; a tail lets a sender write memory it does not own without first copying it
// into one buffer (the transport hands every part to writev).
struct Payload {
  BufferPtr head;
  std::vector<Slice> tail;
  // The same immutable head is queued on many connections at once (a fan-out): a
  // transport counts its bytes once toward its total of queued output, and once per
  // connection toward that connection's own cap. Made with Payload::Shared.
  bool shared = false;

  Payload() = default;
  Payload(std::nullptr_t) {}                          // NOLINT: implicit on purpose
  Payload(BufferPtr b) : head(std::move(b)) {}        // NOLINT: implicit on purpose
  static Payload Shared(BufferPtr b) {
    Payload p(std::move(b));
    p.shared = true;
    return p;
  }
  size_t size() const {
    size_t n = head ? head->size() : 0;
    for (const Slice& s : tail) n += s.size;
    return n;
  }
  // Head and tail in one Buffer: the head itself when there is no tail (no copy), null
  // for an empty payload without a head.
  BufferPtr Flatten() const;
};

}  // namespace pscore
