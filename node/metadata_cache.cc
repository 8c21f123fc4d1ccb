#include "node/metadata_cache.h"

#include <cstring>

namespace pscore::node {

const std::string& MetadataCache::Bytes(const core::ClusterManager& cluster) {
  if (!valid_ || epoch_ != cluster.epoch() || state_ != cluster.state()) {
    bytes_ = cluster.BuildMetadata().SerializeAsString();
    epoch_ = cluster.epoch();
    state_ = cluster.state();
    valid_ = true;
    ++builds_;
  }
  return bytes_;
}

// A protobuf parse keeps the last value of a singular scalar field, so appending
// rank_id (field 5, varint) to the shared bytes equals setting it in the message. An
// int32 is sign-extended to 64 bits on the wire: at most 10 varint bytes.
BufferPtr MetadataCache::For(const core::ClusterManager& cluster, int rank) {
  const std::string& base = Bytes(cluster);
  uint8_t tail[1 + 10];
  size_t n = 0;
  tail[n++] = static_cast<uint8_t>((5 << 3) | 0);
  uint64_t v = static_cast<uint64_t>(static_cast<int64_t>(rank));
  for (;;) {
    const uint8_t low = static_cast<uint8_t>(v & 0x7f);
    v >>= 7;
    tail[n++] = v == 0 ? low : static_cast<uint8_t>(low | 0x80);
    if (v == 0) break;
  }
  BufferPtr buf = Buffer::Allocate(base.size() + n);
  std::memcpy(buf->data(), base.data(), base.size());
  std::memcpy(buf->data() + base.size(), tail, n);
  return buf;
}

}  // namespace pscore::node
