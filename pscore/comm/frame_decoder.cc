#include "pscore/comm/frame_decoder.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace pscore::comm {
namespace {
constexpr size_t kInitialInput = 4 << 10;
constexpr size_t kMaxInput = 128 << 10;  // growth by reads stops here (a 64 KiB meta still fits)
constexpr size_t kMinRoom = 1024;        // never hand out less room than this
// Right after a frame of at least kLargeFrame bytes, a read gets only what completes the
// next frame's head (HeadRoom): the next frame is likely large too, and what a read brings
// of its payload is copied out of the input buffer, while the rest is read straight into
// place. Likewise the buffered read that ends a large frame (its last bytes under
// kDirectReadMin, or a streamed tail's last piece) brings no more than a head after it.
constexpr uint64_t kLargeFrame = 64 << 10;
}  // namespace

// The input buffer is allocated at the first read, so a connection that never speaks
// costs no buffer; it starts at 4 KiB, so a connection of small frames costs little.
FrameDecoder::FrameDecoder(const Limits& limits) : limits_(limits) {}

FrameDecoder::~FrameDecoder() { Uncharge(); }

// A payload under kDirectReadMin is decoded only once it is all in the input buffer (which
// is bounded): it draws nothing.
Status FrameDecoder::Charge(size_t size) {
  if (size <= charged_ || payload_want_ < kDirectReadMin) return Status::Ok();
  const uint64_t more = size - charged_;
  if (budget_ != nullptr && !budget_->TryAcquire(more)) {
    return Status(Code::kResourceExhausted,
                  "frames received in part hold " + std::to_string(budget_->held()) + " bytes, cap " +
                      std::to_string(budget_->limit()) + ": a payload of " + std::to_string(payload_want_) +
                      " bytes (" + std::to_string(payload_filled_) + " received) needs " +
                      std::to_string(more) + " more");
  }
  charged_ = size;
  return Status::Ok();
}

void FrameDecoder::Uncharge() {
  if (budget_ != nullptr && charged_ > 0) budget_->Release(charged_);
  charged_ = 0;
}

Status FrameDecoder::StartPayload(size_t want) {
  payload_want_ = want;
  payload_filled_ = 0;
  payload_ = nullptr;
  return TakePooledOrGrow();
}

Status FrameDecoder::TakePooledOrGrow() {
  const size_t want = payload_want_;
  // What this payload holds of the budget already (a head) is part of what it asks for.
  if (want > kPayloadChunk && (budget_ == nullptr || budget_->held() - charged_ + want <= budget_->limit())) {
    // A block of this size the pool holds already is memory the process has anyway.
    BufferPtr pooled = Buffer::TakePooled(want);
    // Charge fails only when another decoder took the budget meanwhile: grow as the bytes
    // come instead (the block goes back to the pool).
    if (pooled != nullptr && Charge(want).ok()) {
      if (payload_filled_ > 0) {
        std::memcpy(pooled->data(), payload_->data(), payload_filled_);
        copied_payload_bytes_ += payload_filled_;
      }
      payload_ = std::move(pooled);
      return Status::Ok();
    }
  }
  return Grow();
}

// The buffer grows to what has arrived plus max(kPayloadChunk, what has arrived), so the
// memory a peer makes us hold is at most about twice what it sent, plus a chunk. It grows
// before it is full, while at least kDirectReadMin would still fit, so reads of the
// payload keep going straight into place.
Status FrameDecoder::Grow() {
  const size_t have = payload_ != nullptr ? payload_->size() : 0;
  size_t size = static_cast<size_t>(
      std::min<uint64_t>(payload_want_, payload_filled_ + std::max(kPayloadChunk, payload_filled_)));
  if (payload_want_ - size < kDirectReadMin) size = payload_want_;  // no short last step
  if (size <= have) return Status::Ok();
  PSCORE_RETURN_IF_ERROR(Charge(size));
  if (payload_ == nullptr || !payload_->Grow(size)) {
    BufferPtr bigger = Buffer::Allocate(size);
    if (payload_filled_ > 0) {
      std::memcpy(bigger->data(), payload_->data(), payload_filled_);
      copied_payload_bytes_ += payload_filled_;
    }
    payload_ = std::move(bigger);
  }
  return Status::Ok();
}

