// SchedulerNode, second half: cluster-event fan-out, admin operations and the
// coordination services (KV store, barriers).
#include "pscore/node/scheduler/scheduler_node.h"

#include <algorithm>
#include <cstring>

#include "pscore/node/common/admin_ops.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;
using Kind = core::Event::Kind;

void SchedulerNode::DrainEvents() {
  for (;;) {
    std::vector<core::Event> events = cluster_.TakeEvents();
    if (events.empty()) break;
    metadata_.Invalidate();
    for (const core::Event& e : events) {
      // Per-node notices in a row go out as one frame; anything else is sent after them.
      if (!IsNodeNotice(e.kind)) FlushNotices();
      for (auto& fn : listeners_) fn(e);
      switch (e.kind) {
        case Kind::kStateChanged:
          LOG(INFO) << "scheduler: cluster state " << core::ClusterStateName(e.state) << " (epoch "
                    << cluster_.epoch() << ")";
          SendClusterEvent(e, pb::ClusterEventMessage::STATE_CHANGED);
          if (e.state == pb::CLUSTER_EXIT) {
            // The notice says how the job ended (error_code kAborted: it failed, and why).
            pb::ClusterEventMessage end;
            end.set_kind(pb::ClusterEventMessage::STATE_CHANGED);
            end.set_cluster_state(pb::CLUSTER_EXIT);
            end.set_error_code(e.error_code);
            end.set_message(e.message);
            Broadcast(MakeMeta(pb::TERMINATE, pb::SCHEDULER, 0), ToBuffer(end));
            {
              std::lock_guard<std::mutex> lock(mu_);
              outcome_snapshot_ = cluster_.outcome();
            }
            MarkExited();
          }
          break;
        case Kind::kMetadataChanged: {
          // Built and serialised once (the cache) into one buffer per view that every
          // member's frame references: no copy per member, and the transport counts each
          // once toward its total of queued output (each member finds its own rank by node
          // id). Members of a large membership get their role's view (MetadataCache).
          const pb::MessageMeta meta = MakeMeta(pb::SEND_METADATA, pb::SCHEDULER, 0);
          std::vector<std::string> live;
          for (const core::NodeRecord* rec : cluster_.Nodes()) {
            auto c = conn_of_.find(rec->node_id);
            if (c != conn_of_.end() && MetadataFits(c->second)) {
              messenger_->Notify(c->second, meta, Payload::Shared(metadata_.For(cluster_, rec->role))).IgnoreError();
            }
            if (!rec->leaving) live.push_back(rec->node_id);
          }
          barriers_.SetAllNodes(std::move(live));
          break;
        }
        case Kind::kNodeTimedOut:
          LOG(WARNING) << "scheduler: " << RoleLabel(e.role) << " " << e.node_id << " (rank " << e.rank
                       << ") timed out";
          SendClusterEvent(e, pb::ClusterEventMessage::NODE_TIMED_OUT);
          barriers_.NodeFailed(e.node_id, "heartbeat timed out");
          break;
        case Kind::kNodeRestarted:
          LOG(INFO) << "scheduler: " << e.node_id << " restarted (new incarnation)";
          SendClusterEvent(e, pb::ClusterEventMessage::NODE_RESTARTED);
          barriers_.NodeRecovered(e.node_id);
          break;
        case Kind::kNodeRecovered:
          LOG(INFO) << "scheduler: " << e.node_id << " is back";
          SendClusterEvent(e, pb::ClusterEventMessage::NODE_RECOVERED);
          barriers_.NodeRecovered(e.node_id);
          break;
        case Kind::kNodeError:
          LOG(WARNING) << "scheduler: " << e.node_id << " reported error " << e.error_code << ": " << e.message;
          // A recoverable role: only the member hears of it; it resets and rejoins.
          SendClusterEvent(e, pb::ClusterEventMessage::NODE_ERROR, /*only_to_it=*/!e.propagate);
          if (!e.propagate) break;
          barriers_.NodeFailed(e.node_id, (e.reported ? "reported error: " : "") +
                                              e.message);
          break;
        case Kind::kFinishPassed:
          if (e.error_code != 0) {
            LOG(ERROR) << "scheduler: " << e.message;
            AnswerFinishWaiters(Status(Code::kAborted, e.message));
          } else {
            LOG(INFO) << "scheduler: every node finished; the job ends";
            AnswerFinishWaiters(Status::Ok());
          }
          break;
        case Kind::kFinishFailed:
          break;
        case Kind::kScaleOut: {
          LOG(INFO) << "scheduler: scale-out to " << e.worker_num << " workers, " << e.server_num
                    << " servers (epoch " << e.epoch << ")";
          pb::ScaleOutMessage msg;
          msg.set_worker_num(e.worker_num);
          msg.set_server_num(e.server_num);
          msg.set_epoch(e.epoch);
          Broadcast(MakeMeta(pb::SCALE_OUT, pb::SCHEDULER, 0), ToBuffer(msg));
          break;
        }
        case Kind::kScaleIn: {
          LOG(INFO) << "scheduler: scale-in to " << e.worker_num << " workers, " << e.server_num
                    << " servers (epoch " << e.epoch << ")";
          std::set<std::string> leaving(e.leaving_node_ids.begin(), e.leaving_node_ids.end());
          for (auto& [node_id, c] : Links()) {
            pb::ScaleInMessage msg;
            msg.set_worker_num(e.worker_num);
            msg.set_server_num(e.server_num);
            msg.set_epoch(e.epoch);
            msg.set_is_node_scale_in(leaving.count(node_id) != 0);
            for (auto& id : e.leaving_node_ids) msg.add_leaving_node_ids(id);
            messenger_->Notify(c, MakeMeta(pb::SCALE_IN, pb::SCHEDULER, 0), ToBuffer(msg)).IgnoreError();
          }
          break;
        }
        case Kind::kScaleDone:
          LOG(INFO) << "scheduler: scale operation done (epoch " << cluster_.epoch() << ")";
          last_scale_result_ = "done: " + std::to_string(cluster_.worker_num()) + " workers, " +
                               std::to_string(cluster_.server_num()) + " servers (epoch " +
                               std::to_string(cluster_.epoch()) + ")";
          break;
        case Kind::kRollback:
          LOG(WARNING) << "scheduler: scale operation rolled back: " << e.message;
          last_scale_result_ = "rolled back: " + e.message;
          SendClusterEvent(e, pb::ClusterEventMessage::ROLLBACK);
          break;
        case Kind::kNodeLeft: {
          barriers_.NodeFailed(e.node_id, "it left the cluster (scale-in)");
          auto c = conn_of_.find(e.node_id);
          if (c != conn_of_.end()) {
            messenger_->Notify(c->second, MakeMeta(pb::TERMINATE, pb::SCHEDULER, 0), nullptr).IgnoreError();
          }
          break;
        }
      }
    }
  }
  FlushNotices();
  PersistState();  // --state_dir: a snapshot if anything changed
  // This runs after every request: take the lock only when there is news for readers.
  if (cluster_.state() == published_state_ && cluster_.epoch() == published_epoch_) return;
  published_state_ = cluster_.state();
  published_epoch_ = cluster_.epoch();
  std::lock_guard<std::mutex> lock(mu_);
  state_snapshot_ = published_state_;
  epoch_snapshot_ = published_epoch_;
}

