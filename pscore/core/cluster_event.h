// Event: a decision of the scheduler's ClusterManager that the node layer acts on, and the
// one builder of the CLUSTER_EVENT message (pb::ClusterEventMessage) members hear such
// decisions by: for an Event as it is drained, and for a node flagged in error or timed out
// as replayed to a member that (re)joins. Plain data and pure functions, any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pscore/core/node_record.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::core {

// A decision the node layer must act on, in order.
struct Event {
  enum class Kind {
    kStateChanged,     // cluster state changed to `state` (broadcast it)
    kMetadataChanged,  // membership/ranks/topology changed: broadcast BuildMetadata() (epoch bumped)
    kNodeRestarted,    // node_id re-registered with a new incarnation
    kNodeTimedOut,     // node_id silent past heartbeat_timeout
    kNodeRecovered,    // a timed-out node came back
    kNodeError,        // node_id reported an error (code, message)
    kFinishPassed,     // every live node called Finish: answer all finish waiters, then exit; a
                       // failed job carries error_code kAborted and message "job failed: ..."
    kFinishFailed,     // (not used by Tick: finish deadline is per caller, see FinishMissing)
    kScaleOut,         // start of scale-out: tell every node the new totals (worker_num, server_num, epoch)
    kScaleIn,          // start of scale-in: tell every node; leaving_node_ids are leaving
    kScaleDone,        // the scale operation finished; cluster READY again
    kRollback,         // scale operation rolled back; message = reason
    kNodeLeft,         // a scale-in node has been removed: it may exit now
  };
  Kind kind = Kind::kStateChanged;
  pb::ClusterState state = pb::ClUSTER_STARTING;  // cluster state when the event was made
  std::string node_id;
  pb::NodeRole role = pb::WORKER;
  int rank = -1;
  int error_code = 0;
  std::string message;
  // kNodeError: false for a member of a recoverable role (logged, not told to the others,
  // its barriers not failed).
  bool propagate = true;
  bool reported = true;  // kNodeError: the member reported it (false: the scheduler found it)
  uint64_t epoch = 0;
  int worker_num = 0;
  int server_num = 0;
  std::vector<std::string> leaving_node_ids;
};

// The CLUSTER_EVENT kind members hear `kind` by: true and *out set for kStateChanged,
// kNodeTimedOut, kNodeRestarted, kNodeRecovered, kNodeError and kRollback; false for the
// others (they go out as other messages, or not at all).
bool ClusterEventKind(Event::Kind kind, pb::ClusterEventMessage::Kind* out);

// The CLUSTER_EVENT of `e` (a kind ClusterEventKind maps). A state change names the state it
// changed to (several may be drained at once, and only the last carries how the job ended);
// any other event carries `state`, the cluster's state as it is sent. The epoch is e's, or
// `epoch` when e has none. `more` is left empty.
pb::ClusterEventMessage ToClusterEvent(const Event& e, pb::ClusterState state, uint64_t epoch);

// The notice of a node flagged in error (NODE_ERROR with its code and message) or timed out
// (NODE_TIMED_OUT, "heartbeat timed out"), for a member that did not hear it when it was
// sent; `state` and `epoch` are the cluster's now.
pb::ClusterEventMessage FlaggedNodeEvent(const NodeRecord& rec, pb::ClusterState state, uint64_t epoch);

}  // namespace pscore::core
