// MetadataCache: the scheduler's serialised SendMetadataMessage, built once into one
// immutable buffer per view and handed, shared, to every member of that view that needs it
// (the push on a membership change, FETCH_METADATA, a late joiner) until the membership
// changes. No copy is made per member: the bytes carry no recipient's rank (a member finds
// its own entry by node id, a worker of a large membership keeps the rank it was told).
//
// Views of a membership whose whole encoding passes a size (64 KiB by default), each in
// bytes that do not grow with workers x workers:
//  - a worker's view: the servers and the totals, no worker entries (omitted_workers says
//    how many), past `worker_view_over`: what a worker acts on;
//  - a server's view: the servers and the totals, and of each worker only its node id and
//    rank (worker_ids, worker_ranks; omitted_workers set), past `server_view_over`: a
//    server checks that a peer is a member and lists the workers by rank, nothing more.
// Below its size a role gets the whole membership. Owned by SchedulerNode; loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pscore/core/buffer.h"
#include "pscore/core/cluster_manager.h"

namespace pscore::node {

class MetadataCache {
 public:
  explicit MetadataCache(size_t worker_view_over = 64 * 1024, size_t server_view_over = 64 * 1024)
      : worker_view_over_(worker_view_over), server_view_over_(server_view_over) {}

  // The next build rebuilds. Called on every cluster event, every admission and every
  // scheduler tick, so the per-node facts that change without an event (heartbeat ages)
  // are at most one tick old.
  void Invalidate() { valid_ = false; }
  // What a member of `role` gets, as one buffer every such recipient shares, never written
  // again once handed out (a rebuild makes new ones): the server's view for a server, the
  // worker's view for a worker (any other role: as a server), each the whole membership
  // while it is small. Rebuilt when invalidated or when the epoch or cluster state moved
  // since the last build.
  BufferPtr For(const core::ClusterManager& cluster, pb::NodeRole role);
  // How many times the bytes were built (benchmarks and tests).
  uint64_t builds() const { return builds_; }

 private:
  void Build(const core::ClusterManager& cluster);

  const size_t worker_view_over_;
  const size_t server_view_over_;
  bool valid_ = false;
  uint64_t epoch_ = 0;
  pb::ClusterState state_ = pb::ClUSTER_STARTING;
  BufferPtr server_bytes_;
  BufferPtr worker_bytes_;  // == server_bytes_ while the membership is small
  uint64_t builds_ = 0;
};

}  // namespace pscore::node
