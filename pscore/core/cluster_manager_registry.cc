// ClusterManager, the registry and what it publishes: records by node id with their
// counters, node states, the metadata (topology, epoch) and the events drained by the
// node layer.
#include "pscore/core/cluster_manager.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace pscore::core {

std::vector<Event> ClusterManager::TakeEvents() {
  std::vector<Event> out;
  out.swap(events_);
  return out;
}

int ClusterManager::registered(pb::NodeRole role) const {
  return role >= 0 && role < 4 ? role_count_[role] : 0;
}

NodeRecord& ClusterManager::AddNode(NodeRecord rec) {
  auto [it, added] = nodes_.try_emplace(rec.node_id);
  if (!added && it->second.role >= 0 && it->second.role < 4) --role_count_[it->second.role];
  if (!added && it->second.timed_out) --timed_out_count_;
  if (!added && it->second.in_error) --in_error_count_;
  if (!added) InvalidateRanks();
  it->second = std::move(rec);
  const NodeRecord& now = it->second;
  if (now.role >= 0 && now.role < 4) ++role_count_[now.role];
  if (now.timed_out) ++timed_out_count_;
  if (now.in_error) ++in_error_count_;
  next_timeout_scan_ = TimePoint::min();
  return it->second;
}

void ClusterManager::RemoveNode(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  if (it->second.role >= 0 && it->second.role < 4) --role_count_[it->second.role];
  if (it->second.timed_out) --timed_out_count_;
  if (it->second.in_error) --in_error_count_;
  nodes_.erase(it);
  InvalidateRanks();
  ++generation_;
}

void ClusterManager::SetTimedOut(NodeRecord* rec, bool timed_out) {
  if (rec->timed_out == timed_out) return;
  rec->timed_out = timed_out;
  timed_out_count_ += timed_out ? 1 : -1;
}

void ClusterManager::SetInError(NodeRecord* rec, bool in_error) {
  if (rec->in_error == in_error) return;
  rec->in_error = in_error;
  in_error_count_ += in_error ? 1 : -1;
}

int ClusterManager::Total(pb::NodeRole role) const {
  return role == pb::SERVER ? server_num_ : worker_num_;
}

const NodeRecord* ClusterManager::Find(const std::string& node_id) const {
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? nullptr : &it->second;
}

NodeRecord* ClusterManager::Mutable(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? nullptr : &it->second;
}

std::vector<const NodeRecord*> ClusterManager::Nodes() const {
  std::vector<const NodeRecord*> out;
  for (const auto& [id, rec] : nodes_) out.push_back(&rec);
  std::sort(out.begin(), out.end(), [](const NodeRecord* a, const NodeRecord* b) {
    return std::tie(a->role, a->rank, a->node_id) < std::tie(b->role, b->rank, b->node_id);
  });
  return out;
}

std::vector<NodeRecord*> ClusterManager::MutableNodes() {
  std::vector<NodeRecord*> out;
  for (const NodeRecord* rec : Nodes()) out.push_back(const_cast<NodeRecord*>(rec));
  return out;
}

pb::SendMetadataMessage ClusterManager::BuildMetadata() const {
  pb::SendMetadataMessage msg;
  msg.set_worker_num(worker_num_);
  msg.set_server_num(server_num_);
  msg.set_cluster_state(state_);
  msg.set_epoch(epoch_);
  msg.set_replicas(config_.replicas);
  if (scaling_ && op_.kind == ScaleKind::kOut) msg.set_scale_out_old_server_num(op_.old_server_num);
  const TimePoint now = clock_->Now();
  for (const NodeRecord* rec : Nodes()) {
    ToServersMeta(*rec, now, Liveness::kServing,
                  rec->role == pb::SERVER ? msg.add_servers_meta() : msg.add_workers_meta());
  }
  return msg;
}

// Global device ids are dense and ordered by role (servers first, then workers), then rank,
// then local_id, so the numbering follows from the rank table alone.
void ClusterManager::AssignTopology() {
  int next = 0;
  for (NodeRecord* rec : MutableNodes()) {
    for (pb::Device& d : rec->devices) d.set_global_id(next++);
    rec->in_metadata = true;
    RefreshNodeState(rec);
  }
}

// During a scale operation (once scale-out's new nodes are in) every node must acknowledge
// the newest metadata, so a republish restarts the *Done round at the new epoch.
void ClusterManager::PublishMetadata() {
  AssignTopology();
  ++epoch_;
  if (scaling_ && (op_.kind == ScaleKind::kIn || op_.new_nodes_in)) {
    op_.expected_epoch = epoch_;
    op_.done.clear();
  }
  EmitRaw(Event::Kind::kMetadataChanged);
}

// A node's pb state is derived from its flags, most urgent first.
void ClusterManager::RefreshNodeState(NodeRecord* rec) const {
  if (rec->finished && finish_passed_) {
    rec->state = pb::NODE_FINISH;
  } else if (rec->timed_out) {
    rec->state = pb::NODE_TIMED_OUT;
  } else if (rec->in_error) {
    rec->state = pb::NODE_IN_ERROR;
  } else if (rec->leaving) {
    rec->state = pb::NODE_LEAVING;
  } else {
    rec->state = rec->in_metadata ? pb::NODE_READY : pb::NODE_STARTING;
  }
}

// READY <-> NODE_TIMEOUT follows whether any node is timed out. Other states (starting,
// scaling, disabled, exiting) are left alone; they re-check when they return to READY.
void ClusterManager::RefreshTimeoutState() {
  const bool any = timed_out_count_ > 0;
  if (state_ == pb::CLUSTER_READY && any) SetClusterState(pb::NODE_TIMEOUT);
  if (state_ == pb::NODE_TIMEOUT && !any) SetClusterState(pb::CLUSTER_READY);
}

void ClusterManager::SetClusterState(pb::ClusterState state) {
  state_ = state;
  EmitRaw(Event::Kind::kStateChanged);
}

Event& ClusterManager::EmitRaw(Event::Kind kind) {
  Event& e = events_.emplace_back();
  e.kind = kind;
  e.state = state_;
  e.epoch = epoch_;
  e.worker_num = worker_num_;
  e.server_num = server_num_;
  return e;
}

Event& ClusterManager::Emit(Event::Kind kind, const NodeRecord* rec) {
  Event& e = EmitRaw(kind);
  e.node_id = rec->node_id;
  e.role = rec->role;
  e.rank = rec->rank;
  return e;
}

}  // namespace pscore::core
