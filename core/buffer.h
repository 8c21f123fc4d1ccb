// Buffer: an owned, immutable-after-fill byte block shared by pointer.
// Payloads travel as std::shared_ptr<Buffer> so neither send nor receive copies them:
// the sender keeps a reference until the write completes; the receiver reads straight
// into a Buffer sized from the frame header. Any thread may hold a reference.
// Up to kSmallBytes live inside the object (one allocation with the reference count);
// storage is 16-byte aligned either way.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

namespace pscore {

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

  static constexpr size_t kSmallBytes = 64;

  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view view() const { return std::string_view(data_, size_); }

  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (data_ != small_) delete[] data_;
  }

 private:
  struct Private {};  // Only Allocate may construct (through make_shared).

 public:
  Buffer(Private, size_t size) : data_(size <= kSmallBytes ? small_ : new char[size]), size_(size) {}

 private:
  char* data_;
  size_t size_;
  alignas(16) char small_[kSmallBytes];
};

using BufferPtr = std::shared_ptr<Buffer>;

}  // namespace pscore
