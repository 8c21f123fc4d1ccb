#include "pscore/node/scheduler/metadata_cache.h"

#include <utility>

namespace pscore::node {
namespace {

BufferPtr Serialise(const pb::SendMetadataMessage& md) {
  BufferPtr bytes = Buffer::Allocate(md.ByteSizeLong());
  md.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(bytes->data()));
  return bytes;
}

}  // namespace

void MetadataCache::Build(const core::ClusterManager& cluster) {
  if (valid_ && server_bytes_ != nullptr && epoch_ == cluster.epoch() && state_ == cluster.state()) return;
  pb::SendMetadataMessage md = cluster.BuildMetadata();
  const size_t whole = md.ByteSizeLong();
  const bool worker_view = whole > worker_view_over_ && md.workers_meta_size() > 0;
  const bool server_view = whole > server_view_over_ && md.workers_meta_size() > 0;
  // New buffers each time: the previous ones may still be queued on slow links. The whole
  // membership is serialised only for a role that gets it.
  BufferPtr whole_bytes = worker_view && server_view ? nullptr : Serialise(md);
  google::protobuf::RepeatedPtrField<pb::ServersMeta> workers;
  if (worker_view || server_view) {
    md.set_omitted_workers(md.workers_meta_size());
    workers.Swap(md.mutable_workers_meta());
  }
  worker_bytes_ = worker_view ? Serialise(md) : whole_bytes;
  if (server_view) {
    md.mutable_worker_ids()->Reserve(workers.size());
    md.mutable_worker_ranks()->Reserve(workers.size());
    for (pb::ServersMeta& w : workers) {  // in rank order (BuildMetadata)
      md.add_worker_ids(std::move(*w.mutable_node_id()));
      md.add_worker_ranks(w.rank_id());
    }
    server_bytes_ = Serialise(md);
  } else {
    server_bytes_ = whole_bytes;
  }
  epoch_ = cluster.epoch();
  state_ = cluster.state();
  valid_ = true;
  ++builds_;
}

BufferPtr MetadataCache::For(const core::ClusterManager& cluster, pb::NodeRole role) {
  Build(cluster);
  return role == pb::WORKER ? worker_bytes_ : server_bytes_;
}

}  // namespace pscore::node
