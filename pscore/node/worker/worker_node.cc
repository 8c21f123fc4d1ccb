#include "pscore/node/worker/worker_node.h"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>

#include "pscore/core/key_range.h"
#include "pscore/node/common/metrics_text.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/worker/pull_request.h"
#include "pscore/node/worker/push_parts.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

namespace {

// A number that differs between two starts of a worker process (with the same node id).
uint64_t FreshPushIncarnation() {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) ^ rd();
  const uint64_t t = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return (r ^ t) | 1;  // never 0
}

}  // namespace

WorkerNode::WorkerNode(NodeOptions options, comm::EventLoop* loop)
    : Node([&] {
        options.role = pb::WORKER;
        return options;
      }(), loop),
      direct_(options_, copied_counter(), [this] { return rank(); }),
      push_incarnation_(FreshPushIncarnation()) {}

WorkerNode::~WorkerNode() { Stop(); }

void WorkerNode::AppendRoleMetrics(MetricsText* m) const {
  m->Family("pscore_worker_direct_pulls_total", "counter", "PullSync calls answered over a direct link.");
  m->Sample("pscore_worker_direct_pulls_total", "", direct_pulls());
  m->Family("pscore_worker_in_place_pulls_total", "counter",
            "Pull answers read from the socket straight into the caller's buffer or result.");
  m->Sample("pscore_worker_in_place_pulls_total", "", in_place_pulls());
  m->Family("pscore_worker_relayed_parts_total", "counter",
            "Push and pull parts sent through another server because their own could not be reached from here.");
  m->Sample("pscore_worker_relayed_parts_total", "", relayed_parts());
}

void WorkerNode::SetPushIds(uint64_t incarnation, uint64_t next_seq) {
  CHECK(incarnation != 0 && next_seq != 0) << "push ids start at incarnation 1, seq 1";
  loop()->Run([this, incarnation, next_seq] {
    push_incarnation_ = incarnation;
    push_seq_ = next_seq - 1;
  });
}

void WorkerNode::Issue(int rank, pb::MessageMeta meta, Payload payload, comm::AnswerSink sink,
                       comm::ResponseCallback cb) {
  if (loop()->OnRunningLoop()) return IssueOnLoop(rank, std::move(meta), std::move(payload), sink, std::move(cb));
  // From another thread: the callback stays here too, to be answered should the loop
  // refuse the closure (stopped).
  auto answer = std::make_shared<comm::ResponseCallback>(std::move(cb));
  bool queued = loop()->Post([this, rank, meta = std::move(meta), payload = std::move(payload), sink,
                              answer]() mutable {
    IssueOnLoop(rank, std::move(meta), std::move(payload), sink, std::move(*answer));
  });
  if (!queued) (*answer)(Stopped());
}

void WorkerNode::IssueOnLoop(int rank, pb::MessageMeta meta, Payload payload, comm::AnswerSink sink,
                             comm::ResponseCallback cb, Duration lost_after) {
  DCHECK(loop()->InLoopThread());
  WithServerConn(
      rank,
      [this, meta = std::move(meta), payload = std::move(payload), sink, cb = std::move(cb),
       lost_after](Result<ConnId> c) mutable {
        if (!c.ok() && lost_after != Duration::zero() && c.status().code() == Code::kTimeout) {
          return cb(Status(Code::kUnavailable, "cannot reach the server: " + c.status().message()));
        }
        if (!c.ok()) return cb(c.status());
        meta.set_rank_id(loop_rank());
        messenger().Call(*c, std::move(meta), std::move(payload), options_.request_timeout, std::move(cb), sink);
      },
      lost_after);
}

void WorkerNode::IssuePart(int rank, pb::MessageMeta meta, Payload payload, comm::AnswerSink sink,
                           comm::ResponseCallback cb) {
  IssueOnLoop(rank, std::move(meta), std::move(payload), sink, std::move(cb), DataDialTimeout());
}

Duration WorkerNode::DataDialTimeout() const {
  return std::min<Duration>(options_.connect_timeout, 2 * options_.heartbeat_timeout);
}

void WorkerNode::SendAsync(int rank, int user_cmd, const std::string& handler, Payload payload,
                           ReplyCallback cb) {
  pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::WORKER, -1);
  meta.set_user_cmd(user_cmd);
  meta.set_handler(handler);
  Issue(rank, std::move(meta), std::move(payload), {}, [cb = std::move(cb)](Result<Frame> r) {
    if (!r.ok()) return cb(r.status());
    cb(r->payload ? r->payload : Buffer::Allocate(0));
  });
}

