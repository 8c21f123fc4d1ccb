// WorkerNode's key-value requests on the loop thread: the split of a request into one part
// per server, its sends, its answers, and the parts held for a re-send (while the cluster
// scales, or while a lost server is retried).
#include <algorithm>
#include <numeric>

#include "pscore/core/kv_codec.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/worker/pull_request.h"
#include "pscore/node/worker/push_parts.h"
#include "pscore/node/worker/worker_node.h"

namespace pscore::node {

using comm::Frame;

namespace {

// Why a part whose server was lost failed: the server, how often and how long it was tried.
Status GaveUpStatus(const std::string& server, TimePoint lost_since, int sends, const Status& last,
                    Duration recovery_timeout) {
  const auto waited = ToMillis(std::chrono::steady_clock::now() - lost_since);
  return Status(Code::kUnavailable, "server " + server + " lost: sent " + std::to_string(sends) + " times over " +
                                        std::to_string(waited) + " ms (recovery_timeout " +
                                        std::to_string(ToMillis(recovery_timeout)) + " ms); last error: " +
                                        last.ToString());
}

PullRequest& AsPull(KvRequest& op) { return static_cast<PullRequest&>(op); }

}  // namespace

void WorkerNode::Dispatch(const std::shared_ptr<KvRequest>& op, KvPart part) {
  DCHECK(loop()->InLoopThread());
  if (op->finished) return;
  if (closed()) return op->Fail(Stopped());  // a shared loop runs on after Stop
  const int n = loop_metadata().server_num();
  // While a scale holds traffic, and behind parts held for a re-send: a request issued
  // after a push that must be sent again must not overtake it.
  if (scale().holding() || n == 0 || !held_.empty()) {
    held_.emplace_back(op, std::move(part));
    WatchHeld();
    return;
  }
  if (op->is_push()) {
    if (part.for_servers != n) return Resplit(op, std::move(part), n);
    return Send(op, std::move(part));
  }
  if (n == 1) {  // every key to the one server: no grouping
    part.server = 0;
    part.for_servers = n;
    return Send(op, std::move(part));
  }
  SplitPull(op, std::move(part), n);
}

void WorkerNode::Resplit(const std::shared_ptr<KvRequest>& op, KvPart part, int servers) {
  std::vector<KvPart> parts;
  const Status st = ResplitPush(part, servers, *op, &parts);
  if (!st.ok()) return op->Fail(st);
  for (KvPart& p : parts) Send(op, std::move(p));
}

void WorkerNode::SplitPull(const std::shared_ptr<KvRequest>& op, KvPart part, int servers) {
  const PullRequest& pull = AsPull(*op);
  const size_t n = part.indices.size();
  std::vector<uint64_t> listed_keys;  // the part's keys, unless they are a run of pull.keys
  const uint64_t* ks = n > 0 && part.indices.consecutive() ? pull.keys.data() + part.indices.front() : nullptr;
  if (ks == nullptr) {
    listed_keys.reserve(n);
    for (size_t j = 0; j < n; ++j) listed_keys.push_back(pull.keys[part.indices[j]]);
    ks = listed_keys.data();
  }
  std::vector<std::vector<size_t>> groups = ByOwner(ks, n, servers, scratch_.get());
  for (int s = 0; s < servers; ++s) {
    if (groups[s].empty()) continue;
    KvPart sub = part.Successor();
    sub.server = s;
    sub.for_servers = servers;
    for (size_t& j : groups[s]) j = part.indices[j];  // the part's j-th key: the op's
    sub.indices = KeyIndices::Listed(std::move(groups[s]));
    Send(op, std::move(sub));
  }
  scratch_->Give(part.indices.Release());
}

Payload WorkerNode::PullPayload(const std::shared_ptr<KvRequest>& req, const KvPart& part, comm::AnswerSink* sink) {
  const PullRequest& op = AsPull(*req);
  const KeyIndices& idx = part.indices;
  Payload payload;
  if (idx.consecutive()) {
    // Consecutive keys (all of them, for one server): many are written from op.keys, which
    // stay as they are while the request lives; a few are copied.
    const uint64_t* keys = op.keys.data() + idx.front();
    payload = idx.size() * sizeof(uint64_t) >= core::kZeroCopyBytes
                  ? core::EncodePullRequestShared(keys, idx.size(), std::shared_ptr<const void>(req, keys))
                  : Payload(core::EncodePullRequest(keys, idx.size()));
  } else {
    payload = core::EncodePullRequestFilled(idx.size(), [&](uint64_t* dst) {
      for (size_t j = 0; j < idx.size(); ++j) dst[j] = op.keys[idx[j]];
    });
  }
  // An answer written from the store (head + values) whose place in dest is known has its
  // values read straight into it.
  uint64_t off = 0;
  uint64_t floats = 0;
  if (op.SinkRegion(idx, &off, &floats)) {
    *sink = comm::AnswerSink{reinterpret_cast<char*>(op.dest + off), floats * sizeof(float)};
  }
  return payload;
}

void WorkerNode::Send(const std::shared_ptr<KvRequest>& op, KvPart part) {
  DCHECK(loop()->InLoopThread());
  comm::AnswerSink sink;
  Payload payload = op->is_push() ? part.payload : PullPayload(op, part, &sink);
  // The range's primary under the current metadata (with replicas, the first live copy);
  // with every copy down, the range's own rank (the send fails and is retried).
  int server = Primary(part.server);
  if (server < 0) server = part.server;
  part.target = server;
  ++op->parts_sent;
  part.addr = ServerAddress(server);
  part.via = RelayFor(server);
  const Status last_error = part.lost;
  part.lost = Status::Ok();
  if (part.lost_since != TimePoint{}) ++part.attempts;
  pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::WORKER, -1);
  meta.set_handler(op->is_push() ? kPushHandler : kPullHandler);
  if (op->is_push()) {
    // The same id on every send of this part: a server that applied it acknowledges a
    // repeat without applying it again.
    if (part.push_seq == 0) part.push_seq = ++push_seq_;
    pb::PushId* id = meta.mutable_push_id();
    id->set_writer(options_.node_id);
    id->set_incarnation(push_incarnation_);
    id->set_seq(part.push_seq);
    if (part.origin_seq != 0) id->set_origin_seq(part.origin_seq);
  }
  // Through another server when this one cannot be reached from here (worker_relay.cc).
  std::shared_ptr<int> relayed;
  if (part.via >= 0) {
    meta.set_relay_rank(server);
    relayed = relays_[server].in_flight;
    ++*relayed;
    relayed_parts_.fetch_add(1, std::memory_order_relaxed);
  }
  auto timer = std::make_shared<comm::TimerId>(0);
  part.sent_at = std::chrono::steady_clock::now();
  if (part.lost_since != TimePoint{}) WatchRecovery(op, part, last_error, timer);
  const int to = part.via >= 0 ? part.via : server;
  IssuePart(to, std::move(meta), std::move(payload), sink,
            [this, op, timer, relayed, part = std::move(part)](Result<Frame> r) mutable {
              if (*timer != 0) loop()->CancelTimer(*timer);
              *timer = 0;
              if (relayed) --*relayed;
              OnPart(op, std::move(part), std::move(r));
            });
}

