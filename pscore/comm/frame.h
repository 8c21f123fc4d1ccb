// Frame codec. Wire layout (little-endian; docs/protocol.md):
//   | magic u32 'PSC1' | meta_len u32 | data_len u64 |  16-byte header
//   | MessageMeta (protobuf, meta_len bytes) | payload (data_len bytes) |
// Limits are checked on the header, before anything is allocated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "pscore/core/status.h"

namespace pscore::comm {

inline constexpr uint32_t kMagic = 0x31435350;  // "PSC1" read as little-endian u32
inline constexpr size_t kHeaderBytes = 16;
inline constexpr uint32_t kMaxMetaBytes = 64 << 10;

struct Limits {
  uint32_t max_meta_bytes = kMaxMetaBytes;
  uint64_t max_message_bytes = 256ull << 20;
};

struct FrameHeader {
  uint32_t magic = kMagic;
  uint32_t meta_len = 0;
  uint64_t data_len = 0;
};

// Writes the 16 header bytes to out[0..16).
void StoreHeader(const FrameHeader& h, char* out);
FrameHeader LoadHeader(const char* in);
std::string EncodeHeader(const FrameHeader& h);

// Payloads start 8-byte aligned in a connection's byte stream when their senders pad the
// meta (MessageMeta.pad, field 9, appended after the other fields): a receiver that keeps
// its input buffer in step with the stream can then hand a small payload out in place.
inline constexpr size_t kPayloadAlign = 8;
// Bytes of padding field to append to a meta of `meta_len` bytes so that the payload of a
// frame starting at byte `stream_offset` of the stream is aligned: 0 (none needed) or 2..9.
size_t MetaPadBytes(uint64_t stream_offset, size_t meta_len);
// Writes that many padding bytes (the field's tag, its length, zeros) to out.
void StoreMetaPad(size_t pad_bytes, char* out);

// Incomplete input is not an error: returns OK and leaves *header unset.
Status ParseHeader(std::string_view in, const Limits& limits, std::optional<FrameHeader>* header);

}  // namespace pscore::comm
