#include "node/metadata_cache.h"

namespace pscore::node {

BufferPtr MetadataCache::Shared(const core::ClusterManager& cluster) {
  if (!valid_ || bytes_ == nullptr || epoch_ != cluster.epoch() || state_ != cluster.state()) {
    const pb::SendMetadataMessage md = cluster.BuildMetadata();
    // A new buffer each time: the previous one may still be queued on slow links.
    bytes_ = Buffer::Allocate(md.ByteSizeLong());
    md.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(bytes_->data()));
    epoch_ = cluster.epoch();
    state_ = cluster.state();
    valid_ = true;
    ++builds_;
  }
  return bytes_;
}

}  // namespace pscore::node
