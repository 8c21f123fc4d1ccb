// SchedulerNode, members' admission and liveness: REGISTER (checks, the member's link, the
// answer and the notices it missed), HEARTBEAT, and the members' error and resync reports.
#include "pscore/core/cluster_event.h"
#include "pscore/core/state_file.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

namespace {

// The request of a REGISTER a member of this protocol version may make.
Status ReadRegister(const pb::RegisterMessage& msg, core::RegisterRequest* req) {
  if (msg.protocol_version() != kProtocolVersion) {
    return Status(Code::kInvalidArgument, "node " + msg.node_id() + " speaks protocol version " +
                                              std::to_string(msg.protocol_version()) +
                                              "; this scheduler speaks version " + std::to_string(kProtocolVersion));
  }
  req->node_id = msg.node_id();
  req->role = msg.role();
  req->ip = msg.ip();
  req->port = msg.port();
  req->incarnation = msg.incarnation();
  req->requested_rank = msg.requested_rank();
  req->devices.assign(msg.devices().begin(), msg.devices().end());
  req->host_name = msg.host_name();
  if (req->node_id.empty() || req->node_id.size() > 256) {
    return Status(Code::kInvalidArgument, "node_id must be 1..256 bytes");
  }
  return Status::Ok();
}

// What the state file may hold (pscore/core/state_file.h): a scheduler must be able to load
// the state it writes, or its restart fails on a member's bad REGISTER.
Status FitsStateFile(const core::RegisterRequest& req) {
  if (req.port < 0 || req.port > 65535) {
    return Status(Code::kInvalidArgument, "port " + std::to_string(req.port) + " is not in [0, 65535]");
  }
  if (req.devices.size() > static_cast<size_t>(core::kMaxStateDevicesPerNode)) {
    return Status(Code::kInvalidArgument, std::to_string(req.devices.size()) + " devices: at most " +
                                              std::to_string(core::kMaxStateDevicesPerNode) + " per node");
  }
  return Status::Ok();
}

}  // namespace

void SchedulerNode::HandleRegister(ConnId conn, const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  pb::RegisterMessage msg;
  Status st = ParsePayload(frame, &msg);
  core::RegisterRequest req;
  if (st.ok()) st = ReadRegister(msg, &req);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  st = CheckRegisterIdentity(conn, req.node_id);
  if (!st.ok()) {
    Reply(conn, frame.meta, st);
    messenger_->transport().CloseAfterFlush(conn, st);
    return;
  }
  st = FitsStateFile(req);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  if (TellEndIfUntold(conn, req.node_id, req.incarnation)) {
    return Reply(conn, frame.meta, Status(Code::kFailedPrecondition, "the job has ended"));
  }
  if (cluster_.LeftInScaleIn(req.node_id, req.incarnation)) {
    // Removed by a scale-in while its link was down, so it missed the TERMINATE: told now,
    // before the refusal on the same link, it ends as a node that left does (exit 0).
    Status left(Code::kFailedPrecondition, "node " + req.node_id + " left the cluster in a scale-in");
    LOG(INFO) << "scheduler: " << RoleLabel(req.role) << " " << req.node_id << " registered again after it left; "
              << "telling it to end";
    messenger_->Notify(conn, MakeMeta(pb::TERMINATE, pb::SCHEDULER, 0), nullptr).IgnoreError();
    return Reply(conn, frame.meta, left);
  }
  const uint64_t epoch_before = cluster_.epoch();
  Result<core::RegisterOutcome> out = cluster_.Register(req);
  if (!out.ok()) {
    if (std::optional<int64_t> unlogged = refusals_.Admit(req.node_id, out.status().ToString(), clock_.Now())) {
      LOG(WARNING) << "scheduler: refused " << RoleLabel(req.role) << " " << req.node_id << " from "
                   << messenger_->transport().PeerAddress(conn) << ": " << out.status()
                   << (*unlogged > 0 ? " (refused " + std::to_string(*unlogged) + " more times since its last line)"
                                     : std::string());
    }
    return Reply(conn, frame.meta, out.status());
  }
  refusals_.Forget(req.node_id);
  const bool heard_all = LinkRegistered(conn, req.node_id);
  AnswerRegister(conn, frame.meta, req, *out);
  if (!out->retry) {
    metadata_.Invalidate();
    for (auto& fn : register_listeners_) fn();
  }
  // A node that (re)joins an already published membership needs the metadata now; one
  // whose admission published a new membership gets it with everyone (DrainEvents).
  if (cluster_.state() != pb::ClUSTER_STARTING && cluster_.epoch() == epoch_before) SendMetadataTo(req.node_id);
  // A node registering again on the link it registered on before heard every notice
  // broadcast since (it timed out while its link stayed up); on a new link, or one it
  // only heartbeat on, it may have missed some.
  if (!heard_all) ReplayNotices(conn, req.node_id);
}

// With TLS the node id is not a claim: the member's certificate (verified against the
// cluster CA) names it, so one member cannot register as another.
Status SchedulerNode::CheckRegisterIdentity(ConnId conn, const std::string& node_id) const {
  DCHECK(loop_->InLoopThread());
  if (options_.tls == nullptr) return Status::Ok();
  const std::string proven = messenger_->transport().PeerIdentity(conn);
  if (proven == node_id) return Status::Ok();
  Status why(Code::kPermissionDenied, "node id '" + node_id + "' does not match the TLS certificate of " +
                                          messenger_->transport().PeerAddress(conn) + " (CN=" + proven + ")");
  LOG(ERROR) << "scheduler: refused REGISTER: " << why.message();
  return why;
}