// Moves the unconsumed bytes to offset `to` of an input buffer of `capacity` bytes: within
// this one when no payload was handed out in place from it, else into a new one.
void FrameDecoder::Relocate(size_t to, size_t capacity) {
  const size_t held = in_end_ - in_begin_;
  if (in_buf_ != nullptr && capacity == in_cap_ && !Shared()) {
    if (held > 0 && to != in_begin_) std::memmove(in_ + to, in_ + in_begin_, held);
  } else {
    BufferPtr fresh = Buffer::Allocate(capacity);  // not zero-filled
    if (held > 0) std::memcpy(fresh->data() + to, in_ + in_begin_, held);
    in_buf_ = std::move(fresh);
    in_ = in_buf_->data();
    in_cap_ = capacity;
    lent_ = false;
  }
  in_begin_ = to;
  in_end_ = to + held;
}

// The offset, below kPayloadAlign, at which the unconsumed bytes keep the stream's
// alignment (the buffer itself is 16-byte aligned).
size_t FrameDecoder::InStep() const { return (received_ - (in_end_ - in_begin_)) % kPayloadAlign; }

void FrameDecoder::Reallocate(size_t capacity) { Relocate(InStep(), capacity); }

char* FrameDecoder::ReadRegion(size_t* size) {
  if (in_ == nullptr) Reallocate(kInitialInput);
  if (grow_) {
    grow_ = false;
    if (in_cap_ < kMaxInput) Reallocate(std::min(in_cap_ * 2, kMaxInput));
  }
  size_t missing = 0;  // of the payload (head or tail) being read
  if (payload_ != nullptr) {
    char* cursor = Cursor(&missing);
    if (cursor != nullptr && missing >= kDirectReadMin) {
      direct_ = true;
      *size = missing;
      return cursor;
    }
  }
  direct_ = false;
  if (in_begin_ == in_end_ && in_end_ % kPayloadAlign != InStep()) {
    // Bytes were read straight into a payload since: back in step with the stream.
    const size_t step = (InStep() + kPayloadAlign - in_end_ % kPayloadAlign) % kPayloadAlign;
    if (!Shared()) {
      in_begin_ = in_end_ = InStep();
    } else if (in_cap_ - in_end_ >= step + kMinRoom) {
      in_begin_ = in_end_ += step;
    } else {
      Reallocate(in_cap_);
    }
  }
  if (in_cap_ - in_end_ < kMinRoom) Compact(kMinRoom);
  last_room_ = in_cap_ - in_end_;  // a read filling it grows the buffer
  *size = last_room_;
  if (payload_ == nullptr) {
    if (after_large_) *size = std::min(last_room_, HeadRoom());
  } else if (frame_bytes_ >= kLargeFrame) {
    *size = std::min<uint64_t>(last_room_, missing + last_head_ + kPayloadAlign);
  }
  return in_ + in_end_;
}

// What a read should bring to complete the next frame's head (header and meta; a small
// frame whole), judged until its header is in from the last frame's head: their metas
// differ in padding by less than kPayloadAlign bytes.
size_t FrameDecoder::HeadRoom() const {
  const size_t held = in_end_ - in_begin_;
  size_t want = last_head_ + kPayloadAlign;
  if (held >= kHeaderBytes) {
    const FrameHeader h = LoadHeader(in_ + in_begin_);  // checked by DecodeBuffered already
    want = kHeaderBytes + h.meta_len + (h.data_len < kDirectReadMin ? h.data_len : 0);
  }
  return want > held ? want - held : kPayloadAlign;
}

// Moves the unconsumed bytes to the front (in step with the stream) and makes room for
// `need` more after them.
void FrameDecoder::Compact(size_t need) {
  const size_t end = InStep() + (in_end_ - in_begin_);  // in_end_ once at the front
  const size_t capacity = end + need > in_cap_ ? end + std::max(need, in_cap_) : in_cap_;
  if (in_begin_ > InStep() || capacity != in_cap_) Relocate(InStep(), capacity);  // one move at most
}

char* FrameDecoder::Cursor(size_t* missing) {
  if (payload_filled_ < payload_want_) {
    *missing = payload_->size() - payload_filled_;
    return payload_->data() + payload_filled_;
  }
  *missing = tail_len_ - tail_filled_;
  return sink_ != nullptr ? sink_ + tail_filled_ : nullptr;
}

