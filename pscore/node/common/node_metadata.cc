// Node: what the scheduler pushes (metadata, cluster state and events, scale-out and
// scale-in, user events, TERMINATE), the metadata fetch, and the scale DONE answers. Every
// scale decision and epoch comparison is scale_'s (core::ScaleParticipant); this file
// does what it decides. Loop thread throughout.
#include <algorithm>

#include "pscore/core/cluster_manager.h"
#include "pscore/node/common/node.h"
#include "pscore/node/common/peer_links.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

namespace {

// The totals size per-server work on a node (a worker groups every push by server): a
// count no scheduler would send is refused, not trusted.
bool PlausibleTotals(const pb::SendMetadataMessage& md) {
  auto in_range = [](int64_t n) { return n >= 0 && n <= core::kMaxRoleTotal; };
  return in_range(md.worker_num()) && in_range(md.server_num()) && in_range(md.omitted_workers()) &&
         md.worker_ids_size() <= core::kMaxRoleTotal && md.worker_ids_size() == md.worker_ranks_size();
}

}  // namespace

void Node::HandleSchedulerPush(ConnId conn, Frame&& frame) {
  DCHECK(loop_->InLoopThread());
  if (ended_) {
    VLOG(1) << options_.node_id << ": terminated; ignored " << pb::NodeCommand_Name(frame.meta.cmd())
            << " from the scheduler";
    return;
  }
  switch (frame.meta.cmd()) {
    case pb::SEND_METADATA: {
      pb::SendMetadataMessage md;
      if (ParsePayload(frame, &md).ok()) ApplyMetadata(std::move(md));
      break;
    }
    case pb::CLUSTER_EVENT: OnClusterEventPush(frame); break;
    case pb::SEND_EVENT: {
      pb::EventRespMessage ev;
      if (ParsePayload(frame, &ev).ok() && callbacks_.on_user_event) {
        callbacks_.on_user_event(ev.node_id(), ev.event(), ev.payload());
      }
      break;
    }
    case pb::SCALE_OUT: OnScaleOutPush(frame); break;
    case pb::SCALE_IN: OnScaleInPush(frame); break;
    case pb::TERMINATE: {
      pb::ClusterEventMessage end;  // how the job ended; empty: it finished
      if (!ParsePayload(frame, &end).ok()) end.Clear();
      LOG(INFO) << options_.node_id << ": terminated by the scheduler";
      TerminateAsTold(end);
      break;
    }
    default:
      LOG(WARNING) << options_.node_id << ": unexpected " << pb::NodeCommand_Name(frame.meta.cmd())
                   << " from the scheduler";
  }
}

void Node::OnClusterEventPush(const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  pb::ClusterEventMessage ev;
  if (!ParsePayload(frame, &ev).ok()) return;
  // Notices coalesced by the scheduler: each handled in order as if sent alone.
  google::protobuf::RepeatedPtrField<pb::ClusterEventMessage> more;
  more.Swap(ev.mutable_more());
  HandleClusterEvent(ev);
  for (pb::ClusterEventMessage& m : more) {
    m.clear_more();  // one level only
    HandleClusterEvent(m);
  }
}

void Node::OnScaleOutPush(const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  pb::ScaleOutMessage msg;
  if (!ParsePayload(frame, &msg).ok()) return;
  const core::ScaleActions actions = scale_.OnScaleOut(msg.epoch());
  if (core::Ignored(actions)) return Perform(actions);
  LOG(INFO) << options_.node_id << ": scale-out to " << msg.worker_num() << " workers, " << msg.server_num()
            << " servers";
  Perform(actions);
  if (callbacks_.on_scale_out) callbacks_.on_scale_out(msg);
}

void Node::OnScaleInPush(const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  pb::ScaleInMessage msg;
  if (!ParsePayload(frame, &msg).ok()) return;
  const core::ScaleActions actions = scale_.OnScaleIn(msg.epoch());
  if (core::Ignored(actions)) return Perform(actions);
  LOG(INFO) << options_.node_id << ": scale-in to " << msg.worker_num() << " workers, " << msg.server_num()
            << " servers" << (msg.is_node_scale_in() ? "; this node leaves" : "");
  Perform(actions, nullptr, &msg);
}

void Node::HandleClusterEvent(const pb::ClusterEventMessage& ev) {
  DCHECK(loop_->InLoopThread());
  if (ev.kind() == pb::ClusterEventMessage::STATE_CHANGED) {
    if (ev.cluster_state() == pb::CLUSTER_EXIT) TerminateAsTold(ev);
    if (ev.cluster_state() == pb::CLUSTER_NEW_INSTANCE && callbacks_.on_new_instance) {
      callbacks_.on_new_instance();
    }
    ApplyState(ev.cluster_state());
  }
  OnClusterEvent(ev);
  if (callbacks_.on_cluster_event) callbacks_.on_cluster_event(ev);
}

// One fetch in flight at a time. An answer older than the newest epoch a heartbeat showed
// meanwhile (the membership changed again mid-fetch) is applied and fetched again, as long
// as each answer moves us forward; a failed fetch is retried by the next heartbeat.
void Node::FetchMetadata(uint64_t epoch) {
  DCHECK(loop_->InLoopThread());
  scale_.WantMetadata(epoch);
  if (metadata_fetching_ || closed_ || scheduler_ == nullptr || !scheduler_->connected()) return;
  metadata_fetching_ = true;
  messenger_->Call(scheduler_->conn(), SchedulerMeta(pb::FETCH_METADATA), nullptr,
                   options_.heartbeat_interval * 3, [this, session = session_id_](Result<Frame> r) {
    metadata_fetching_ = false;
    if (closed_ || ended_) return;
    if (core::IsStaleSession(r.status())) return OnStaleSession(session, r.status());
    pb::SendMetadataMessage md;
    if (!r.ok() || !ParsePayload(*r, &md).ok()) {
      VLOG(1) << options_.node_id << ": metadata fetch failed: " << r.status();
      return;
    }
    const uint64_t before = scale_.epoch();
    ApplyMetadata(std::move(md));
    if (const uint64_t next = scale_.FetchAgain(before); next != 0) FetchMetadata(next);
  });
}