std::future<Result<BufferPtr>> WorkerNode::Send(int rank, int user_cmd, BufferPtr payload) {
  auto p = std::make_shared<std::promise<Result<BufferPtr>>>();
  SendAsync(rank, user_cmd, "", std::move(payload), [p](Result<BufferPtr> r) { p->set_value(std::move(r)); });
  return p->get_future();
}

std::future<Result<BufferPtr>> WorkerNode::Call(int rank, const std::string& handler, BufferPtr payload) {
  auto p = std::make_shared<std::promise<Result<BufferPtr>>>();
  SendAsync(rank, 0, handler, std::move(payload), [p](Result<BufferPtr> r) { p->set_value(std::move(r)); });
  return p->get_future();
}

namespace {

// Collects n answers; completes once, with all of them or the first error.
template <typename T>
struct Gather {
  explicit Gather(size_t n) : results(n), left(n) {}
  std::vector<T> results;
  std::atomic<size_t> left;
  std::atomic<bool> failed{false};
  std::promise<Result<std::vector<T>>> promise;
  void Put(size_t i, Result<T> r) {
    if (!r.ok()) {
      if (!failed.exchange(true)) promise.set_value(r.status());
    } else {
      results[i] = std::move(*r);
    }
    if (--left == 0 && !failed.load()) promise.set_value(std::move(results));
  }
};

}  // namespace

std::future<Result<std::vector<BufferPtr>>> WorkerNode::Broadcast(int user_cmd, const std::string& handler,
                                                                   BufferPtr payload) {
  int n = server_count();
  auto g = std::make_shared<Gather<BufferPtr>>(n);
  auto fut = g->promise.get_future();
  if (n == 0) {
    g->promise.set_value(Status(Code::kUnavailable, "no servers in the metadata yet"));
    return fut;
  }
  for (int r = 0; r < n; ++r) {
    SendAsync(r, user_cmd, handler, payload, [g, r](Result<BufferPtr> res) { g->Put(r, std::move(res)); });
  }
  return fut;
}

std::future<Status> WorkerNode::Push(const std::vector<uint64_t>& keys, const std::vector<float>& values,
                                     const std::vector<uint32_t>& lens) {
  return StartPush(keys, values.data(), values.size(), lens, nullptr);
}

std::future<Status> WorkerNode::Push(const std::vector<uint64_t>& keys, std::vector<float>&& values,
                                     const std::vector<uint32_t>& lens) {
  return ZPush(keys, std::make_shared<const std::vector<float>>(std::move(values)), lens);
}

std::future<Status> WorkerNode::ZPush(const std::vector<uint64_t>& keys,
                                      std::shared_ptr<const std::vector<float>> values,
                                      const std::vector<uint32_t>& lens) {
  if (!values) values = std::make_shared<const std::vector<float>>();
  const std::vector<float>& v = *values;
  return StartPush(keys, v.data(), v.size(), lens, std::move(values));
}

std::future<Status> WorkerNode::ZPush(const std::vector<uint64_t>& keys, const float* values, size_t num_values,
                                      std::shared_ptr<const void> owner, const std::vector<uint32_t>& lens) {
  return StartPush(keys, values, num_values, lens, std::move(owner));
}

// Encoded on the caller's thread, straight from its arrays (push_parts.h); `shared` stays
// alive to the end: it may own `values`.
std::future<Status> WorkerNode::StartPush(const std::vector<uint64_t>& keys, const float* values,
                                          size_t num_values, const std::vector<uint32_t>& lens_in,
                                          std::shared_ptr<const void> shared) {
  auto op = std::make_shared<PushRequest>(counters());
  std::future<Status> fut = op->future();
  // No lens given: every key holds as many floats (rows of one length), which must divide.
  const uint64_t row_len = keys.empty() ? 0 : num_values / keys.size();
  const bool match = lens_in.empty() ? row_len <= UINT32_MAX && row_len * keys.size() == num_values
                                     : lens_in.size() == keys.size() &&
                                           std::accumulate(lens_in.begin(), lens_in.end(), uint64_t{0}) == num_values;
  if (!match) {
    op->Fail(Status(Code::kInvalidArgument, "push: " + std::to_string(keys.size()) + " keys, " +
                                                std::to_string(lens_in.size()) + " lens and " +
                                                std::to_string(num_values) + " values do not match"));
    return fut;
  }
  op->outstanding = keys.size();
  op->deadline = std::chrono::steady_clock::now() + options_.request_timeout;
  if (keys.empty()) {
    op->Acked(0);
    return fut;
  }
  std::vector<KvPart> parts;
  const PushInput in{keys.data(), keys.size(), lens_in.empty() ? nullptr : lens_in.data(),
                     static_cast<uint32_t>(row_len), values, num_values, shared};
  const Status split = SplitPush(in, server_count(), options_.push_slice_keys, *op, &parts);
  if (!split.ok()) {
    op->Fail(split);
    return fut;
  }
  std::shared_ptr<KvRequest> req = std::move(op);
  bool queued = loop()->Run([this, req, parts = std::move(parts)]() mutable {
    req->seq = ++op_seq_;
    for (KvPart& p : parts) Dispatch(req, std::move(p));
  });
  if (!queued) req->Fail(Stopped());  // never reached the loop: no other thread has it
  return fut;
}