// A part sent again while its server is lost ends at its recovery deadline even when the
// send is still under way then (a dial alone may take connect_timeout), unless the
// metadata has named a new address for the server meanwhile: then the send (to the old
// one) ends by itself and the part goes to the new one. The timer ends with the send.
void WorkerNode::WatchRecovery(const std::shared_ptr<KvRequest>& op, const KvPart& part, const Status& last,
                               const std::shared_ptr<comm::TimerId>& timer) {
  const Duration left = HeldUntil(*op, part) - part.sent_at;
  *timer = loop()->AddTimer(std::max(left, Duration::zero()), Duration::zero(),
                            [this, op, timer, rank = part.target, range = part.server, addr = part.addr,
                             server_name = part.lost_server, since = part.lost_since, sends = part.attempts + 1,
                             last] {
                              *timer = 0;
                              if (ServerAddress(rank) != addr || Primary(range) != rank) return;
                              op->Fail(GaveUpStatus(server_name, since, sends, last, options_.recovery_timeout));
                            });
}

void WorkerNode::OnPart(const std::shared_ptr<KvRequest>& op, KvPart part, Result<Frame> r) {
  DCHECK(loop()->InLoopThread());
  if (!op->PartEnded()) return;
  if (!r.ok()) {
    const Code code = r.status().code();
    // kAborted: the server no longer owns these keys (a scale operation moved them). Nothing
    // of this part was applied, so it is safe to send it again once the metadata is new.
    if (code == Code::kAborted && std::chrono::steady_clock::now() < op->deadline) {
      VLOG(1) << options_.node_id << ": " << (op->is_push() ? part.num_keys : part.indices.size())
              << " keys moved; re-sending after the scale";
      return HoldForRetry(op, std::move(part));
    }
    // The link died before the answer, or the server cannot be reached (killed, restarting
    // on the same or a new address), or it asks for the push again (being applied by an
    // earlier send). Sent again with the same push id until recovery_timeout: a server that
    // applied it acknowledges the repeat without applying it. A server that left by a
    // scale-in had handed its keys over first: the part goes to their new owner.
    if (code == Code::kUnavailable || (code == Code::kTimeout && part.lost_since != TimePoint{})) {
      return RetryLost(op, std::move(part), r.status());
    }
    return op->Fail(r.status());
  }
  if (op->is_push()) return op->Acked(part.num_keys);
  OnPullAnswer(op, std::move(part), std::move(*r));
}

