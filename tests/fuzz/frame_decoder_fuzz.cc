// libFuzzer target: comm::FrameDecoder on an arbitrary byte stream, fed in chunks.
// Input: [n: u8][n chunk sizes: u16 LE each][stream bytes]. The stream is fed in chunks of
// the given sizes (cycled; 0 means 1), and the result must equal decoding it in one Feed:
// same frames (meta and payload bytes) and the same verdict. Small limits keep inputs
// meaningful: meta <= 512 bytes, message <= 64 KiB (so the direct payload read path of
// payloads >= 16 KiB is reachable).
// Frames whose meta names a payload head get a sink for their tail unless their
// request_id is a multiple of 3, in memory of exactly the tail's size (ASan sees a write
// past it); both runs must fill the same sinks with the same bytes. A third run, chunked,
// drops every sink right after the chunk that started it: from then on its bytes must not
// change, and the frames still come out as in the first run.
// Requests (not answers) whose sink was declined are offered a stream, which takes the
// tail when the request_id is even: its pieces must be 4-byte aligned whole floats (the
// last piece excepted), it must be asked only once every earlier frame was delivered
// (the frames of each Commit/Resume are delivered before the next call, as a connection
// does), and both runs must hand the same streams the same bytes.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pscore/comm/frame_decoder.h"

