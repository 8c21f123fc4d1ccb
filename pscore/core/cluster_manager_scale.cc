// ClusterManager, elastic scale-out/in, completion and rollback. The other parts are
// listed at the top of cluster_manager.cc.
#include "pscore/core/cluster_manager.h"

#include <algorithm>

#include <glog/logging.h>

#include "pscore/core/role_names.h"

namespace pscore::core {
namespace {

using internal::Cat;
using internal::Err;

std::string Totals(int old_w, int new_w, int old_s, int new_s) {
  return Cat("workers ", old_w, " -> ", new_w, ", servers ", old_s, " -> ", new_s);
}

}  // namespace

Status ClusterManager::CheckCanStartScale() const {
  if (scaling_) return Status(Code::kFailedPrecondition, "scale operation already running");
  if (state_ != pb::CLUSTER_READY) {
    return Err(Code::kFailedPrecondition, "cannot scale in state ", ClusterStateName(state_),
               "; need CLUSTER_READY");
  }
  return Status::Ok();
}

// Scale-out: new totals go out at once (epoch bump); new nodes register with the ranks after
// the old ones, which never change. Once all are in, the topology is republished (epoch bump
// again) and every node answers ScaleOutDone with that newest epoch.
Status ClusterManager::ScaleOut(int worker_num, int server_num) {
  PSCORE_RETURN_IF_ERROR(CheckCanStartScale());
  const std::string totals = Totals(worker_num_, worker_num, server_num_, server_num);
  if (worker_num < worker_num_ || server_num < server_num_) {
    return Status(Code::kInvalidArgument, "scale-out cannot shrink: " + totals);
  }
  if (worker_num == worker_num_ && server_num == server_num_) {
    return Status(Code::kInvalidArgument, "scale-out needs a larger total: " + totals);
  }
  if (worker_num > kMaxRoleTotal || server_num > kMaxRoleTotal) {
    return Err(Code::kInvalidArgument, "scale-out past ", kMaxRoleTotal, " nodes per role: ", totals);
  }
  PSCORE_RETURN_IF_ERROR(CheckReplicatedServerScale(server_num, totals));
  op_ = ScaleOp();
  op_.kind = ScaleKind::kOut;
  op_.started = clock_->Now();
  op_.old_worker_num = worker_num_;
  op_.old_server_num = server_num_;
  scaling_ = true;
  worker_num_ = worker_num;
  server_num_ = server_num;
  op_.expected_epoch = ++epoch_;
  LOG(INFO) << "scale-out started: " << totals << ", epoch " << epoch_;
  state_ = pb::CLUSTER_SCALE_OUT;
  EmitRaw(Event::Kind::kScaleOut);
  EmitRaw(Event::Kind::kStateChanged);
  return Status::Ok();
}

Status ClusterManager::ScaleInByIds(const std::vector<std::string>& node_ids) {
  PSCORE_RETURN_IF_ERROR(CheckCanStartScale());
  if (node_ids.empty()) return Status(Code::kInvalidArgument, "scale-in names no node");
  std::set<std::string> leaving;
  int servers = 0;
  for (const std::string& id : node_ids) {
    const NodeRecord* rec = Find(id);
    if (rec == nullptr) return Status(Code::kNotFound, "scale-in: unknown node " + id);
    if (leaving.insert(id).second && rec->role == pb::SERVER) ++servers;
  }
  const int workers = static_cast<int>(leaving.size()) - servers;
  if (servers > 0 && servers >= registered(pb::SERVER)) {
    return Err(Code::kInvalidArgument, "scale-in would remove all ", servers, " servers");
  }
  if (workers > 0 && workers >= registered(pb::WORKER)) {
    return Err(Code::kInvalidArgument, "scale-in would remove all ", workers, " workers");
  }
  return StartScaleIn(std::vector<std::string>(leaving.begin(), leaving.end()));
}

Status ClusterManager::ScaleInByCounts(int worker_num, int server_num) {
  PSCORE_RETURN_IF_ERROR(CheckCanStartScale());
  const std::string totals = Totals(worker_num_, worker_num, server_num_, server_num);
  if (worker_num < 1 || server_num < 1) {
    return Err(Code::kInvalidArgument, "scale-in must keep a worker and a server: ", totals);
  }
  if (worker_num > worker_num_ || server_num > server_num_) {
    return Status(Code::kInvalidArgument, "scale-in cannot grow: " + totals);
  }
  if (worker_num == worker_num_ && server_num == server_num_) {
    return Status(Code::kInvalidArgument, "scale-in needs a smaller total: " + totals);
  }
  std::vector<std::string> leaving;  // ranks are dense in READY: the highest ones go
  for (const NodeRecord* rec : Nodes()) {
    if (rec->rank >= (rec->role == pb::SERVER ? server_num : worker_num)) {
      leaving.push_back(rec->node_id);
    }
  }
  return StartScaleIn(leaving);
}

Status ClusterManager::CheckReplicatedServerScale(int server_num, const std::string& totals) const {
  if (config_.replicas < 2 || server_num == server_num_) return Status::Ok();
  // Each range's primary under the old membership sends its entries to every member of
  // the new ranges' chains (docs/reliability.md, Scaling with replicas): it must hold
  // them all, so every server is a live replica when the scale starts.
  if (server_num < config_.replicas) {
    return Err(Code::kFailedPrecondition, "replicas=", config_.replicas, " needs at least as many servers: ", totals);
  }
  for (const NodeRecord* rec : Nodes()) {
    if (rec->role != pb::SERVER || (!rec->timed_out && !rec->resyncing)) continue;
    return Err(Code::kFailedPrecondition, "the server count cannot change with replicas=", config_.replicas, " while ",
               "server ", rec->node_id, " (rank ", rec->rank, ") is ", rec->timed_out ? "lost" : "resyncing", ": ",
               totals);
  }
  return Status::Ok();
}

Status ClusterManager::StartScaleIn(const std::vector<std::string>& leaving) {
  int servers_leaving = 0;
  for (const std::string& id : leaving) {
    const NodeRecord* rec = Find(id);
    if (rec != nullptr && rec->role == pb::SERVER) ++servers_leaving;
  }
  PSCORE_RETURN_IF_ERROR(CheckReplicatedServerScale(
      server_num_ - servers_leaving, Totals(worker_num_, worker_num_, server_num_, server_num_ - servers_leaving)));
  op_ = ScaleOp();
  op_.kind = ScaleKind::kIn;
  op_.started = clock_->Now();
  op_.old_worker_num = worker_num_;
  op_.old_server_num = server_num_;
  std::vector<std::string> ordered;
  for (NodeRecord* rec : MutableNodes()) {
    if (std::find(leaving.begin(), leaving.end(), rec->node_id) == leaving.end()) continue;
    rec->leaving = true;
    RefreshNodeState(rec);
    --(rec->role == pb::SERVER ? server_num_ : worker_num_);
    ordered.push_back(rec->node_id);
  }
  scaling_ = true;
  op_.expected_epoch = ++epoch_;
  LOG(INFO) << "scale-in started: "
            << Totals(op_.old_worker_num, worker_num_, op_.old_server_num, server_num_)
            << ", epoch " << epoch_;
  state_ = pb::CLUSTER_SCALE_IN;
  EmitRaw(Event::Kind::kScaleIn).leaving_node_ids = ordered;
  EmitRaw(Event::Kind::kStateChanged);
  return Status::Ok();
}

Status ClusterManager::CheckDone(ScaleKind kind, const std::string& node_id,
                                 uint64_t epoch) const {
  const char* what = kind == ScaleKind::kOut ? "scale-out" : "scale-in";
  if (!scaling_ || op_.kind != kind) {
    return Err(Code::kFailedPrecondition, "no ", what, " running (state ", ClusterStateName(state_),
               ")");
  }
  if (Find(node_id) == nullptr) return Status(Code::kNotFound, "unknown node " + node_id);
  if (epoch < op_.expected_epoch) {
    return Err(Code::kAborted, "stale epoch ", epoch, " < ", op_.expected_epoch, " from node ",
               node_id);
  }
  if (epoch > op_.expected_epoch) {
    return Err(Code::kInvalidArgument, "future epoch ", epoch, " > ", op_.expected_epoch,
               " from node ", node_id);
  }
  return Status::Ok();
}

Status ClusterManager::ScaleOutDone(const std::string& node_id, uint64_t epoch) {
  PSCORE_RETURN_IF_ERROR(CheckDone(ScaleKind::kOut, node_id, epoch));
  if (!op_.new_nodes_in) {
    return Err(Code::kFailedPrecondition, "scale-out still waiting for new nodes: ",
               ScaleProgress());
  }
  op_.done.insert(node_id);
  if (AllDone()) EndScale();
  return Status::Ok();
}

Status ClusterManager::ScaleInDone(const std::string& node_id, uint64_t epoch) {
  PSCORE_RETURN_IF_ERROR(CheckDone(ScaleKind::kIn, node_id, epoch));
  op_.done.insert(node_id);
  if (AllDone()) CompleteScaleIn();
  return Status::Ok();
}

bool ClusterManager::AllDone() const {
  for (const auto& [id, rec] : nodes_) {
    if (op_.done.count(id) == 0) return false;
  }
  return true;
}

// Leaving nodes go; survivors keep their relative order by old rank, made dense again.
void ClusterManager::CompleteScaleIn() {
  std::map<pb::NodeRole, int> next_rank;
  for (NodeRecord* rec : MutableNodes()) {
    if (rec->leaving) {
      Emit(Event::Kind::kNodeLeft, rec);
      RememberLeft(rec->node_id, rec->incarnation);
      const std::string id = rec->node_id;
      RemoveNode(id);  // other records' pointers stay valid in a std::map
    } else {
      rec->rank = next_rank[rec->role]++;
    }
  }
  InvalidateRanks();
  PublishMetadata();
  EndScale();
  CheckFinish();
}

void ClusterManager::RememberLeft(const std::string& node_id, uint64_t incarnation) {
  if (left_.count(node_id) == 0) left_order_.push_back(node_id);
  left_[node_id] = incarnation;
  if (left_order_.size() > kLeftRemembered) {
    left_.erase(left_order_.front());
    left_order_.pop_front();
  }
}

bool ClusterManager::LeftInScaleIn(const std::string& node_id, uint64_t incarnation) const {
  auto it = left_.find(node_id);
  return it != left_.end() && it->second == incarnation && Find(node_id) == nullptr;
}

void ClusterManager::EndScale() {
  scaling_ = false;
  for (NodeRecord* rec : MutableNodes()) RefreshNodeState(rec);
  LOG(INFO) << "scale operation done: " << worker_num_ << " workers, " << server_num_
            << " servers, epoch " << epoch_;
  state_ = pb::CLUSTER_READY;
  EmitRaw(Event::Kind::kScaleDone);
  EmitRaw(Event::Kind::kStateChanged);
}

// Undoes the running scale operation: nodes it added are dropped, leaving nodes stay, the
// old totals return. Old ranks never moved, so only the topology is recomputed.
void ClusterManager::Rollback(const std::string& reason) {
  for (const std::string& id : op_.added) RemoveNode(id);
  for (auto& [id, rec] : nodes_) rec.leaving = false;
  worker_num_ = op_.old_worker_num;
  server_num_ = op_.old_server_num;
  scaling_ = false;
  AssignTopology();
  ++epoch_;
  LOG(WARNING) << "scale operation rolled back: " << reason;
  // A node lost during the scale keeps the job waiting for it: one state change to where the
  // job is, not READY and then NODE_TIMEOUT, which members would see as READY for a moment.
  state_ = timed_out_count_ > 0 ? pb::NODE_TIMEOUT : pb::CLUSTER_READY;
  EmitRaw(Event::Kind::kRollback).message = reason;
  EmitRaw(Event::Kind::kMetadataChanged);
  EmitRaw(Event::Kind::kStateChanged);
}

std::string ClusterManager::ScaleProgress() const {
  if (op_.kind == ScaleKind::kOut && !op_.new_nodes_in) {
    std::string out;
    for (pb::NodeRole role : {pb::SERVER, pb::WORKER}) {
      const int wanted = Total(role) - (role == pb::SERVER ? op_.old_server_num
                                                           : op_.old_worker_num);
      if (wanted == 0) continue;
      int in = 0;
      for (const std::string& id : op_.added) in += Find(id)->role == role ? 1 : 0;
      if (!out.empty()) out += ", ";
      out += Cat(in, " of ", wanted, " new ", RoleLabel(role), "s registered");
    }
    return out;
  }
  return Cat(op_.done.size(), " of ", nodes_.size(), " nodes sent ",
             op_.kind == ScaleKind::kOut ? "SCALE_OUT_DONE" : "SCALE_IN_DONE");
}

}  // namespace pscore::core
