// NodeRecord: what the scheduler's registry (ClusterManager) keeps per node, and its one
// conversion to each message that carries it: ServersMeta (the metadata members route by,
// and the admin's node list) and PersistedNode (the scheduler's state file, both ways).
// Plain data and pure functions, any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pscore/core/clock.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::core {

// What the registry keeps per node.
struct NodeRecord {
  // First, on one cache line: what every heartbeat reads and writes.
  TimePoint last_heartbeat;
  bool timed_out = false;
  std::string node_id;
  pb::NodeRole role = pb::WORKER;
  int rank = -1;
  std::string ip;
  int port = 0;
  uint64_t incarnation = 0;
  std::vector<pb::Device> devices;  // sorted by local_id; global_id set with the topology
  std::string host_name;
  pb::NodeState state = pb::NODE_STARTING;
  bool in_error = false;
  int error_code = 0;
  std::string error_message;
  // Its error is being late to a finish barrier that timed out (FinishTimedOut): once it
  // finishes after all, its part of the job is done.
  bool late_to_finish = false;
  bool finished = false;
  bool leaving = false;
  // Additions: the facts `state` is derived from (with timed_out above).
  bool in_metadata = false;  // part of a published topology
  std::string lost_cause;    // while timed_out: why, e.g. "no heartbeat for 3000 ms"
  // A server of a replicated job (replicas >= 2) that came back (restarted, or heard from
  // again after its timeout): it missed pushes, so the metadata marks it resyncing (not
  // alive: not read, not a primary; its ranges' primaries forward pushes to it and send it
  // snapshots) until it reports ResyncDone.
  bool resyncing = false;
  // Reset (ResetNode) since its last registration: the next REGISTER is admitted whatever
  // its incarnation, and heartbeats are answered "register again" until then.
  bool reset_pending = false;
};

// What `is_alive` says in a ServersMeta.
enum class Liveness {
  kServing,    // the metadata members route by: a resyncing server is not alive (not read, not a primary)
  kHeartbeat,  // the admin's node list: alive while it heartbeats
};

// rec as a ServersMeta (rank, address, role, id, devices, state, incarnation, liveness,
// resyncing, and the age of its last heartbeat at `now`), into *out.
void ToServersMeta(const NodeRecord& rec, TimePoint now, Liveness liveness, pb::ServersMeta* out);

// rec as the state file keeps it, into *out.
void ToPersisted(const NodeRecord& rec, pb::PersistedNode* out);
// A record as the state file kept it. What is not kept (last_heartbeat, state, lost_cause,
// late_to_finish, reset_pending) has its default: the caller sets what a restart implies.
NodeRecord FromPersisted(const pb::PersistedNode& n);

}  // namespace pscore::core
