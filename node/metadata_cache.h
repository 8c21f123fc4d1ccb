// MetadataCache: the scheduler's serialised SendMetadataMessage, built once into one
// immutable buffer and handed, shared, to every member that needs it (the push on a
// membership change, FETCH_METADATA, a late joiner) until the membership changes. No
// copy is made per member: the bytes carry no recipient's rank (a member finds its own
// entry by node id, a worker of a large membership keeps the rank it was told).
//
// Two views: servers get the whole membership (they check that a peer is a member);
// workers get it whole only while its encoding is at most `worker_view_over` bytes. Past
// that, a worker's view holds the servers and the totals, with the worker entries left out
// (omitted_workers says how many): what a worker acts on, in bytes that do not grow with the
// number of workers, so a change costs O(workers x servers) bytes, not O(workers^2).
// Owned by SchedulerNode; loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/buffer.h"
#include "core/cluster_manager.h"

namespace pscore::node {

class MetadataCache {
 public:
  explicit MetadataCache(size_t worker_view_over = 64 * 1024) : worker_view_over_(worker_view_over) {}

  // The next build rebuilds. Called on every cluster event, every admission and every
  // scheduler tick, so the per-node facts that change without an event (heartbeat ages)
  // are at most one tick old.
  void Invalidate() { valid_ = false; }
  // The serialised metadata of `cluster` (rank_id unset), as one buffer that every
  // recipient shares; never written again once handed out (a rebuild makes a new one).
  // Rebuilt when invalidated or when the epoch or cluster state moved since the last build.
  BufferPtr Shared(const core::ClusterManager& cluster);
  // What a member of `role` gets: Shared() for a server (or any role but a worker), the
  // worker's view for a worker (the same buffer while the membership is small).
  BufferPtr For(const core::ClusterManager& cluster, pb::NodeRole role);
  // How many times the bytes were built (benchmarks and tests).
  uint64_t builds() const { return builds_; }

 private:
  void Build(const core::ClusterManager& cluster);

  const size_t worker_view_over_;
  bool valid_ = false;
  uint64_t epoch_ = 0;
  pb::ClusterState state_ = pb::ClUSTER_STARTING;
  BufferPtr bytes_;
  BufferPtr worker_bytes_;  // == bytes_ while the membership is small
  uint64_t builds_ = 0;
};

}  // namespace pscore::node