Status FrameDecoder::Advance(size_t n) {
  if (payload_filled_ < payload_want_) {
    payload_filled_ += n;
    if (payload_filled_ == payload_want_) {
      if (stream_ && !stream_begun_) return HeadDone();
    } else if (payload_->size() - payload_filled_ < kDirectReadMin) {
      return Grow();
    }
  } else {
    tail_filled_ += n;
  }
  return Status::Ok();
}

Status FrameDecoder::HeadDone() {
  if (stream_->Begin(*payload_, tail_len_)) {
    stream_begun_ = true;
    return Status::Ok();
  }
  // Declined: the tail goes into the payload after its head, as if never offered.
  payload_want_ += tail_len_;
  tail_len_ = 0;
  stream_.reset();
  return TakePooledOrGrow();
}

bool FrameDecoder::ConsumeBuffered() {
  const size_t avail = in_end_ - in_begin_;
  const uint64_t missing = tail_len_ - tail_filled_;
  size_t take = static_cast<size_t>(std::min<uint64_t>(avail, missing));
  if (take < missing) take &= ~size_t{3};  // whole floats until the last piece
  if (take > 0) {
    if ((in_begin_ & 3) != 0) {  // first piece only: later ones start where whole units ended
      Relocate(0, in_cap_);
      copied_payload_bytes_ += avail;
    }
    stream_->Consume(in_ + in_begin_, take);
    in_begin_ += take;
    tail_filled_ += take;
  }
  if (tail_filled_ < tail_len_) {
    // A partial float waits at the front for the rest, so the next read gets full room.
    // In step with the stream where that keeps whole floats aligned (a padded sender's).
    const size_t to = InStep() % 4 == 0 ? InStep() : 0;
    if (in_begin_ != to && (in_end_ > in_begin_ || !Shared())) Relocate(to, in_cap_);
    return false;
  }
  return true;
}

void FrameDecoder::Emit(std::vector<Frame>* out) {
  Uncharge();  // complete: the payload is its receiver's now
  Frame f{std::move(meta_), std::move(payload_), frame_bytes_};
  f.tail_bytes = sink_ != nullptr || stream_begun_ ? tail_len_ : 0;
  f.tail_dropped = tail_dropped_;
  if (stream_begun_) f.stream = std::move(stream_);
  after_large_ = f.wire_bytes >= kLargeFrame;
  last_head_ = head_len_;
  out->push_back(std::move(f));
  meta_.Clear();
  payload_filled_ = 0;
  sink_ = nullptr;
  tail_len_ = tail_filled_ = 0;
  tail_dropped_ = false;
  stream_.reset();
  stream_begun_ = false;
}

void FrameDecoder::DropSink(uint64_t request_id) {
  if (payload_ == nullptr || sink_ == nullptr || meta_.request_id() != request_id) return;
  sink_ = nullptr;
  tail_dropped_ = true;
}

Status FrameDecoder::Commit(size_t n, std::vector<Frame>* out) {
  if (direct_) {
    // The region was one part (head or tail) of the payload: nothing ran in between.
    direct_ = false;
    received_ += n;
    PSCORE_RETURN_IF_ERROR(Advance(n));
    if (PayloadDone()) Emit(out);
    return Status::Ok();
  }
  received_ += n;
  in_end_ += n;
  if (n == last_room_ && n > 0) grow_ = true;
  return DecodeBuffered(out);
}

Status FrameDecoder::Resume(std::vector<Frame>* out) {
  paused_ = false;
  return DecodeBuffered(out);
}

// The payload under way takes what the input buffer holds. *more: it was completed (or a
// streamed piece went out), so decoding goes on; false when the buffer ran dry first.
Status FrameDecoder::TakeBufferedPayload(std::vector<Frame>* out, bool* more) {
  *more = false;
  if (Streaming()) {
    if (!ConsumeBuffered()) return Status::Ok();
    Emit(out);
    *more = true;
    return Status::Ok();
  }
  size_t missing = 0;
  char* cursor = Cursor(&missing);
  size_t take = std::min(in_end_ - in_begin_, missing);
  if (cursor != nullptr && take > 0) {
    std::memcpy(cursor, in_ + in_begin_, take);
    copied_payload_bytes_ += take;
  }
  in_begin_ += take;
  PSCORE_RETURN_IF_ERROR(Advance(take));
  if (take < missing) return Status::Ok();  // all that arrived is consumed
  if (PayloadDone()) Emit(out);
  *more = true;
  return Status::Ok();
}