std::future<Result<PullResult>> WorkerNode::Pull(const std::vector<uint64_t>& keys) {
  auto op = std::make_shared<PullCopyRequest>(counters());
  auto fut = op->future();
  op->Begin(keys, scratch_);
  // Keys whose sizes earlier answers written from the store told: the result is allocated
  // before sending and the answers are read into it. No more than the answers can bring
  // (one message per server): a larger request fails as it would otherwise, not by
  // allocating first.
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  if (learned_.Layout(keys, &offsets, &total)) {
    const uint64_t servers = std::min<uint64_t>(direct_.ranges(), keys.size());
    if (total * sizeof(float) <= options_.max_message_bytes * servers) {
      op->AllocateResult(total, std::move(offsets), &learned_);
    }
  }
  StartPull(std::move(op));
  return fut;
}

std::future<Result<PullView>> WorkerNode::ZPull(const std::vector<uint64_t>& keys) {
  auto op = std::make_shared<PullViewRequest>(counters());
  auto fut = op->future();
  op->Begin(keys, scratch_);
  StartPull(std::move(op));
  return fut;
}

std::future<Status> WorkerNode::PullInto(const std::vector<uint64_t>& keys, float* dest, size_t dest_floats,
                                         std::vector<uint32_t>* lens) {
  auto op = std::make_shared<PullIntoRequest>(counters());
  auto fut = op->future();
  op->Begin(keys, scratch_);
  const Status st = op->SetDest(dest, dest_floats, lens, &learned_);
  if (!st.ok()) {
    op->Fail(st);
    return fut;
  }
  StartPull(std::move(op));
  return fut;
}

void WorkerNode::StartPull(std::shared_ptr<PullRequest> op) {
  op->deadline = std::chrono::steady_clock::now() + options_.request_timeout;
  if (op->keys.empty()) {
    op->Acked(0);
    return;
  }
  std::shared_ptr<KvRequest> req = std::move(op);
  bool queued = loop()->Run([this, req] {
    req->seq = ++op_seq_;
    KvPart all;
    all.indices = KeyIndices::Run(0, static_cast<const PullRequest&>(*req).keys.size());
    Dispatch(req, std::move(all));
  });
  if (!queued) req->Fail(Stopped());
}

Result<PullResult> WorkerNode::PullSync(const std::vector<uint64_t>& keys) {
  if (loop()->OnRunningLoop()) {
    return Status(Code::kFailedPrecondition, "PullSync blocks: call it from a thread other than the node's loop");
  }
  // Ordering: an earlier Push of this worker still in flight on its loop link could be
  // overtaken on another connection, so the direct way is only for a quiet worker.
  if (kv_in_flight_->load(std::memory_order_acquire) == 0) {
    std::optional<Result<PullResult>> direct = direct_.TryPull(keys);
    if (direct.has_value()) return std::move(*direct);
  }
  std::future<Result<PullResult>> f = Pull(keys);
  // Pull ends by itself within the request timeout, or the recovery timeout of a lost
  // server (held parts fail then); the margin only guards against a stopped loop.
  if (f.wait_for(options_.request_timeout + options_.recovery_timeout + std::chrono::seconds(5)) !=
      std::future_status::ready) {
    return Status(Code::kTimeout, "pull: no answer within the request timeout");
  }
  return f.get();
}

// ---- Cluster changes (loop thread) ----

// Key-value traffic is held while scale().holding(): the cluster scales.
void WorkerNode::OnStateApplied(pb::ClusterState) {
  DCHECK(loop()->InLoopThread());
  // The live replicas first: Node::ApplyMetadata applies the state before
  // OnMetadataApplied, and parts released under the previous metadata's live set would go
  // to a server it has just marked down (a rolled-back scale-out whose server timed out),
  // over a fresh link that nothing closes again: they would wait out request_timeout.
  // Node calls OnHoldReleased after this.
  UpdateRoute();
}