pb::AdminResponse SchedulerNode::StatusResponse(bool with_nodes) const {
  pb::AdminResponse resp;
  resp.set_cluster_state(cluster_.state());
  resp.set_epoch(cluster_.epoch());
  resp.set_worker_num(cluster_.worker_num());
  resp.set_server_num(cluster_.server_num());
  resp.set_registered_workers(cluster_.registered(pb::WORKER));
  resp.set_registered_servers(cluster_.registered(pb::SERVER));
  resp.set_last_scale_result(last_scale_result_);
  const core::JobOutcome& outcome = cluster_.outcome();
  resp.set_job_result(core::JobResultName(outcome.result));
  resp.set_job_failure(outcome.failure);
  for (const std::string& id : outcome.failed_nodes) resp.add_failed_nodes(id);
  if (!with_nodes) return resp;
  TimePoint now = clock_.Now();
  for (const core::NodeRecord* rec : cluster_.Nodes()) {
    pb::ServersMeta* m = resp.add_nodes();
    m->set_node_id(rec->node_id);
    m->set_role(rec->role);
    m->set_rank_id(rec->rank);
    m->set_ip(rec->ip);
    m->set_port(rec->port);
    m->set_is_alive(!rec->timed_out);
    m->set_resyncing(rec->resyncing && !rec->timed_out);
    m->set_state(rec->state);
    m->set_incarnation(rec->incarnation);
    m->set_last_heartbeat_age_ms(ToMillis(now - rec->last_heartbeat));
    for (auto& d : rec->devices) *m->add_devices() = d;
  }
  return resp;
}