void WorkerNode::OnPullAnswer(const std::shared_ptr<KvRequest>& req, KvPart part, Frame frame) {
  PullRequest& op = AsPull(*req);
  if (AfterHeldPush(op, part)) {
    // Answered after an earlier push to that server was refused and held for a re-send:
    // the answer cannot show that push. Pulled again behind it.
    VLOG(1) << options_.node_id << ": pull answered before an earlier push's re-send; pulling again after it";
    return HoldForRetry(req, std::move(part));
  }
  const size_t keys = part.indices.size();
  BufferPtr b = frame.payload ? std::move(frame.payload) : Buffer::Allocate(0);
  // Values read into dest (the sink) leave only the head here.
  const bool in_dest = frame.tail_bytes > 0;
  Result<core::KvView> view = in_dest
                                   ? core::DecodeKvPairsHead(b->data(), b->size(), frame.tail_bytes, /*answer=*/true)
                                   : core::DecodeKvPairs(b->data(), b->size(), /*expect_values=*/true, /*answer=*/true);
  if (!view.ok()) return op.Fail(view.status());
  if (view->num_keys != keys) {
    return op.Fail(Status(Code::kProtocol, "pull: answer has " + std::to_string(view->num_keys) + " keys, asked " +
                                               std::to_string(keys)));
  }
  const float* p = view->values;
  if (in_dest) {
    uint64_t off = 0;
    uint64_t floats = 0;
    if (!op.SinkRegion(part.indices, &off, &floats)) {
      return op.Fail(Status(Code::kInternal, "pull: an answer was read into dest without a place there"));
    }
    p = op.dest + off;
    if (op.in_dest.empty()) op.in_dest.assign(op.keys.size(), 0);
    in_place_pulls_.fetch_add(1, std::memory_order_relaxed);
  } else if (part.indices.consecutive() && op.takes_stretches()) {
    // Kept whole until the result is copied out (PullRequest::CopyResult).
    op.stretches.push_back(PullRequest::Stretch{part.indices.front(), keys, p, view->num_values, view->lens,
                                                view->row_len});
    if (view->lens != nullptr) learned_.Learn(op.keys, part.indices, view->lens);
    op.answers.push_back(std::move(b));
    op.Acked(keys);
    scratch_->Give(part.indices.Release());
    return;
  }
  op.NeedSrc();
  for (size_t j = 0; j < keys; ++j) {
    const uint32_t len = view->Len(j);
    op.src[part.indices[j]] = p;
    op.src_lens[part.indices[j]] = len;
    if (in_dest) op.in_dest[part.indices[j]] = 1;
    p += len;
  }
  // Rows of one length (row_len) come only in answers of small rows, which are not learned.
  if (view->lens != nullptr) learned_.Learn(op.keys, part.indices, view->lens);
  op.answers.push_back(std::move(b));
  if (op.caller_dest() && op.outstanding == keys && op.Misplaced() &&
      std::accumulate(op.src_lens.begin(), op.src_lens.end(), uint64_t{0}) == op.dest_floats) {
    // The caller's layout put an answer's values where they do not belong: pull all the
    // keys again and copy them this time (rare: only a wrong layout gets here).
    VLOG(1) << options_.node_id << ": PullInto layout did not match the keys; pulling again";
    op.ForgetLearned();
    op.no_sinks = true;
    op.answers.clear();
    op.in_dest.clear();
    op.outstanding = op.keys.size();
    KvPart all;
    all.indices = KeyIndices::Run(0, op.keys.size());
    return Dispatch(req, std::move(all));
  }
  op.Acked(keys);
  scratch_->Give(part.indices.Release());
}

// Keeps a part to send again; held parts go out 50 ms later (or when the scale that holds
// traffic ends).
void WorkerNode::HoldForRetry(const std::shared_ptr<KvRequest>& op, KvPart part) {
  DCHECK(loop()->InLoopThread());
  if (closed()) return op->Fail(Stopped());  // StopRole has answered the held ones already
  held_.emplace_back(op, std::move(part));
  WatchHeld();
}

// Every 50 ms while parts are held, sends them again once no scale holds traffic, and
// meanwhile fails those past their deadline (a scale may last up to the scheduler's
// scale_timeout, longer than a request may wait).
void WorkerNode::WatchHeld() {
  DCHECK(loop()->InLoopThread());
  if (retry_timer_ != 0 || closed()) return;
  retry_timer_ = loop()->AddTimer(std::chrono::milliseconds(50), Duration::zero(), [this] {
    retry_timer_ = 0;
    if (!scale().holding() && loop_metadata().server_num() > 0) return ReleaseHeld();
    FailExpiredHeld();
    if (!held_.empty()) WatchHeld();
  });
}