// Consumes as many complete frames (or payload prefixes) from the input buffer as possible.
Status FrameDecoder::DecodeBuffered(std::vector<Frame>* out) {
  const size_t first = out->size();
  for (;;) {
    size_t avail = in_end_ - in_begin_;
    if (payload_ != nullptr) {
      bool more = false;
      PSCORE_RETURN_IF_ERROR(TakeBufferedPayload(out, &more));
      if (!more) break;
      continue;
    }
    std::optional<FrameHeader> header;
    PSCORE_RETURN_IF_ERROR(
        ParseHeader(std::string_view(in_ + in_begin_, avail), limits_, &header));
    if (!header) break;
    size_t head = kHeaderBytes + header->meta_len;
    // A small frame is decoded once it is all here: its payload may then stay in place.
    const size_t whole = header->data_len < kDirectReadMin ? head + header->data_len : head;
    if (avail < whole) {
      if (in_cap_ - in_begin_ < whole) Compact(whole);
      break;
    }
    if (!meta_.ParseFromArray(in_ + in_begin_ + kHeaderBytes, static_cast<int>(header->meta_len))) {
      return Status(Code::kProtocol, "unparsable meta (" + std::to_string(header->meta_len) +
                                         " bytes)");
    }
    meta_.clear_pad();
    in_begin_ += head;
    if (header->data_len == 0) {
      after_large_ = head >= kLargeFrame;
      last_head_ = head;
      out->push_back(Frame{std::move(meta_), nullptr, head});
      meta_.Clear();
      continue;
    }
    // A sink (or else a stream, for a request) for the tail when the meta names a head
    // inside the payload and the owner wants it; otherwise the payload is received whole.
    const uint64_t head_len = meta_.payload_head();
    const bool split = head_len > 0 && head_len < header->data_len;
    const bool may_stream = split && stream_fn_ && !meta_.is_response();
    if (may_stream && out->size() > first) {
      // The frames before this one must reach the owner first: stop in front of it.
      in_begin_ -= head;
      meta_.Clear();
      paused_ = true;
      break;
    }
    if (split && sink_fn_) {
      sink_ = sink_fn_(meta_, header->data_len - head_len);
      if (sink_ != nullptr) tail_len_ = header->data_len - head_len;
    }
    if (may_stream && sink_ == nullptr) {
      stream_ = stream_fn_(meta_, header->data_len - head_len);
      if (stream_) tail_len_ = header->data_len - head_len;
    }
    char* at = in_ + in_begin_;
    if (sink_ == nullptr && !stream_ && header->data_len < kDirectReadMin &&
        reinterpret_cast<uintptr_t>(at) % kPayloadAlign == 0) {
      // All here, aligned (its sender padded the meta): handed out in place, no copy. This
      // input buffer is not written where it lies again (Shared).
      in_begin_ += header->data_len;
      lent_ = true;
      after_large_ = whole >= kLargeFrame;
      last_head_ = head;
      out->push_back(Frame{std::move(meta_), Buffer::View(in_buf_, at, header->data_len), whole});
      meta_.Clear();
      continue;
    }
    head_len_ = head;
    frame_bytes_ = head + header->data_len;
    PSCORE_RETURN_IF_ERROR(StartPayload(sink_ != nullptr || stream_ ? head_len : header->data_len));
  }
  if (in_begin_ == in_end_ && !Shared()) in_begin_ = in_end_ = InStep();
  return Status::Ok();
}

Status FrameDecoder::Feed(std::string_view bytes, std::vector<Frame>* out) {
  while (!bytes.empty()) {
    size_t room = 0;
    char* region = ReadRegion(&room);
    size_t n = std::min(room, bytes.size());
    std::memcpy(region, bytes.data(), n);
    bytes.remove_prefix(n);
    PSCORE_RETURN_IF_ERROR(Commit(n, out));
  }
  while (paused_) PSCORE_RETURN_IF_ERROR(Resume(out));
  return Status::Ok();
}

}  // namespace pscore::comm
