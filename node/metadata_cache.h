// MetadataCache: the scheduler's serialised SendMetadataMessage, built once into one
// immutable buffer and handed, shared, to every member that needs it (the push on a
// membership change, FETCH_METADATA, a late joiner) until the membership changes. No
// copy is made per member: the bytes carry no recipient's rank (a member finds its own
// entry by node id). Owned by SchedulerNode; loop thread only.
#pragma once

#include <cstdint>

#include "core/buffer.h"
#include "core/cluster_manager.h"

namespace pscore::node {

class MetadataCache {
 public:
  // The next Shared() rebuilds. Called on every cluster event, every admission and every
  // scheduler tick, so the per-node facts that change without an event (heartbeat ages)
  // are at most one tick old.
  void Invalidate() { valid_ = false; }
  // The serialised metadata of `cluster` (rank_id unset), as one buffer that every
  // recipient shares; never written again once handed out (a rebuild makes a new one).
  // Rebuilt when invalidated or when the epoch or cluster state moved since the last build.
  BufferPtr Shared(const core::ClusterManager& cluster);
  // How many times the bytes were built (benchmarks and tests).
  uint64_t builds() const { return builds_; }

 private:
  bool valid_ = false;
  uint64_t epoch_ = 0;
  pb::ClusterState state_ = pb::ClUSTER_STARTING;
  BufferPtr bytes_;
  uint64_t builds_ = 0;
};

}  // namespace pscore::node