void WorkerNode::OnHoldReleased() {
  DCHECK(loop()->InLoopThread());
  ReleaseHeld();
}

void WorkerNode::OnMetadataApplied() {
  DCHECK(loop()->InLoopThread());
  if (!scale().holding() && !held_.empty()) ReleaseHeld();
  UpdateRoute();
}

void WorkerNode::OnScaleOutReady(const pb::SendMetadataMessage&, std::function<void()> done) { done(); }

void WorkerNode::OnScaleInStart(const pb::ScaleInMessage&, std::function<void()> done) {
  DCHECK(loop()->InLoopThread());
  UpdateRoute();
  done();
}

void WorkerNode::OnClusterEvent(const pb::ClusterEventMessage& ev) {
  DCHECK(loop()->InLoopThread());
  // A silent server (stopped, cut off) never closes its link, so parts in flight on it
  // would wait out request_timeout. Closed now, they fail kUnavailable and go through
  // RetryLost: to the range's new primary once the metadata marks the server down
  // (replicas >= 2, Node::ApplyMetadata closes the link then too), else to the same
  // server, whose answer is waited for until recovery_timeout from the first send.
  if (ev.role() != pb::SERVER) return;
  const std::string addr = ServerAddress(ev.rank_id());
  if (addr.empty()) return;
  // Not a partial partition then: the scheduler lost it too (worker_relay.cc).
  if (ev.kind() == pb::ClusterEventMessage::NODE_RECOVERED || ev.kind() == pb::ClusterEventMessage::NODE_RESTARTED) {
    timed_out_servers_.erase(addr);
  }
  if (ev.kind() != pb::ClusterEventMessage::NODE_TIMED_OUT) return;
  timed_out_servers_.insert(addr);
  CloseServerLink(addr, Status(Code::kUnavailable, "server " + ev.node_id() + " (" + addr +
                                                       ") timed out at the scheduler (no heartbeat)"));
  // PullSync's direct calls to it as well; new ones take the loop's way until the next
  // metadata or state sets the route again.
  direct_.ServerTimedOut(addr);
}

void WorkerNode::StopRole() {
  DCHECK(loop()->InLoopThread());
  // Parts held for a scale to end are answered now: nothing will send them any more.
  if (retry_timer_ != 0) loop()->CancelTimer(retry_timer_);
  retry_timer_ = 0;
  if (relay_timer_ != 0) loop()->CancelTimer(relay_timer_);
  relay_timer_ = 0;
  auto held = std::move(held_);
  held_.clear();
  for (auto& [op, part] : held) op->Fail(Stopped());
  direct_.Stop();
}

int WorkerNode::Primary(int range) const {
  DCHECK(loop()->InLoopThread());
  if (replicas_ <= 1) return range;
  return core::PrimaryOf(range, static_cast<int>(live_.size()), replicas_, live_);
}

void WorkerNode::UpdateRoute() {
  DCHECK(loop()->InLoopThread());
  // Where each range is read and written: its first live replica (docs/reliability.md).
  const pb::SendMetadataMessage& md = loop_metadata();
  const int n = std::max(0, md.server_num());
  replicas_ = std::max(1, md.replicas());
  live_.assign(static_cast<size_t>(n), 1);
  for (const pb::ServersMeta& s : md.servers_meta()) {
    if (s.role() == pb::SERVER && s.rank_id() >= 0 && s.rank_id() < n) live_[s.rank_id()] = s.is_alive() ? 1 : 0;
  }
  for (auto it = timed_out_servers_.begin(); it != timed_out_servers_.end();) {
    it = IsServerAddress(*it) ? std::next(it) : timed_out_servers_.erase(it);
  }
  // Not while a server is reached through another (worker_relay.cc): a direct pull must
  // not overtake a relayed push, and would not reach that server anyway.
  bool usable = !scale().holding() && cluster_state() == pb::CLUSTER_READY && relays_.empty();
  // server_num comes from the wire: walk only the ranks the metadata gave an address
  // (a count with no addresses behind it must not size anything here).
  std::vector<std::string> addrs;
  for (int range = 0; range < n; ++range) {
    const int primary = Primary(range);
    std::string addr = primary < 0 ? std::string() : ServerAddress(primary);
    if (addr.empty()) {
      usable = false;
      break;
    }
    addrs.push_back(std::move(addr));
  }
  direct_.SetRoute(usable, std::move(addrs));
}

}  // namespace pscore::node
