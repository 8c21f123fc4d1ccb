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
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/frame_decoder.h"

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

struct Outcome {
  std::vector<Frame> frames;
  bool ok = true;
  std::vector<Sink> sinks;  // in the order handed out
  size_t dropped_upto = 0;  // sinks before this index were dropped
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

Outcome Decode(std::string_view stream, const std::vector<size_t>& sizes, bool chunked, bool drop) {
  FrameDecoder d(SmallLimits());
  Outcome o;
  AttachSink(&d, &o);
  size_t pos = 0;
  for (size_t i = 0; pos < stream.size(); ++i) {
    size_t n = !chunked || sizes.empty() ? stream.size() : sizes[i % sizes.size()];
    if (n == 0) n = 1;
    if (n > stream.size() - pos) n = stream.size() - pos;
    Status st = d.Feed(stream.substr(pos, n), &o.frames);
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
  return pa == pb && a.tail_bytes == b.tail_bytes && a.tail_dropped == b.tail_dropped;
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