void WorkerNode::FailExpiredHeld() {
  const TimePoint now = std::chrono::steady_clock::now();
  auto expired = std::stable_partition(held_.begin(), held_.end(),
                                       [this, now](const Held& h) { return now < HeldUntil(*h.first, h.second); });
  std::vector<Held> late(std::make_move_iterator(expired), std::make_move_iterator(held_.end()));
  held_.erase(expired, held_.end());
  for (auto& [op, part] : late) op->Fail(part.lost_since != TimePoint{} ? GaveUp(part) : HeldTooLong());
}

Status WorkerNode::HeldTooLong() const {
  return Status(Code::kTimeout, "key-value request held past its deadline (request_timeout " +
                                    std::to_string(ToMillis(options_.request_timeout)) +
                                    " ms) while the cluster scaled");
}

void WorkerNode::RetryLost(const std::shared_ptr<KvRequest>& op, KvPart part, const Status& why) {
  DCHECK(loop()->InLoopThread());
  const TimePoint now = std::chrono::steady_clock::now();
  if (part.lost_since == TimePoint{}) {
    // The clock starts with the send that failed (a dial may have taken connect_timeout).
    part.lost_since = part.sent_at;
    part.lost_server = ServerName(part.target);
    LOG(WARNING) << options_.node_id << ": " << (op->is_push() ? "push" : "pull") << " to server "
                 << part.lost_server << " failed (" << why << "); sending it again for up to "
                 << ToMillis(options_.recovery_timeout) << " ms";
  }
  part.lost = why;
  RouteAround(part, why);
  if (now >= HeldUntil(*op, part)) {
    const int primary = Primary(part.server);
    const std::string addr = primary < 0 ? std::string() : ServerAddress(primary);
    if (addr.empty() || addr == part.addr) return op->Fail(GaveUp(part));
    // Back at another address (a restart on a new port), or another replica is the
    // range's primary now: its own recovery_timeout there.
    LOG(WARNING) << options_.node_id << ": keys of server " << part.lost_server << " are served at " << addr
                 << " now; sending there for up to " << ToMillis(options_.recovery_timeout) << " ms";
    part.lost_since = now;
  }
  HoldForRetry(op, std::move(part));
}

Status WorkerNode::GaveUp(const KvPart& part) const {
  return GaveUpStatus(part.lost_server, part.lost_since, part.attempts + 1, part.lost, options_.recovery_timeout);
}

// A part whose server was lost is sent again up to recovery_timeout from the loss; others
// wait up to their request's deadline.
TimePoint WorkerNode::HeldUntil(const KvRequest& op, const KvPart& part) const {
  if (part.lost_since == TimePoint{}) return op.deadline;
  return part.lost_since + options_.recovery_timeout;
}

std::string WorkerNode::ServerName(int rank) const {
  std::string id;
  for (const pb::ServersMeta& s : loop_metadata().servers_meta()) {
    if (s.role() == pb::SERVER && s.rank_id() == rank) id = s.node_id();
  }
  return (id.empty() ? "rank " + std::to_string(rank) : id) + " (" + ServerAddress(rank) + ")";
}

bool WorkerNode::AfterHeldPush(const KvRequest& op, const KvPart& part) const {
  DCHECK(loop()->InLoopThread());
  // Same server: same address, or the same rank of the same view (restarted elsewhere).
  for (const auto& [held_op, held_part] : held_) {
    if (held_op->is_push() && held_op->seq < op.seq &&
        (held_part.addr == part.addr ||
         (held_part.server == part.server && held_part.for_servers == part.for_servers))) {
      return true;
    }
  }
  return false;
}

void WorkerNode::ReleaseHeld() {
  DCHECK(loop()->InLoopThread());
  std::vector<Held> held = std::move(held_);
  held_.clear();
  // In issue order: parts are held in the order they were refused (a pull held while the
  // cluster scales, then an earlier push refused as its keys moved), and go out on one
  // link per server, in order.
  std::stable_sort(held.begin(), held.end(), [](const Held& a, const Held& b) { return a.first->seq < b.first->seq; });
  const TimePoint now = std::chrono::steady_clock::now();
  for (auto& [op, part] : held) {
    if (now >= HeldUntil(*op, part)) {
      op->Fail(part.lost_since != TimePoint{} ? GaveUp(part) : HeldTooLong());
      continue;
    }
    Dispatch(op, std::move(part));
  }
}

}  // namespace pscore::node
