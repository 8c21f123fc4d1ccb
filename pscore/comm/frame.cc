#include "pscore/comm/frame.h"

#include <glog/logging.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <cstring>

#include "pscore/proto/comm.pb.h"

namespace pscore::comm {
namespace {

using google::protobuf::io::CodedOutputStream;
using google::protobuf::internal::WireFormatLite;

// MessageMeta.pad's tag. Both it and the field's length (at most kPayloadAlign + 1 - 2)
// encode as one-byte varints, so a pad field is 2 bytes plus its zeros.
constexpr uint32_t kPadTag =
    WireFormatLite::MakeTag(pb::MessageMeta::kPadFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
constexpr size_t kPadFieldOverhead = 2;
static_assert(kPadTag < 128 && kPayloadAlign + 1 - kPadFieldOverhead < 128,
              "the pad field's tag and length must each be one varint byte");

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
  // The shortest field is its tag and a zero length: one byte short is made up with 9.
  return r > 0 && r < kPadFieldOverhead ? r + kPayloadAlign : r;
}

void StoreMetaPad(size_t pad_bytes, char* out) {
  if (pad_bytes == 0) return;
  DCHECK(pad_bytes >= kPadFieldOverhead && pad_bytes <= kPayloadAlign + 1) << pad_bytes;
  auto* p = reinterpret_cast<uint8_t*>(out);
  p = CodedOutputStream::WriteTagToArray(kPadTag, p);
  p = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(pad_bytes - kPadFieldOverhead), p);
  std::memset(p, 0, pad_bytes - kPadFieldOverhead);
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
