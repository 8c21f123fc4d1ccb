// FrameDecoder: incremental decoder of the frame stream of one connection.
// Owned by its Connection; loop thread only. It owns the input buffer and hands the
// reader the region to fill next, so a large payload is read straight into its own
// Buffer (no copy) and header + meta are decoded in place. A frame whose meta names a
// payload head (payload_head) may have the rest of its payload, the tail, read straight
// into memory its owner hands out (SinkFn): an answer lands where the caller wants it;
// or it may be handed piece by piece to a TailStream as it arrives (StreamFn): a request
// is consumed while its bytes are still in cache.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "pscore/comm/frame.h"
#include "pscore/comm/memory_budget.h"
#include "pscore/core/buffer.h"
#include "pscore/core/status.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::comm {

// Takes the tail of a payload piece by piece as it arrives (FrameDecoder::StreamFn).
// Called on the decoder's thread only. Dropped without its frame when the stream breaks
// off (the connection closes mid-frame): its destructor then sees an incomplete tail.
class TailStream {
 public:
  virtual ~TailStream() = default;
  // The head (meta.payload_head bytes, 8-byte aligned) has arrived and `tail` bytes
  // follow: true to take them through Consume, false to receive the payload whole.
  virtual bool Begin(Buffer& head, uint64_t tail) = 0;
  // The tail's next bytes, in order, 4-byte aligned; whole 4-byte units, except that
  // the tail's last piece holds whatever remains.
  virtual void Consume(const char* data, size_t n) = 0;
};

// One decoded frame: the parsed meta and the payload (null when data_len is 0). When the
// payload's tail went to a sink or a stream, payload holds only the head and tail_bytes
// says how many bytes the sink or stream received; when the sink was dropped while they
// arrived, tail_dropped is set and the tail is lost (the frame is only good for being
// discarded).
struct Frame {
  pb::MessageMeta meta;
  BufferPtr payload;
  uint64_t wire_bytes = 0;  // header + meta + payload as received (0: not from the wire)
  uint64_t tail_bytes = 0;
  bool tail_dropped = false;
  std::shared_ptr<TailStream> stream = nullptr;  // the stream that took the tail, if one did
};

class FrameDecoder {
 public:
  // Payload bytes still missing at or above this size are read directly into the payload
  // buffer; smaller tails go through the input buffer to save syscalls (one small copy).
  static constexpr size_t kDirectReadMin = 16 << 10;
  // Memory for a payload is committed as its bytes arrive, never from the length its
  // header announces: its buffer starts at this size at most and grows, without a copy
  // (Buffer::Grow), to the bytes received plus max(kPayloadChunk, bytes received).
  static constexpr size_t kPayloadChunk = 256 << 10;

  // Asked once per frame whose meta has 0 < payload_head < payload size, right after the
  // meta is parsed: memory for exactly `tail` bytes (the payload after its head), or null
  // to receive the payload whole as usual. The memory is written as the bytes arrive.
  using SinkFn = std::function<char*(const pb::MessageMeta& meta, uint64_t tail)>;

  // Asked, like SinkFn, for a request (not is_response) whose meta names a payload head
  // when SinkFn gave no memory: a stream for the tail, or null to receive the payload
  // whole. The stream's Begin decides once the head is in. It is asked only once every
  // earlier frame has been handed out and delivered: when frames came out of the same
  // Commit before it, the decoder stops in front of that frame (paused) and goes on at
  // Resume, so the owner sees the stream's frame after everything sent before it.
  using StreamFn = std::function<std::shared_ptr<TailStream>(const pb::MessageMeta& meta, uint64_t tail)>;

  explicit FrameDecoder(const Limits& limits);
  ~FrameDecoder();
  FrameDecoder(const FrameDecoder&) = delete;
  FrameDecoder& operator=(const FrameDecoder&) = delete;
  // Every byte of payload memory held for a frame not yet complete is drawn from `budget`
  // (null: no cap). A frame that needs more than it has left fails Commit with
  // kResourceExhausted: the connection is closed, the bytes it held go back.
  void set_budget(std::shared_ptr<MemoryBudget> budget) { budget_ = std::move(budget); }
  // Payload bytes this decoder holds now for the frame being received.
  uint64_t held_bytes() const { return charged_; }
  // Changes the largest payload accepted from the next frame header on (a connection
  // still proving its token takes only handshake-sized frames).
  void set_max_message_bytes(uint64_t bytes) { limits_.max_message_bytes = bytes; }

  void set_sink(SinkFn fn) { sink_fn_ = std::move(fn); }
  void set_stream(StreamFn fn) { stream_fn_ = std::move(fn); }
  // If the frame being received has its tail going to a sink and carries `request_id`,
  // nothing more is written there: the rest of the tail is read and dropped.
  void DropSink(uint64_t request_id);

