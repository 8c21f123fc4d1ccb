// FrameDecoder: incremental decoder of the frame stream of one connection.
// Owned by its Connection; loop thread only. It owns the input buffer and hands the
// reader the region to fill next, so a large payload is read straight into its own
// Buffer (no copy) and header + meta are decoded in place.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "comm/frame.h"
#include "core/buffer.h"
#include "core/status.h"
#include "proto/comm.pb.h"

namespace pscore::comm {

// One decoded frame: the parsed meta and the payload (null when data_len is 0).
struct Frame {
  pb::MessageMeta meta;
  BufferPtr payload;
  uint64_t wire_bytes = 0;  // header + meta + payload as received (0: not from the wire)
};

class FrameDecoder {
 public:
  // Payload bytes still missing at or above this size are read directly into the payload
  // buffer; smaller tails go through the input buffer to save syscalls (one small copy).
  static constexpr size_t kDirectReadMin = 16 << 10;

  explicit FrameDecoder(const Limits& limits);

  // The region the next read should fill. Never empty.
  char* ReadRegion(size_t* size);
  // `n` bytes were written into the region last returned by ReadRegion. Appends every
  // completed frame to *out. A non-OK status means the stream is corrupt: close it.
  Status Commit(size_t n, std::vector<Frame>* out);
  // Convenience for tests and fuzzers: copies `bytes` through ReadRegion/Commit.
  Status Feed(std::string_view bytes, std::vector<Frame>* out);

  // True when part of a frame has been received but not all of it.
  bool mid_frame() const { return in_end_ > in_begin_ || payload_ != nullptr; }
  // Payload bytes that were copied out of the input buffer (for copy accounting).
  uint64_t copied_payload_bytes() const { return copied_payload_bytes_; }

 private:
  Status DecodeBuffered(std::vector<Frame>* out);
  void Compact(size_t need);
  void Reallocate(size_t capacity);

  Limits limits_;
  // Input buffer, not zero-filled: starts small (most connections carry small frames) and
  // doubles, up to kMaxInput, whenever a read fills all the room it was given.
  std::unique_ptr<char[]> in_;
  size_t in_cap_ = 0;
  size_t last_room_ = 0;   // room handed out by the last buffered ReadRegion
  bool grow_ = false;      // the last buffered read filled its room
  size_t in_begin_ = 0;  // first unconsumed byte
  size_t in_end_ = 0;    // one past the last received byte
  // Set while a payload is being received.
  pb::MessageMeta meta_;
  BufferPtr payload_;
  size_t payload_filled_ = 0;
  uint64_t frame_bytes_ = 0;  // wire size of the frame whose payload is being read
  bool direct_ = false;  // the last region handed out was inside payload_
  uint64_t copied_payload_bytes_ = 0;
};

}  // namespace pscore::comm
