// SchedulerNode, the scale operations as the scheduler's loop sees them: the broadcasts
// that start one (SCALE_OUT, SCALE_IN), the members' reports that end it (SCALE_OUT_DONE,
// SCALE_IN_DONE), and how the last one ended (admin status). The state machine itself is
// core::ClusterManager's (cluster_manager_scale.cc).
#include <set>

#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

void SchedulerNode::HandleScaleDone(ConnId conn, const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  std::string node_id;
  uint64_t epoch = 0;
  Status st;
  if (frame.meta.cmd() == pb::SCALE_OUT_DONE) {
    pb::ScaleOutDoneMessage msg;
    st = ParsePayload(frame, &msg);
    node_id = msg.node_id();
    epoch = msg.epoch();
    if (st.ok()) st = cluster_.ScaleOutDone(node_id, epoch);
  } else {
    pb::ScaleInDoneMessage msg;
    st = ParsePayload(frame, &msg);
    node_id = msg.node_id();
    epoch = msg.epoch();
    if (st.ok()) st = cluster_.ScaleInDone(node_id, epoch);
  }
  if (st.code() == Code::kAborted) LOG(WARNING) << "scheduler: ignored stale " << node_id << ": " << st;
  Reply(conn, frame.meta, st);
}

void SchedulerNode::BroadcastScaleOut(const core::Event& e) {
  DCHECK(loop_->InLoopThread());
  LOG(INFO) << "scheduler: scale-out to " << e.worker_num << " workers, " << e.server_num << " servers (epoch "
            << e.epoch << ")";
  pb::ScaleOutMessage msg;
  msg.set_worker_num(e.worker_num);
  msg.set_server_num(e.server_num);
  msg.set_epoch(e.epoch);
  Broadcast(MakeMeta(pb::SCALE_OUT, pb::SCHEDULER, 0), ToBuffer(msg));
}

// Each member is told whether it is one of those leaving.
void SchedulerNode::BroadcastScaleIn(const core::Event& e) {
  DCHECK(loop_->InLoopThread());
  LOG(INFO) << "scheduler: scale-in to " << e.worker_num << " workers, " << e.server_num << " servers (epoch "
            << e.epoch << ")";
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
}

// kScaleDone or kRollback: kept for admin status; a rollback is also told to the members.
void SchedulerNode::NoteScaleEnd(const core::Event& e) {
  DCHECK(loop_->InLoopThread());
  if (e.kind == core::Event::Kind::kScaleDone) {
    LOG(INFO) << "scheduler: scale operation done (epoch " << cluster_.epoch() << ")";
    last_scale_result_ = "done: " + std::to_string(cluster_.worker_num()) + " workers, " +
                         std::to_string(cluster_.server_num()) + " servers (epoch " +
                         std::to_string(cluster_.epoch()) + ")";
    return;
  }
  LOG(WARNING) << "scheduler: scale operation rolled back: " << e.message;
  last_scale_result_ = "rolled back: " + e.message;
  SendClusterEvent(e);
}

}  // namespace pscore::node