  // The region the next read should fill. Never empty.
  char* ReadRegion(size_t* size);
  // `n` bytes were written into the region last returned by ReadRegion. Appends every
  // completed frame to *out. A non-OK status means the stream is corrupt: close it.
  Status Commit(size_t n, std::vector<Frame>* out);
  // After Commit (or Resume) stopped in front of a frame that may be streamed, once the
  // frames it returned are delivered: decodes on from there.
  bool paused() const { return paused_; }
  Status Resume(std::vector<Frame>* out);
  // Convenience for tests and fuzzers: copies `bytes` through ReadRegion/Commit (and
  // Resume while paused).
  Status Feed(std::string_view bytes, std::vector<Frame>* out);

  // True when part of a frame has been received but not all of it.
  bool mid_frame() const { return in_end_ > in_begin_ || payload_ != nullptr; }
  // Payload bytes copied out of the input buffer, or moved in it to align a streamed
  // tail, and a declined stream's head (for copy accounting; moving a partial frame to the
  // front of the buffer is not counted).
  uint64_t copied_payload_bytes() const { return copied_payload_bytes_; }

 private:
  Status DecodeBuffered(std::vector<Frame>* out);
  Status TakeBufferedPayload(std::vector<Frame>* out, bool* more);
  // The payload being received: where its next bytes go (null: dropped) and how many of
  // the current part (head, then tail) are still missing.
  char* Cursor(size_t* missing);
  [[nodiscard]] Status Advance(size_t n);
  bool PayloadDone() const { return payload_filled_ == payload_want_ && tail_filled_ == tail_len_; }
  // The head of a payload offered to a stream is in: Begin, or the payload whole.
  [[nodiscard]] Status HeadDone();
  bool Streaming() const { return stream_begun_ && payload_filled_ == payload_want_; }
  // Starts receiving a payload (or its head) of `want` bytes.
  [[nodiscard]] Status StartPayload(size_t want);
  // Room for all payload_want_ bytes from a pooled block when the pool has one and the
  // budget allows (the bytes received so far copied in), else as Grow gives it.
  [[nodiscard]] Status TakePooledOrGrow();
  // Makes room for the payload's next bytes (see kPayloadChunk), drawn from the budget.
  [[nodiscard]] Status Grow();
  [[nodiscard]] Status Charge(size_t size);
  void Uncharge();
  // Hands the buffered tail bytes to the stream; false when more must be read.
  bool ConsumeBuffered();
  void Emit(std::vector<Frame>* out);
  void Compact(size_t need);
  void Reallocate(size_t capacity);
  void Relocate(size_t to, size_t capacity);
  size_t InStep() const;
  size_t HeadRoom() const;
  // A payload was handed out in place (a view) from this input buffer: bytes before
  // in_begin_ must not be written, so moves and rewinds take a new buffer. (Not the use
  // count: a view released on another thread would give no happens-before with the
  // loop thread's next write; a buffer given back to the pool or freed does.)
  bool Shared() const { return lent_; }

  Limits limits_;
  // Input buffer, not zero-filled: starts small (most connections carry small frames) and
  // doubles, up to kMaxInput, whenever a read fills all the room it was given. Its bytes
  // are kept in step with the stream modulo kPayloadAlign (offset i holds a stream byte
  // whose position is i mod 8), so the payloads of padded frames lie aligned in it.
  BufferPtr in_buf_;
  char* in_ = nullptr;  // in_buf_'s bytes
  bool lent_ = false;   // a view of in_buf_ was handed out
  uint64_t received_ = 0;  // bytes of the stream received so far
  size_t in_cap_ = 0;
  size_t last_room_ = 0;   // room handed out by the last buffered ReadRegion
  bool grow_ = false;      // the last buffered read filled its room
  bool after_large_ = false;  // the last frame was large (kLargeFrame): read little next
  size_t last_head_ = 0;      // header + meta bytes of the last frame
  size_t head_len_ = 0;       // of the frame whose payload is being received
  size_t in_begin_ = 0;  // first unconsumed byte
  size_t in_end_ = 0;    // one past the last received byte
  // Set while a payload is being received.
  pb::MessageMeta meta_;
  BufferPtr payload_;        // holds payload_filled_ bytes; its size grows to payload_want_
  size_t payload_want_ = 0;  // bytes it must hold when complete (the head, if a tail goes elsewhere)
  size_t payload_filled_ = 0;
  std::shared_ptr<MemoryBudget> budget_;
  uint64_t charged_ = 0;     // drawn from budget_ for payload_
  uint64_t frame_bytes_ = 0;  // wire size of the frame whose payload is being read
  // Tail of the payload being received, when it goes to a sink (tail_len_ 0: none).
  SinkFn sink_fn_;
  char* sink_ = nullptr;  // null with tail_len_ > 0: dropped
  uint64_t tail_len_ = 0;
  uint64_t tail_filled_ = 0;
  bool tail_dropped_ = false;
  StreamFn stream_fn_;
  std::shared_ptr<TailStream> stream_;  // offered the tail of the payload being received
  bool stream_begun_ = false;           // and took it (Begin said yes)
  bool paused_ = false;
  bool direct_ = false;  // the last region handed out was inside the payload or the sink
  uint64_t copied_payload_bytes_ = 0;
};

}  // namespace pscore::comm