void SchedulerNode::Admin(const pb::AdminRequest& req,
                          std::function<void(Status, pb::AdminResponse)> cb) {
  const AdminOpInfo* info = FindAdminOp(req.op());
  if (info == nullptr) {
    return cb(Status(Code::kInvalidArgument, "unknown admin operation '" + req.op() + "'"), StatusResponse(false));
  }
  Status st = CheckAdminFields(req);
  if (!st.ok()) return cb(st, StatusResponse(false));
  switch (info->op) {
    case AdminOp::kStatus:
      break;
    case AdminOp::kNodes:
      return cb(Status::Ok(), StatusResponse(true));
    case AdminOp::kScaleOut:
      st = cluster_.ScaleOut(req.worker_num(), req.server_num());
      break;
    case AdminOp::kScaleIn:
      st = req.node_ids_size() > 0 ? cluster_.ScaleInByIds({req.node_ids().begin(), req.node_ids().end()})
                                   : cluster_.ScaleInByCounts(req.worker_num(), req.server_num());
      break;
    case AdminOp::kNewInstance:
      st = cluster_.SetState(pb::CLUSTER_NEW_INSTANCE);
      break;
    case AdminOp::kEnable:
      st = cluster_.SetState(pb::CLUSTER_ENABLE_FLS);
      break;
    case AdminOp::kDisable:
      st = cluster_.SetState(pb::CLUSTER_DISABLE_FLS);
      break;
    case AdminOp::kReset:  // clears the error state of node_ids (ClusterManager::ResetNode)
      if (req.node_ids_size() == 0) st = Status(Code::kInvalidArgument, "reset needs node ids");
      for (const std::string& id : req.node_ids()) {
        if (st.ok()) st = cluster_.ResetNode(id);
        if (st.ok()) barriers_.NodeRecovered(id);
      }
      if (st.ok()) MarkStateDirty(/*urgent=*/true);  // the error state is persisted
      break;
    case AdminOp::kStop:
      st = cluster_.SetState(pb::CLUSTER_EXIT);
      break;
    case AdminOp::kBarriers: {
      pb::AdminResponse resp = StatusResponse(false);
      for (const core::BarrierInfo& b : barriers_.List()) {
        pb::BarrierInfo* out = resp.add_barriers();
        out->set_id(b.id);
        out->set_generation(b.generation);
        out->set_state(core::BarrierStateName(b.state));
        out->set_arrived(static_cast<int32_t>(b.arrived));
        out->set_expected(static_cast<int32_t>(b.expected));
        for (const std::string& m : b.missing) out->add_missing(m);
        if (!b.result.ok()) out->set_result(b.result.ToString());
      }
      return cb(Status::Ok(), resp);
    }
  }
  pb::AdminResponse resp = StatusResponse(false);
  if (st.ok() && info->op != AdminOp::kStatus) resp.set_message(req.op() + " accepted");
  cb(st, resp);
  DrainEvents();
}

// A member's certificate is as CA-signed as an operator's: the CN tells them apart, so a
// compromised or misconfigured member cannot steer the job.
Status SchedulerNode::CheckAdminCertificate(const std::string& op, const std::string& cn,
                                            const std::string& peer) const {
  if (options_.tls == nullptr || op == "status") return Status::Ok();
  const std::vector<std::string>& allowed = options_.tls_admin_cns;
  if (std::find(allowed.begin(), allowed.end(), cn) != allowed.end()) return Status::Ok();
  std::string list;
  for (const std::string& a : allowed) list += (list.empty() ? "" : ",") + a;
  Status why(Code::kPermissionDenied, "admin '" + op + "' refused: the TLS certificate of " + peer + " (CN=" + cn +
                                          ") is not an admin certificate (--tls_admin_cns=" + list + ")");
  LOG(ERROR) << "scheduler: " << why.message();
  return why;
}

void SchedulerNode::HandleAdmin(ConnId conn, const Frame& frame) {
  pb::AdminRequest req;
  Status st = ParsePayload(frame, &req);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  if (options_.tls != nullptr) {
    st = CheckAdminCertificate(req.op(), messenger_->transport().PeerIdentity(conn),
                               messenger_->transport().PeerAddress(conn));
    if (!st.ok()) return Reply(conn, frame.meta, st);
  }
  pb::MessageMeta meta = frame.meta;
  Admin(req, [this, conn, meta](Status s, pb::AdminResponse resp) {
    Reply(conn, meta, s, ToBuffer(resp));
  });
}

void SchedulerNode::ForgetGet(ConnId conn, uint64_t id) {
  auto it = kv_gets_.find(conn);
  if (it == kv_gets_.end()) return;
  it->second.erase(id);
  if (it->second.empty()) kv_gets_.erase(it);
}

