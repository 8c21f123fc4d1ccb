// SchedulerNode, the cluster events: drains core::ClusterManager's events after every
// request and tick, tells the members (CLUSTER_EVENT, coalesced per drain; SEND_METADATA;
// TERMINATE), the barriers and the listeners, and publishes the state for other threads.
#include "pscore/core/cluster_event.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"

namespace pscore::node {

using comm::ConnId;
using Kind = core::Event::Kind;

void SchedulerNode::DrainEvents() {
  DCHECK(loop_->InLoopThread());
  for (;;) {
    std::vector<core::Event> events = cluster_.TakeEvents();
    if (events.empty()) break;
    metadata_.Invalidate();
    for (const core::Event& e : events) {
      // Per-node notices in a row go out as one frame; anything else is sent after them.
      if (!IsNodeNotice(e.kind)) FlushNotices();
      for (auto& fn : listeners_) fn(e);
      HandleClusterEvent(e);
    }
  }
  FlushNotices();
  PersistState();  // --state_dir: a snapshot if anything changed
  PublishSnapshot();
}

void SchedulerNode::HandleClusterEvent(const core::Event& e) {
  DCHECK(loop_->InLoopThread());
  switch (e.kind) {
    case Kind::kStateChanged: return OnStateChanged(e);
    case Kind::kMetadataChanged: return PushMetadata();
    case Kind::kNodeTimedOut:
    case Kind::kNodeRestarted:
    case Kind::kNodeRecovered:
    case Kind::kNodeError: return OnNodeNotice(e);
    case Kind::kFinishPassed: return OnFinishPassed(e);
    case Kind::kFinishFailed: return;
    case Kind::kScaleOut: return BroadcastScaleOut(e);
    case Kind::kScaleIn: return BroadcastScaleIn(e);
    case Kind::kScaleDone:
    case Kind::kRollback: return NoteScaleEnd(e);
    case Kind::kNodeLeft: return OnNodeLeft(e);
  }
}

void SchedulerNode::OnStateChanged(const core::Event& e) {
  DCHECK(loop_->InLoopThread());
  LOG(INFO) << "scheduler: cluster state " << core::ClusterStateName(e.state) << " (epoch " << cluster_.epoch()
            << ")";
  SendClusterEvent(e);
  if (e.state != pb::CLUSTER_EXIT) return;
  // The notice says how the job ended (error_code kAborted: it failed, and why).
  pb::ClusterEventMessage end;
  end.set_kind(pb::ClusterEventMessage::STATE_CHANGED);
  end.set_cluster_state(pb::CLUSTER_EXIT);
  end.set_error_code(e.error_code);
  end.set_message(e.message);
  Broadcast(MakeMeta(pb::TERMINATE, pb::SCHEDULER, 0), ToBuffer(end));
  end_notice_ = end;
  {
    std::lock_guard<std::mutex> lock(mu_);
    outcome_snapshot_ = cluster_.outcome();
  }
  // Not reached: a live member whose link died quietly (closed after half a heartbeat
  // timeout without a word), or whose link is that quiet now (its member may have closed it
  // while the network was cut, the close not seen yet). A member that closed a live link
  // left by choice (e.g. it finished and went).
  std::set<std::string> untold;
  const TimePoint recent = clock_.Now() - options_.heartbeat_timeout / 2;
  for (const core::NodeRecord* rec : cluster_.Nodes()) {
    if (rec->timed_out) continue;
    auto c = conn_of_.find(rec->node_id);
    auto link = c == conn_of_.end() ? node_of_.end() : node_of_.find(c->second);
    const bool quiet = link == node_of_.end() ? quiet_close_.count(rec->node_id) > 0 : link->second.heard < recent;
    if (quiet) untold.insert(rec->node_id);
  }
  if (untold.empty()) return MarkExited();
  AwaitUntold(std::move(untold));
}

// Members that were live but whose link had died quietly, or was quiet, when the job ended
// (a link being redialed after a cut) may have missed its end: each is told when it
// registers or beats again (a second notice on a link that got the first is ignored). The
// scheduler waits for them up to 3 heartbeat timeouts (a member notices a silent scheduler
// in 2 and redials), then exits whether or not they came.
void SchedulerNode::AwaitUntold(std::set<std::string> untold) {
  DCHECK(loop_->InLoopThread());
  const Duration bound = 3 * options_.heartbeat_timeout;
  std::string names;
  for (const std::string& id : untold) names += (names.empty() ? "" : ", ") + id;
  LOG(WARNING) << "scheduler: the job ended while " << untold.size() << " member(s) had no live link (" << names
               << "); telling them when they come back, for up to " << ToMillis(bound) << " ms";
  untold_ = std::move(untold);
  untold_timer_ = loop_->AddTimer(bound, Duration::zero(), [this] {
    untold_timer_ = 0;
    std::string missed;
    for (const std::string& id : untold_) missed += (missed.empty() ? "" : ", ") + id;
    LOG(WARNING) << "scheduler: not told that the job ended (no link): " << missed;
    untold_.clear();
    MarkExited();
  });
}

bool SchedulerNode::TellEndIfUntold(ConnId conn, const std::string& node_id, uint64_t incarnation) {
  DCHECK(loop_->InLoopThread());
  if (untold_.count(node_id) == 0) return false;
  const core::NodeRecord* rec = cluster_.Find(node_id);
  if (rec == nullptr || rec->incarnation != incarnation) return false;
  untold_.erase(node_id);
  // On the link the end went out on: most likely the member's acknowledgement (a beat sent
  // before the notice arrived gets the second notice, which it ignores if it had the first).
  auto c = conn_of_.find(node_id);
  if (c != conn_of_.end() && c->second == conn) {
    LOG(INFO) << "scheduler: " << node_id << " acknowledged the end";
  } else {
    LOG(INFO) << "scheduler: " << node_id << " came back after the job ended; telling it";
  }
  messenger_->Notify(conn, MakeMeta(pb::TERMINATE, pb::SCHEDULER, 0), ToBuffer(end_notice_)).IgnoreError();
  if (untold_.empty() && untold_timer_ != 0) {
    loop_->CancelTimer(untold_timer_);
    untold_timer_ = 0;
    // The notice is queued on the link; node_main's pause before Stop lets it out.
    MarkExited();
  }
  return true;
}

// Built and serialised once (the cache) into one buffer per view that every member's frame
// references: no copy per member, and the transport counts each once toward its total of
// queued output (each member finds its own rank by node id). Members of a large membership
// get their role's view (MetadataCache).
void SchedulerNode::PushMetadata() {
  DCHECK(loop_->InLoopThread());
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
}

void SchedulerNode::OnNodeNotice(const core::Event& e) {
  DCHECK(loop_->InLoopThread());
  switch (e.kind) {
    case Kind::kNodeTimedOut:
      LOG(WARNING) << "scheduler: " << RoleLabel(e.role) << " " << e.node_id << " (rank " << e.rank
                   << ") timed out";
      SendClusterEvent(e);
      barriers_.NodeFailed(e.node_id, "heartbeat timed out");
      return;
    case Kind::kNodeRestarted:
      LOG(INFO) << "scheduler: " << e.node_id << " restarted (new incarnation)";
      SendClusterEvent(e);
      barriers_.NodeRecovered(e.node_id);
      return;
    case Kind::kNodeRecovered:
      LOG(INFO) << "scheduler: " << e.node_id << " is back";
      SendClusterEvent(e);
      barriers_.NodeRecovered(e.node_id);
      return;
    case Kind::kNodeError:
      LOG(WARNING) << "scheduler: " << e.node_id << " reported error " << e.error_code << ": " << e.message;
      // A recoverable role: only the member hears of it; it resets and rejoins.
      SendClusterEvent(e, /*only_to_it=*/!e.propagate);
      if (e.propagate) barriers_.NodeFailed(e.node_id, (e.reported ? "reported error: " : "") + e.message);
      return;
    default:
      return;
  }
}

void SchedulerNode::OnFinishPassed(const core::Event& e) {
  DCHECK(loop_->InLoopThread());
  if (e.error_code != 0) {
    LOG(ERROR) << "scheduler: " << e.message;
    AnswerFinishWaiters(Status(Code::kAborted, e.message));
  } else {
    LOG(INFO) << "scheduler: every node finished; the job ends";
    AnswerFinishWaiters(Status::Ok());
  }
}

void SchedulerNode::OnNodeLeft(const core::Event& e) {
  DCHECK(loop_->InLoopThread());
  quiet_close_.erase(e.node_id);
  barriers_.NodeFailed(e.node_id, "it left the cluster (scale-in)");
  auto c = conn_of_.find(e.node_id);
  if (c != conn_of_.end()) {
    messenger_->Notify(c->second, MakeMeta(pb::TERMINATE, pb::SCHEDULER, 0), nullptr).IgnoreError();
  }
}

// This runs after every request: the lock is taken only when there is news for readers.
void SchedulerNode::PublishSnapshot() {
  DCHECK(loop_->InLoopThread());
  if (cluster_.state() == published_state_ && cluster_.epoch() == published_epoch_) return;
  published_state_ = cluster_.state();
  published_epoch_ = cluster_.epoch();
  std::lock_guard<std::mutex> lock(mu_);
  state_snapshot_ = published_state_;
  epoch_snapshot_ = published_epoch_;
}

// One buffer for every link, counted once in the transport's queued total.
void SchedulerNode::Broadcast(const pb::MessageMeta& meta, const BufferPtr& payload) {
  DCHECK(loop_->InLoopThread());
  for (auto& [node_id, c] : Links()) messenger_->Notify(c, meta, Payload::Shared(payload)).IgnoreError();
}

bool SchedulerNode::IsNodeNotice(core::Event::Kind kind) {
  return kind == Kind::kNodeTimedOut || kind == Kind::kNodeRestarted || kind == Kind::kNodeRecovered ||
         kind == Kind::kNodeError;
}

void SchedulerNode::FlushNotices() {
  DCHECK(loop_->InLoopThread());
  if (!has_notices_) return;
  has_notices_ = false;
  BufferPtr payload = ToBuffer(notices_);
  notices_.Clear();
  Broadcast(MakeMeta(pb::CLUSTER_EVENT, pb::SCHEDULER, 0), payload);
}

// A copy of the node links to send over: a send may close its connection at once (a
// peer over the queued-output cap), and OnClose then erases it from conn_of_.
std::vector<std::pair<std::string, ConnId>> SchedulerNode::Links() const {
  DCHECK(loop_->InLoopThread());
  return std::vector<std::pair<std::string, ConnId>>(conn_of_.begin(), conn_of_.end());
}

uint64_t SchedulerNode::QueuedOn(ConnId conn) const { return messenger_->transport().QueuedBytes(conn); }

bool SchedulerNode::MetadataFits(ConnId conn) const { return QueuedOn(conn) <= kMetadataGateBytes; }

void SchedulerNode::SendMetadataTo(const std::string& node_id) {
  DCHECK(loop_->InLoopThread());
  auto c = conn_of_.find(node_id);
  const core::NodeRecord* rec = cluster_.Find(node_id);
  if (c == conn_of_.end() || rec == nullptr || !MetadataFits(c->second)) return;
  messenger_->Notify(c->second, MakeMeta(pb::SEND_METADATA, pb::SCHEDULER, 0),
                     Payload::Shared(metadata_.For(cluster_, rec->role)))
      .IgnoreError();
}

void SchedulerNode::SendClusterEvent(const core::Event& e, bool only_to_it) {
  DCHECK(loop_->InLoopThread());
  pb::ClusterEventMessage ev = core::ToClusterEvent(e, cluster_.state(), cluster_.epoch());
  if (only_to_it) {
    FlushNotices();  // notices drained before it reach the node first
    auto c = conn_of_.find(e.node_id);
    if (c != conn_of_.end()) {
      messenger_->Notify(c->second, MakeMeta(pb::CLUSTER_EVENT, pb::SCHEDULER, 0), ToBuffer(ev)).IgnoreError();
    }
    return;
  }
  if (IsNodeNotice(e.kind)) {
    // Held until the drain's next other event or its end (FlushNotices): K notices in a
    // row cost each member one frame, the first notice with the others in `more`.
    if (has_notices_) {
      *notices_.add_more() = std::move(ev);
    } else {
      notices_ = std::move(ev);
      has_notices_ = true;
    }
    return;
  }
  Broadcast(MakeMeta(pb::CLUSTER_EVENT, pb::SCHEDULER, 0), ToBuffer(ev));
}

}  // namespace pscore::node
