// Little-endian integers in byte buffers, for the on-disk formats (state file, journal).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pscore::core {

// Writes the low `bytes` bytes of v to out, least significant first.
inline void PutLe(uint64_t v, size_t bytes, char* out) {
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// Reads `bytes` bytes, least significant first.
inline uint64_t GetLe(const char* in, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in[i])) << (8 * i);
  return v;
}

}  // namespace pscore::core