void Node::ApplyMetadata(pb::SendMetadataMessage md) {
  DCHECK(loop_->InLoopThread());
  if (!PlausibleTotals(md)) {
    LOG(WARNING) << options_.node_id << ": ignored metadata of epoch " << md.epoch() << " with impossible totals: "
                 << md.worker_num() << " workers, " << md.server_num() << " servers, "
                 << md.worker_ids_size() << " worker ids with " << md.worker_ranks_size() << " ranks";
    return;
  }
  const core::ScaleActions taken = scale_.OnMetadata(md.epoch());
  if (core::Ignored(taken)) return Perform(taken);
  // Every member gets the same bytes: our rank is that of our own entry, found by node id
  // (the message's rank_id is what a scheduler that sets it per member said). A worker's
  // view of a large membership has no worker entries: it keeps the rank it was told (at
  // registration, then in each heartbeat answer).
  const auto& own = options_.role == pb::SERVER ? md.servers_meta() : md.workers_meta();
  if (options_.role == pb::WORKER && md.omitted_workers() > 0) md.set_rank_id(rank_);
  for (const pb::ServersMeta& m : own) {
    if (m.node_id() != options_.node_id) continue;
    md.set_rank_id(m.rank_id());
    break;
  }
  metadata_ = md;
  rank_ = md.rank_id();
  links_->Apply(md);
  PublishSnapshot();
  if (callbacks_.on_metadata) callbacks_.on_metadata(md);
  ApplyState(md.cluster_state());
  OnMetadataApplied();
  // Scale-out: once the metadata holds every new node, the role moves what it must (then
  // SCALE_OUT_DONE of that epoch); a republish during scale-in restarts the done round.
  const bool holds_every_node = md.servers_meta_size() == md.server_num() &&
                                md.workers_meta_size() + md.omitted_workers() == md.worker_num();
  Perform(scale_.OnMetadataApplied(holds_every_node), &md);
}

void Node::Perform(const core::ScaleActions& actions, const pb::SendMetadataMessage* md,
                   const pb::ScaleInMessage* scale_in) {
  DCHECK(loop_->InLoopThread());
  using Kind = core::ScaleAction::Kind;
  for (const core::ScaleAction& a : actions) {
    const uint64_t epoch = a.epoch;
    switch (a.kind) {
      case Kind::kIgnoreStale:
        LOG(WARNING) << options_.node_id << ": ignored " << a.reason;
        break;
      case Kind::kStateChanged:
        StateChanged(a);
        break;
      case Kind::kMoveForScaleOut:
        CHECK(md != nullptr) << "a scale-out move without its metadata";
        OnScaleOutReady(*md, [this, epoch] {
          loop_->Run([this, epoch] { Perform(scale_.OnMovedForScaleOut(epoch)); });
        });
        break;
      case Kind::kHandOver:
        CHECK(scale_in != nullptr) << "a hand-over without its SCALE_IN";
        if (callbacks_.on_scale_in) callbacks_.on_scale_in(*scale_in);
        OnScaleInStart(*scale_in, [this, epoch] {
          loop_->Run([this, epoch] { Perform(scale_.OnHandedOver(epoch)); });
        });
        break;
      case Kind::kSendScaleOutDone:
        SendScaleDone(pb::SCALE_OUT_DONE, epoch);
        break;
      case Kind::kSendScaleInDone:
        SendScaleDone(pb::SCALE_IN_DONE, epoch);
        break;
      case Kind::kFetchMetadata:
        FetchMetadata(epoch);
        break;
    }
  }
}

void Node::SendScaleDone(pb::NodeCommand cmd, uint64_t epoch) {
  DCHECK(loop_->InLoopThread());
  if (scheduler_ == nullptr || !scheduler_->connected()) return;
  BufferPtr payload;
  if (cmd == pb::SCALE_OUT_DONE) {
    pb::ScaleOutDoneMessage msg;
    msg.set_node_id(options_.node_id);
    msg.set_epoch(epoch);
    payload = ToBuffer(msg);
  } else {
    pb::ScaleInDoneMessage msg;
    msg.set_node_id(options_.node_id);
    msg.set_epoch(epoch);
    payload = ToBuffer(msg);
  }
  VLOG(1) << options_.node_id << ": " << pb::NodeCommand_Name(cmd) << " epoch " << epoch;
  messenger_->Call(scheduler_->conn(), SchedulerMeta(cmd), payload, options_.request_timeout,
                   [this, cmd, epoch](Result<Frame> r) {
                     if (!r.ok()) {
                       LOG(WARNING) << options_.node_id << ": " << pb::NodeCommand_Name(cmd) << " of epoch "
                                    << epoch << " refused: " << r.status();
                     }
                   });
}

void Node::ApplyState(pb::ClusterState state) {
  DCHECK(loop_->InLoopThread());
  Perform(scale_.OnState(state));
}

// The role hears of the state before held traffic goes out (a worker routes by it first).
void Node::StateChanged(const core::ScaleAction& change) {
  DCHECK(loop_->InLoopThread());
  PublishSnapshot();
  OnStateApplied(change.state);
  if (change.release_hold) OnHoldReleased();
  if (callbacks_.on_state) callbacks_.on_state(change.state);
  if (change.state == pb::CLUSTER_EXIT) Terminate(Status::Ok());
}

}  // namespace pscore::node
