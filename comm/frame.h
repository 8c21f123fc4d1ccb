// Frame codec. Wire layout (little-endian), see DESIGN.md:
//   | magic u32 'PSC1' | meta_len u32 | data_len u64 |  16-byte header
//   | MessageMeta (protobuf, meta_len bytes) | payload (data_len bytes) |
// Limits are checked on the header, before anything is allocated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

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

// Incomplete input is not an error: returns OK and leaves *header unset.
Status ParseHeader(std::string_view in, const Limits& limits, std::optional<FrameHeader>* header);

}  // namespace pscore::comm