// A connection closed: its blocking gets can never be answered, so they wait no longer.
void SchedulerNode::CancelGets(ConnId conn) {
  auto it = kv_gets_.find(conn);
  if (it == kv_gets_.end()) return;
  std::unordered_set<uint64_t> ids = std::move(it->second);
  kv_gets_.erase(it);
  for (uint64_t id : ids) kv_.CancelGet(id);  // their answers go nowhere
}

size_t SchedulerNode::kv_gets_waiting() {
  size_t n = 0;
  loop_->RunAndWait([this, &n] { n = kv_.waiting(); });
  return n;
}

void SchedulerNode::HandleKv(ConnId conn, const Frame& frame) {
  pb::KvRequest req;
  Status st = ParsePayload(frame, &req);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  pb::KvResponse resp;
  switch (req.op()) {
    case pb::KvRequest::SET:
      st = kv_.Set(req.key(), req.value(), req.overwrite());
      break;
    case pb::KvRequest::TRY_GET: {
      Result<std::string> r = kv_.TryGet(req.key());
      if (r.ok()) resp.set_value(*r);
      st = r.status();
      break;
    }
    case pb::KvRequest::GET: {
      std::unordered_set<uint64_t>& waiting = kv_gets_[conn];
      if (waiting.size() >= kMaxGetsPerConn) {
        st = Status(Code::kResourceExhausted, std::to_string(waiting.size()) +
                                                  " blocking KV gets already wait on this connection");
        break;
      }
      pb::MessageMeta meta = frame.meta;
      Duration timeout = WireMillis(req.timeout_ms());
      auto id = std::make_shared<uint64_t>(0);  // set once the get waits
      *id = kv_.Get(req.key(), timeout, [this, conn, meta, id](Result<std::string> r) {
        if (*id != 0) ForgetGet(conn, *id);
        pb::KvResponse out;
        if (r.ok()) out.set_value(*r);
        Reply(conn, meta, r.status(), ToBuffer(out));
      });
      // Looked up again: an answer given at once may have closed the connection (a peer
      // over the queued-output cap), and OnClose erased its set.
      if (*id != 0) {
        kv_gets_[conn].insert(*id);  // waits: nothing was sent
      } else if (auto w = kv_gets_.find(conn); w != kv_gets_.end() && w->second.empty()) {
        kv_gets_.erase(w);  // answered at once
      }
      return;
    }
    case pb::KvRequest::LIST:
      for (auto& [k, v] : kv_.List(req.key())) {
        pb::KvEntry* e = resp.add_entries();
        e->set_key(k);
        e->set_value(v);
      }
      break;
    case pb::KvRequest::DELETE:
      kv_.Delete(req.key());
      break;
    default:
      st = Status(Code::kInvalidArgument, "unknown KV operation " + std::to_string(req.op()));
  }
  if (st.ok() && (req.op() == pb::KvRequest::SET || req.op() == pb::KvRequest::DELETE)) {
    MarkStateDirty(/*urgent=*/false);
    // Answered once on disk: a member never learns of a change a restart would lose.
    BufferPtr body = ToBuffer(resp);
    pb::MessageMeta meta = frame.meta;
    return AnswerWhenDurable([this, conn, meta, body] { Reply(conn, meta, Status::Ok(), body); });
  }
  Reply(conn, frame.meta, st, ToBuffer(resp));
}

void SchedulerNode::HandleBarrier(ConnId conn, const Frame& frame) {
  pb::BarrierRequest req;
  Status st = ParsePayload(frame, &req);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  if (req.cancel()) return Reply(conn, frame.meta, barriers_.Cancel(req.id()));
  std::string node_id = req.node_id().empty() ? NodeOf(conn) : req.node_id();
  if (req.query_round()) {
    pb::BarrierResponse resp;
    resp.set_id(req.id());
    resp.set_generation(barriers_.LastRoundOf(req.id(), node_id));
    return Reply(conn, frame.meta, Status::Ok(), ToBuffer(resp));
  }
  pb::MessageMeta meta = frame.meta;
  barriers_.Arrive(req.id(), node_id, WireMillis(req.timeout_ms()),
                   {req.participants().begin(), req.participants().end()},
                   [this, conn, meta, id = req.id(), round = req.round()](Status s) {
                     pb::BarrierResponse resp;
                     resp.set_id(id);
                     resp.set_generation(round);
                     // The round's result goes into the state file first (a restarted
                     // scheduler answers a re-issued call with it).
                     MarkStateDirty(/*urgent=*/true);
                     BufferPtr body = ToBuffer(resp);
                     AnswerWhenDurable([this, conn, meta, s, body] { Reply(conn, meta, s, body); });
                   },
                   /*generation=*/req.round(), /*owner=*/conn);
}

}  // namespace pscore::node
