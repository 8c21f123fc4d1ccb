#include "pscore/comm/frame.h"

#include <cstring>

namespace pscore::comm {
namespace {

// Explicit little-endian stores so the format does not depend on the host.
void Put32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void Put64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t Get32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t Get64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

void StoreHeader(const FrameHeader& h, char* out) {
  Put32(out, h.magic);
  Put32(out + 4, h.meta_len);
  Put64(out + 8, h.data_len);
}

FrameHeader LoadHeader(const char* in) {
  return FrameHeader{Get32(in), Get32(in + 4), Get64(in + 8)};
}

std::string EncodeHeader(const FrameHeader& h) {
  std::string out(kHeaderBytes, '\0');
  StoreHeader(h, out.data());
  return out;
}

size_t MetaPadBytes(uint64_t stream_offset, size_t meta_len) {
  const size_t r = (kPayloadAlign - (stream_offset + kHeaderBytes + meta_len) % kPayloadAlign) % kPayloadAlign;
  // The shortest field is 2 bytes (tag, length 0): one byte short is made up with 9.
  return r == 1 ? r + kPayloadAlign : r;
}

void StoreMetaPad(size_t pad_bytes, char* out) {
  if (pad_bytes == 0) return;
  constexpr uint8_t kPadTag = (9 << 3) | 2;  // MessageMeta.pad: field 9, length-delimited
  out[0] = static_cast<char>(kPadTag);
  out[1] = static_cast<char>(pad_bytes - 2);  // < 128: a one-byte varint
  std::memset(out + 2, 0, pad_bytes - 2);
}

Status ParseHeader(std::string_view in, const Limits& limits, std::optional<FrameHeader>* header) {
  if (in.size() < kHeaderBytes) return Status::Ok();
  FrameHeader h = LoadHeader(in.data());
  if (h.magic != kMagic) return Status(Code::kProtocol, "bad magic");
  if (h.meta_len > limits.max_meta_bytes) {
    return Status(Code::kProtocol, "meta length " + std::to_string(h.meta_len) + " > limit " +
                                       std::to_string(limits.max_meta_bytes));
  }
  if (h.data_len > limits.max_message_bytes) {
    return Status(Code::kProtocol, "payload length " + std::to_string(h.data_len) + " > limit " +
                                       std::to_string(limits.max_message_bytes));
  }
  *header = h;
  return Status::Ok();
}

}  // namespace pscore::comm