namespace {

using pscore::Status;
using pscore::comm::Frame;
using pscore::comm::FrameDecoder;
using pscore::comm::Limits;

Limits SmallLimits() {
  Limits l;
  l.max_meta_bytes = 512;
  l.max_message_bytes = 64 << 10;
  return l;
}

struct Sink {
  uint64_t request_id = 0;
  std::unique_ptr<char[]> mem;
  uint64_t size = 0;
  std::string at_drop;  // its bytes when it was dropped
  bool dropped = false;
};

// A TailStream that records what it is given and traps on a misshapen piece.
struct Recorder : pscore::comm::TailStream {
  bool accept = false;
  std::string head;
  uint64_t tail = 0;
  std::string got;
  bool Begin(pscore::Buffer& h, uint64_t t) override {
    head.assign(h.data(), h.size());
    tail = t;
    return accept;
  }
  void Consume(const char* data, size_t n) override {
    if (!accept || reinterpret_cast<uintptr_t>(data) % 4 != 0) __builtin_trap();
    if (got.size() + n > tail || (n % 4 != 0 && got.size() + n != tail)) __builtin_trap();
    got.append(data, n);
  }
};

struct Outcome {
  std::vector<Frame> frames;
  bool ok = true;
  std::vector<Sink> sinks;  // in the order handed out
  size_t dropped_upto = 0;  // sinks before this index were dropped
  std::vector<std::shared_ptr<Recorder>> streams;  // in the order offered
};

std::string_view Bytes(const Sink& s) { return std::string_view(s.mem.get(), s.size); }

void AttachSink(FrameDecoder* d, Outcome* o) {
  d->set_sink([o](const pscore::pb::MessageMeta& meta, uint64_t tail) -> char* {
    if (meta.request_id() % 3 == 0) return nullptr;
    Sink s;
    s.request_id = meta.request_id();
    s.mem.reset(new char[tail]);
    std::memset(s.mem.get(), 0x55, tail);
    s.size = tail;
    o->sinks.push_back(std::move(s));
    return o->sinks.back().mem.get();
  });
}

// Feeds `bytes` as a connection reads them: the frames of each Commit (or Resume, while
// the decoder is paused) are delivered to o->frames before it goes on.
Status FeedDelivering(FrameDecoder* d, std::string_view bytes, std::vector<Frame>* out, Outcome* o) {
  auto deliver = [&] {
    for (Frame& f : *out) o->frames.push_back(std::move(f));
    out->clear();
  };
  while (!bytes.empty()) {
    size_t room = 0;
    char* region = d->ReadRegion(&room);
    size_t n = std::min(room, bytes.size());
    std::memcpy(region, bytes.data(), n);
    bytes.remove_prefix(n);
    Status st = d->Commit(n, out);
    deliver();
    while (st.ok() && d->paused()) {
      st = d->Resume(out);
      deliver();
    }
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Outcome Decode(std::string_view stream, const std::vector<size_t>& sizes, bool chunked, bool drop) {
  FrameDecoder d(SmallLimits());
  Outcome o;
  AttachSink(&d, &o);
  std::vector<Frame> out;  // of the Commit under way: not delivered yet
  d.set_stream([&o, &out](const pscore::pb::MessageMeta& meta, uint64_t) -> std::shared_ptr<pscore::comm::TailStream> {
    if (meta.is_response() || !out.empty()) __builtin_trap();  // requests only, earlier frames delivered
    auto r = std::make_shared<Recorder>();
    r->accept = meta.request_id() % 2 == 0;
    o.streams.push_back(r);
    return r;
  });
  size_t pos = 0;
  for (size_t i = 0; pos < stream.size(); ++i) {
    size_t n = !chunked || sizes.empty() ? stream.size() : sizes[i % sizes.size()];
    if (n == 0) n = 1;
    if (n > stream.size() - pos) n = stream.size() - pos;
    Status st = FeedDelivering(&d, stream.substr(pos, n), &out, &o);
    pos += n;
    for (; drop && o.dropped_upto < o.sinks.size(); ++o.dropped_upto) {
      Sink& s = o.sinks[o.dropped_upto];
      d.DropSink(s.request_id);
      s.at_drop = std::string(Bytes(s));
      s.dropped = true;
    }
    if (!st.ok()) {
      o.ok = false;
      break;  // A connection is closed on the first error.
    }
  }
  return o;
}

bool SameFrame(const Frame& a, const Frame& b) {
  if (a.meta.SerializeAsString() != b.meta.SerializeAsString()) return false;
  std::string_view pa = a.payload ? a.payload->view() : std::string_view();
  std::string_view pb = b.payload ? b.payload->view() : std::string_view();
  return pa == pb && a.tail_bytes == b.tail_bytes && a.tail_dropped == b.tail_dropped &&
         (a.stream == nullptr) == (b.stream == nullptr);
}

// A frame whose tail went to a stream holds the head the stream was shown, and the stream
// got all of the tail.
void CheckStreamed(const Outcome& o) {
  for (const Frame& f : o.frames) {
    if (!f.stream) continue;
    const auto* r = static_cast<const Recorder*>(f.stream.get());
    if (!r->accept || f.tail_bytes != r->tail || r->got.size() != r->tail) __builtin_trap();
    if (!f.payload || f.payload->view() != r->head) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  size_t n = data[0] % 16;
  size_t pos = 1;
  std::vector<size_t> sizes;
  for (size_t i = 0; i < n && pos + 2 <= size; ++i, pos += 2) {
    sizes.push_back(static_cast<size_t>(data[pos]) | static_cast<size_t>(data[pos + 1]) << 8);
  }
  std::string_view stream(reinterpret_cast<const char*>(data) + pos, size - pos);

  Outcome whole = Decode(stream, sizes, /*chunked=*/false, /*drop=*/false);
  Outcome chunked = Decode(stream, sizes, /*chunked=*/true, /*drop=*/false);
  // The split must not matter: the frames before a corrupt point are the same, and
  // both runs find the corrupt point (or none).
  if (whole.ok != chunked.ok) __builtin_trap();
  if (whole.frames.size() != chunked.frames.size()) __builtin_trap();
  for (size_t i = 0; i < whole.frames.size(); ++i) {
    if (!SameFrame(whole.frames[i], chunked.frames[i])) __builtin_trap();
  }
  // The same sinks, filled alike (a sink of a frame still incomplete at the end included).
  if (whole.sinks.size() != chunked.sinks.size()) __builtin_trap();
  for (size_t i = 0; i < whole.sinks.size(); ++i) {
    if (Bytes(whole.sinks[i]) != Bytes(chunked.sinks[i])) __builtin_trap();
  }
  // The same streams, shown the same heads and given the same bytes.
  if (whole.streams.size() != chunked.streams.size()) __builtin_trap();
  for (size_t i = 0; i < whole.streams.size(); ++i) {
    const Recorder& a = *whole.streams[i];
    const Recorder& b = *chunked.streams[i];
    if (a.head != b.head || a.tail != b.tail || a.got != b.got) __builtin_trap();
  }
  CheckStreamed(whole);
  CheckStreamed(chunked);

  Outcome dropping = Decode(stream, sizes, /*chunked=*/true, /*drop=*/true);
  if (dropping.ok != whole.ok || dropping.frames.size() != whole.frames.size()) __builtin_trap();
  for (size_t i = 0; i < whole.frames.size(); ++i) {
    const Frame& a = whole.frames[i];
    const Frame& b = dropping.frames[i];
    if (a.meta.SerializeAsString() != b.meta.SerializeAsString()) __builtin_trap();
    // A frame whose sink was dropped before its end comes out marked, without its tail.
    if (b.tail_dropped ? b.tail_bytes != 0 || a.tail_bytes == 0 : !SameFrame(a, b)) __builtin_trap();
  }
  for (const Sink& s : dropping.sinks) {
    if (s.dropped && Bytes(s) != s.at_drop) __builtin_trap();
  }
  return 0;
}
