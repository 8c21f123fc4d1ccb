#include "pscore/core/cluster_event.h"

#include <glog/logging.h>

namespace pscore::core {
namespace {

pb::ClusterEventMessage MakeClusterEvent(pb::ClusterEventMessage::Kind kind, pb::ClusterState state,
                                         const std::string& node_id, pb::NodeRole role, int rank, int error_code,
                                         const std::string& message, uint64_t epoch) {
  pb::ClusterEventMessage ev;
  ev.set_kind(kind);
  ev.set_cluster_state(state);
  ev.set_node_id(node_id);
  ev.set_role(role);
  ev.set_rank_id(rank);
  ev.set_error_code(error_code);
  ev.set_message(message);
  ev.set_epoch(epoch);
  return ev;
}

}  // namespace

bool ClusterEventKind(Event::Kind kind, pb::ClusterEventMessage::Kind* out) {
  using Wire = pb::ClusterEventMessage;
  switch (kind) {
    case Event::Kind::kStateChanged: *out = Wire::STATE_CHANGED; return true;
    case Event::Kind::kNodeTimedOut: *out = Wire::NODE_TIMED_OUT; return true;
    case Event::Kind::kNodeRestarted: *out = Wire::NODE_RESTARTED; return true;
    case Event::Kind::kNodeRecovered: *out = Wire::NODE_RECOVERED; return true;
    case Event::Kind::kNodeError: *out = Wire::NODE_ERROR; return true;
    case Event::Kind::kRollback: *out = Wire::ROLLBACK; return true;
    default: return false;
  }
}

pb::ClusterEventMessage ToClusterEvent(const Event& e, pb::ClusterState state, uint64_t epoch) {
  pb::ClusterEventMessage::Kind kind = pb::ClusterEventMessage::STATE_CHANGED;
  const bool mapped = ClusterEventKind(e.kind, &kind);
  DCHECK(mapped) << "event kind " << static_cast<int>(e.kind) << " has no CLUSTER_EVENT";
  return MakeClusterEvent(kind, kind == pb::ClusterEventMessage::STATE_CHANGED ? e.state : state, e.node_id, e.role,
                          e.rank, e.error_code, e.message, e.epoch != 0 ? e.epoch : epoch);
}

pb::ClusterEventMessage FlaggedNodeEvent(const NodeRecord& rec, pb::ClusterState state, uint64_t epoch) {
  if (rec.in_error) {
    return MakeClusterEvent(pb::ClusterEventMessage::NODE_ERROR, state, rec.node_id, rec.role, rec.rank,
                            rec.error_code, rec.error_message, epoch);
  }
  return MakeClusterEvent(pb::ClusterEventMessage::NODE_TIMED_OUT, state, rec.node_id, rec.role, rec.rank, 0,
                          "heartbeat timed out", epoch);
}

}  // namespace pscore::core
