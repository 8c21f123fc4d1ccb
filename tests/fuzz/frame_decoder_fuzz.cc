// libFuzzer target: comm::FrameDecoder on an arbitrary byte stream, fed in chunks.
// Input: [n: u8][n chunk sizes: u16 LE each][stream bytes]. The stream is fed in chunks of
// the given sizes (cycled; 0 means 1), and the result must equal decoding it in one Feed:
// same frames (meta and payload bytes) and the same verdict. Small limits keep inputs
// meaningful: meta <= 512 bytes, message <= 64 KiB (so the direct payload read path of
// payloads >= 16 KiB is reachable).
#include <cstddef>
#include <cstdint>
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

struct Outcome {
  std::vector<Frame> frames;
  bool ok = true;
};

Outcome DecodeWhole(std::string_view stream) {
  FrameDecoder d(SmallLimits());
  Outcome o;
  o.ok = d.Feed(stream, &o.frames).ok();
  return o;
}

Outcome DecodeChunked(std::string_view stream, const std::vector<size_t>& sizes) {
  FrameDecoder d(SmallLimits());
  Outcome o;
  size_t pos = 0;
  for (size_t i = 0; pos < stream.size(); ++i) {
    size_t n = sizes.empty() ? stream.size() : sizes[i % sizes.size()];
    if (n == 0) n = 1;
    if (n > stream.size() - pos) n = stream.size() - pos;
    Status st = d.Feed(stream.substr(pos, n), &o.frames);
    pos += n;
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
  return pa == pb;
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

  Outcome whole = DecodeWhole(stream);
  Outcome chunked = DecodeChunked(stream, sizes);
  // The split must not matter: the frames before a corrupt point are the same, and
  // both runs find the corrupt point (or none).
  if (whole.ok != chunked.ok) __builtin_trap();
  if (whole.frames.size() != chunked.frames.size()) __builtin_trap();
  for (size_t i = 0; i < whole.frames.size(); ++i) {
    if (!SameFrame(whole.frames[i], chunked.frames[i])) __builtin_trap();
  }
  return 0;
}
