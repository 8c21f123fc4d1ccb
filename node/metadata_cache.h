// MetadataCache: the scheduler's serialised SendMetadataMessage, built once and handed to
// every member that needs it (the push on a membership change, FETCH_METADATA, a late
// joiner) until the membership changes. Owned by SchedulerNode; loop thread only.
#pragma once

#include <cstdint>
#include <string>

#include "core/buffer.h"
#include "core/cluster_manager.h"

namespace pscore::node {

class MetadataCache {
 public:
  // The next Bytes() rebuilds. Called on every cluster event, every admission and every
  // scheduler tick, so the per-node facts that change without an event (heartbeat ages)
  // are at most one tick old.
  void Invalidate() { valid_ = false; }
  // The serialised metadata of `cluster` (rank_id unset). Rebuilt when invalidated or
  // when the epoch or cluster state moved since the last build.
  const std::string& Bytes(const core::ClusterManager& cluster);
  // Bytes() with rank_id set to `rank`: one copy per recipient, no re-serialisation.
  BufferPtr For(const core::ClusterManager& cluster, int rank);
  // How many times the bytes were built (benchmarks and tests).
  uint64_t builds() const { return builds_; }

 private:
  bool valid_ = false;
  uint64_t epoch_ = 0;
  pb::ClusterState state_ = pb::ClUSTER_STARTING;
  std::string bytes_;
  uint64_t builds_ = 0;
};

}  // namespace pscore::node
