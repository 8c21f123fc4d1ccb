// SchedulerNode, the coordination services: the finish barrier (FINISH), the KV store,
// barriers and members' events (SEND_EVENT).
#include "pscore/node/scheduler/scheduler_node.h"

#include "pscore/node/common/wire.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

namespace {

// A GET or TRY_GET answer holding `value` (KvResponse.value).
BufferPtr KvValueAnswer(std::string_view value) {
  return ToBufferWithBytes(pb::KvResponse(), pb::KvResponse::kValueFieldNumber, value);
}

}  // namespace

void SchedulerNode::HandleFinish(ConnId conn, const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  pb::FinishMessage msg;
  Status st = ParsePayload(frame, &msg);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  if (auto w = finish_waiters_.find(conn); w != finish_waiters_.end()) {
    return Reply(conn, frame.meta, Status(Code::kResourceExhausted, "a FINISH for " + w->second.node_id +
                                                                          " already waits on this connection"));
  }
  st = cluster_.Finish(msg.node_id());
  if (!st.ok()) return Reply(conn, frame.meta, st);
  barriers_.NodeFailed(msg.node_id(), "it shut down (called Finish)");
  MarkStateDirty(/*urgent=*/true);
  finish_waiters_[conn] = FinishWaiter{frame.meta,
                                       clock_.Now() + WireMillis(msg.timeout_ms(), std::chrono::seconds(60)),
                                       msg.node_id()};
  LOG(INFO) << "scheduler: " << msg.node_id() << " finished; waiting for "
            << cluster_.FinishMissing().size() << " more";
}

size_t SchedulerNode::finish_waiting() {
  size_t n = 0;
  loop_->RunAndWait([this, &n] { n = finish_waiters_.size(); });
  return n;
}

void SchedulerNode::AnswerFinishWaiters(const Status& st) {
  DCHECK(loop_->InLoopThread());
  std::map<ConnId, FinishWaiter> waiters;
  waiters.swap(finish_waiters_);
  for (auto& [conn, w] : waiters) Reply(conn, w.meta, st);
}

void SchedulerNode::ExpireFinishWaiters() {
  DCHECK(loop_->InLoopThread());
  if (finish_waiters_.empty()) return;
  TimePoint now = clock_.Now();
  std::vector<std::string> missing = cluster_.FinishMissing();
  std::string names;
  for (auto& m : missing) names += (names.empty() ? "" : ", ") + m;
  bool expired = false;
  for (auto it = finish_waiters_.begin(); it != finish_waiters_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    expired = true;
    // Erased first: a reply may close its connection, and OnClose erases from this map.
    const ConnId conn = it->first;
    const pb::MessageMeta meta = std::move(it->second.meta);
    it = finish_waiters_.erase(it);
    Reply(conn, meta,
          Status(Code::kTimeout, "finish timed out: " + std::to_string(missing.size()) +
                                     " node(s) missing: " + names));
  }
  if (!expired) return;
  // The others gave up waiting for the stragglers: they are in error (everyone hears of it)
  // and must be reset before they register again.
  cluster_.FinishTimedOut(missing);
}

void SchedulerNode::HandleEvent(ConnId conn, const Frame& frame) {
  DCHECK(loop_->InLoopThread());
  pb::EventMessage msg;
  Status st = ParsePayload(frame, &msg);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  pb::EventRespMessage ev;
  ev.set_event(msg.event());
  ev.set_node_id(msg.node_id());
  ev.set_payload(msg.payload());
  BufferPtr payload = ToBuffer(ev);
  pb::MessageMeta meta = MakeMeta(pb::SEND_EVENT, pb::SCHEDULER, 0);
  for (auto& [node_id, c] : Links()) {
    if (node_id != msg.node_id()) messenger_->Notify(c, meta, payload).IgnoreError();
  }
  Reply(conn, frame.meta, Status::Ok());
}

void SchedulerNode::ForgetGet(ConnId conn, uint64_t id) {
  DCHECK(loop_->InLoopThread());
  auto it = kv_gets_.find(conn);
  if (it == kv_gets_.end()) return;
  it->second.erase(id);
  if (it->second.empty()) kv_gets_.erase(it);
}

// A connection closed: its blocking gets can never be answered, so they wait no longer.
void SchedulerNode::CancelGets(ConnId conn) {
  DCHECK(loop_->InLoopThread());
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
  DCHECK(loop_->InLoopThread());
  pb::KvRequest req;
  Status st = ParsePayload(frame, &req);
  if (!st.ok()) return Reply(conn, frame.meta, st);
  pb::KvResponse resp;
  switch (req.op()) {
    case pb::KvRequest::SET:
      st = kv_.Set(req.key(), std::move(*req.mutable_value()), req.overwrite());
      break;
    case pb::KvRequest::TRY_GET:
    case pb::KvRequest::GET: {
      // A value held now is answered with it copied once, straight from the store.
      Result<std::string_view> held = kv_.TryGetView(req.key());
      if (held.ok()) return Reply(conn, frame.meta, Status::Ok(), KvValueAnswer(*held));
      if (req.op() == pb::KvRequest::GET) return StartKvGet(conn, frame.meta, req);
      st = held.status();
      break;
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

void SchedulerNode::StartKvGet(ConnId conn, const pb::MessageMeta& meta, const pb::KvRequest& req) {
  DCHECK(loop_->InLoopThread());
  std::unordered_set<uint64_t>& waiting = kv_gets_[conn];
  if (waiting.size() >= kMaxGetsPerConn) {
    return Reply(conn, meta, Status(Code::kResourceExhausted, std::to_string(waiting.size()) +
                                                                  " blocking KV gets already wait on this connection"),
                 ToBuffer(pb::KvResponse()));
  }
  auto id = std::make_shared<uint64_t>(0);  // set once the get waits
  *id = kv_.Get(req.key(), WireMillis(req.timeout_ms()), [this, conn, meta, id](Result<std::string> r) {
    if (*id != 0) ForgetGet(conn, *id);
    Reply(conn, meta, r.status(), r.ok() ? KvValueAnswer(*r) : ToBuffer(pb::KvResponse()));
  });
  // Looked up again: an answer given at once may have closed the connection (a peer over
  // the queued-output cap), and OnClose erased its set.
  if (*id != 0) {
    kv_gets_[conn].insert(*id);  // waits: nothing was sent
  } else if (auto w = kv_gets_.find(conn); w != kv_gets_.end() && w->second.empty()) {
    kv_gets_.erase(w);  // answered at once
  }
}

void SchedulerNode::HandleBarrier(ConnId conn, const Frame& frame) {
  DCHECK(loop_->InLoopThread());
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
