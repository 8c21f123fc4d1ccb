#include "node/metadata_cache.h"

namespace pscore::node {
namespace {

BufferPtr Serialise(const pb::SendMetadataMessage& md) {
  BufferPtr bytes = Buffer::Allocate(md.ByteSizeLong());
  md.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(bytes->data()));
  return bytes;
}

}  // namespace

void MetadataCache::Build(const core::ClusterManager& cluster) {
  if (valid_ && bytes_ != nullptr && epoch_ == cluster.epoch() && state_ == cluster.state()) return;
  pb::SendMetadataMessage md = cluster.BuildMetadata();
  // New buffers each time: the previous ones may still be queued on slow links.
  bytes_ = Serialise(md);
  if (bytes_->size() > worker_view_over_ && md.workers_meta_size() > 0) {
    md.set_omitted_workers(md.workers_meta_size());
    md.clear_workers_meta();
    worker_bytes_ = Serialise(md);
  } else {
    worker_bytes_ = bytes_;
  }
  epoch_ = cluster.epoch();
  state_ = cluster.state();
  valid_ = true;
  ++builds_;
}

BufferPtr MetadataCache::Shared(const core::ClusterManager& cluster) {
  Build(cluster);
  return bytes_;
}

BufferPtr MetadataCache::For(const core::ClusterManager& cluster, pb::NodeRole role) {
  Build(cluster);
  return role == pb::WORKER ? worker_bytes_ : bytes_;
}

}  // namespace pscore::node