bool SchedulerNode::LinkRegistered(ConnId conn, const std::string& node_id) {
  DCHECK(loop_->InLoopThread());
  auto old = conn_of_.find(node_id);
  auto link = node_of_.find(conn);
  const bool heard_all = old != conn_of_.end() && old->second == conn && link != node_of_.end() &&
                         link->second.node_id == node_id && link->second.registered;
  if (old != conn_of_.end() && old->second != conn) node_of_.erase(old->second);
  conn_of_[node_id] = conn;
  node_of_[conn] = LinkNode{node_id, {}, /*registered=*/true, clock_.Now()};
  quiet_close_.erase(node_id);
  return heard_all;
}

void SchedulerNode::AnswerRegister(ConnId conn, const pb::MessageMeta& meta, const core::RegisterRequest& req,
                                   const core::RegisterOutcome& out) {
  DCHECK(loop_->InLoopThread());
  LOG(INFO) << "scheduler: " << RoleLabel(req.role) << " " << req.node_id << " registered as rank " << out.rank
            << " from " << req.ip << ":" << req.port
            << (out.restarted ? " (restarted)" : out.retry ? " (retry)" : "") << "; "
            << cluster_.registered(pb::WORKER) << "/" << cluster_.worker_num() << " workers, "
            << cluster_.registered(pb::SERVER) << "/" << cluster_.server_num() << " servers";
  pb::RegisterRespMessage resp;
  resp.set_node_id(req.node_id);
  resp.set_rank_id(out.rank);
  resp.set_epoch(cluster_.epoch());
  resp.set_worker_num(cluster_.worker_num());
  resp.set_server_num(cluster_.server_num());
  resp.set_session_id(cluster_.session_id());
  Reply(conn, meta, Status::Ok(), ToBuffer(resp));
}

// Every stored error and heartbeat loss, in one CLUSTER_EVENT frame (the first notice, the
// others in `more`): one frame per joiner, however many nodes are flagged. Skipped when no
// node is flagged: a scan per REGISTER would make a registration storm O(N^2).
void SchedulerNode::ReplayNotices(ConnId conn, const std::string& node_id) {
  DCHECK(loop_->InLoopThread());
  if (cluster_.flagged() == 0) return;
  pb::ClusterEventMessage first;
  bool any = false;
  cluster_.ForEachNode([&](const core::NodeRecord& rec) {
    if (rec.node_id == node_id || (!rec.in_error && !rec.timed_out)) return;
    *(any ? first.add_more() : &first) = core::FlaggedNodeEvent(rec, cluster_.state(), cluster_.epoch());
    any = true;
  });
  if (any) messenger_->Notify(conn, MakeMeta(pb::CLUSTER_EVENT, pb::SCHEDULER, 0), ToBuffer(first)).IgnoreError();
}

void SchedulerNode::HandleHeartbeat(ConnId conn, const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  // The hottest request: the messages are members, reused (no allocation once warm).
  pb::HeartbeatMessage& msg = heartbeat_in_;
  Status st = ParsePayload(frame, &msg);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  ++heartbeats_;
  if (!untold_.empty() && TellEndIfUntold(conn, msg.node_id(), msg.incarnation())) {
    return Reply(conn, frame.meta, Status(Code::kFailedPrecondition, "the job has ended"));
  }
  auto link = node_of_.find(conn);
  core::ClusterManager::NodeHint* hint = link == node_of_.end() ? nullptr : &link->second.hint;
  if (link == node_of_.end()) {
    // Another connection may not take over the link of a member whose link is up; the
    // member re-registers on it (REGISTER moves the link).
    auto live = conn_of_.find(msg.node_id());
    if (live != conn_of_.end() && live->second != conn) {
      return Reply(conn, frame.meta, Status(Code::kFailedPrecondition, "node " + msg.node_id() +
                                                                           " is linked on another connection; register again"));
    }
  }
  st = cluster_.Heartbeat(msg.node_id(), msg.incarnation(), hint);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  cluster_.SeenEpoch(msg.known_epoch());
  if (link == node_of_.end()) {
    // The node reconnected: this link now carries its pushes.
    conn_of_[msg.node_id()] = conn;
    node_of_[conn] = LinkNode{msg.node_id(), {}, /*registered=*/false, clock_.Now()};
    quiet_close_.erase(msg.node_id());
  } else {
    link->second.heard = clock_.Now();
  }
  // Constant-size whatever the cluster's size: a member whose known epoch is older fetches
  // the metadata itself (FETCH_METADATA), once, so no beat costs O(members).
  pb::HeartbeatRespMessage& resp = heartbeat_out_;
  resp.Clear();
  resp.set_cluster_state(cluster_.state());
  resp.set_epoch(cluster_.epoch());
  if (const core::NodeRecord* rec = cluster_.Find(msg.node_id())) resp.set_rank_id(rec->rank);
  Status sent = messenger_->Reply(conn, frame.meta, resp);
  if (!sent.ok()) VLOG(1) << "heartbeat answer to conn " << conn << " not sent: " << sent;
}

void SchedulerNode::HandleReportError(ConnId conn, const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  pb::ErrorReport msg;
  Status st = ParsePayload(frame, &msg);
  if (st.ok()) st = cluster_.ReportError(msg.node_id(), msg.error_code(), msg.message());
  Reply(conn, frame.meta, st);
}

void SchedulerNode::HandleResyncDone(ConnId conn, const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  pb::ResyncDoneMessage msg;
  Status st = ParsePayload(frame, &msg);
  if (st.ok()) st = cluster_.ResyncDone(msg.node_id(), msg.incarnation());
  Reply(conn, frame.meta, st);
}

}  // namespace pscore::node
