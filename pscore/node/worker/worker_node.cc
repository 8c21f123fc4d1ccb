#include "pscore/node/worker/worker_node.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <random>

#include "pscore/core/key_range.h"
#include "pscore/core/kv_codec.h"
#include "pscore/node/common/metrics_text.h"
#include "pscore/node/common/wire.h"

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

// Why a part whose server was lost failed: the server, how often and how long it was tried.
Status GaveUpStatus(const std::string& server, TimePoint lost_since, int sends, const Status& last,
                    Duration recovery_timeout) {
  const auto waited = ToMillis(std::chrono::steady_clock::now() - lost_since);
  return Status(Code::kUnavailable, "server " + server + " lost: sent " + std::to_string(sends) + " times over " +
                                        std::to_string(waited) + " ms (recovery_timeout " +
                                        std::to_string(ToMillis(recovery_timeout)) + " ms); last error: " +
                                        last.ToString());
}

}  // namespace

WorkerNode::WorkerNode(NodeOptions options, comm::EventLoop* loop)
    : Node([&] {
        options.role = pb::WORKER;
        return options;
      }(), loop),
      push_incarnation_(FreshPushIncarnation()) {}

WorkerNode::~WorkerNode() { Stop(); }

void WorkerNode::AppendRoleMetrics(MetricsText* m) const {
  m->Family("pscore_worker_direct_pulls_total", "counter", "PullSync calls answered over a direct link.");
  m->Sample("pscore_worker_direct_pulls_total", "", direct_pulls());
  m->Family("pscore_worker_in_place_pulls_total", "counter",
            "Pull answers read from the socket straight into the caller's buffer or result.");
  m->Sample("pscore_worker_in_place_pulls_total", "", in_place_pulls());
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
                             comm::ResponseCallback cb) {
  WithServerConn(rank, [this, meta = std::move(meta), payload = std::move(payload), sink,
                        cb = std::move(cb)](Result<ConnId> c) mutable {
    if (!c.ok()) return cb(c.status());
    meta.set_rank_id(Node::rank());
    messenger().Call(*c, std::move(meta), std::move(payload), options_.request_timeout, std::move(cb), sink);
  });
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

namespace {

// Room for `floats` floats in v, not yet written. A large result is fresh memory on
// every call (glibc maps it anew past 32 MiB), so it is asked for in huge pages before
// its first write (pscore/core/buffer.h).
void ReserveResult(std::vector<float>& v, size_t floats) {
  v.reserve(floats);
  AdviseHugePages(v.data(), floats * sizeof(float));
}

}  // namespace

// One Push or Pull across servers. Loop thread only after creation.
struct WorkerNode::KvOp {
  bool push = true;
  std::vector<uint64_t> keys;  // pull: the requested keys
  // Pull answers stay alive until the result is assembled with one copy.
  std::vector<BufferPtr> answers;
  std::vector<const float*> src;  // per requested key: its floats inside an answer
  std::vector<uint32_t> src_lens;
  size_t outstanding = 0;  // keys not yet acknowledged
  TimePoint deadline;
  bool finished = false;
  // PullInto: the caller's destination (dest_floats floats; lens optional).
  float* dest = nullptr;
  size_t dest_floats = 0;
  std::vector<uint32_t>* dest_lens = nullptr;
  bool view = false;  // ZPull: the answer is a view of the received buffers
  // PullInto: answers may be read from the socket straight into dest (an AnswerSink per
  // request) where their place is known: all the keys (the whole of dest), or a run of
  // consecutive keys when the caller gave the layout (its lens): expect_off[i] is key i's
  // expected offset in dest (empty: no layout). in_dest[i]: key i's floats were read into
  // dest at src[i]. no_sinks: pulled again after a wrong layout, answers are copied.
  std::vector<uint64_t> expect_off;
  std::vector<char> in_dest;
  bool no_sinks = false;
  // Requests sent and not yet ended (loop thread). While one may still have its answer
  // read into dest, a failed PullInto keeps its error here and is not ready: the caller
  // owns dest again the moment the future is.
  size_t parts_sent = 0;
  std::optional<Status> failure;
  uint64_t seq = 0;  // issue order on the loop (WorkerNode::op_seq_)
  std::promise<Status> push_done;  // also PullInto's
  std::promise<Result<PullResult>> pull_done;
  std::promise<Result<PullView>> view_done;
  // The worker's count of unanswered key-value calls: this op counts in it until it
  // finishes (down before the caller's future is ready, so PullSync after Push().get()
  // sees zero).
  std::shared_ptr<std::atomic<int>> in_flight;

  // The worker's count of payload bytes copied (Node::payload_bytes_copied).
  std::shared_ptr<std::atomic<uint64_t>> copied;

  void CountIn(const std::shared_ptr<std::atomic<int>>& counter, const std::shared_ptr<std::atomic<uint64_t>>& copies) {
    in_flight = counter;
    copied = copies;
    in_flight->fetch_add(1, std::memory_order_acq_rel);
  }
  void CountCopied(uint64_t bytes) { copied->fetch_add(bytes, std::memory_order_relaxed); }
  void CountOut() {
    if (in_flight) in_flight->fetch_sub(1, std::memory_order_acq_rel);
    in_flight.reset();
  }

  // Pull with its result allocated up front (the keys' sizes were known): dest is
  // result.data(), and the values are read into it in place like PullInto's.
  std::vector<float> result;
  bool into_result = false;
  // Set when expect_off came from the learned sizes: forgets those found wrong (loop thread).
  WorkerNode* learner = nullptr;

  bool into() const { return dest != nullptr; }
  // The span of dest (float offset and count) an answer to the keys `indices` (increasing)
  // may be read into, or false.
  bool SinkRegion(const std::vector<size_t>& indices, uint64_t* off, uint64_t* floats) const {
    if (!into() || no_sinks || dest_floats == 0 || indices.empty()) return false;
    if (indices.size() == keys.size()) {
      *off = 0;
      *floats = dest_floats;
      return true;
    }
    const size_t a = indices.front();
    const size_t b = indices.back() + 1;
    if (expect_off.empty() || b - a != indices.size()) return false;  // no layout, or not consecutive
    *off = expect_off[a];
    *floats = (b < keys.size() ? expect_off[b] : dest_floats) - *off;
    return *floats > 0;
  }
  // True when some values were read into dest where the answers' lens do not put them
  // (the caller's layout was wrong before them while the totals still matched).
  bool Misplaced() const {
    if (in_dest.empty()) return false;
    uint64_t at = 0;
    for (size_t i = 0; i < src.size(); ++i) {
      if (in_dest[i] && static_cast<uint64_t>(src[i] - dest) != at) return true;
      at += src_lens[i];
    }
    return false;
  }
  void Fail(const Status& st) {
    if (finished) return;
    finished = true;
    answers.clear();
    if (into() && !into_result && parts_sent > 0) {
      failure = st;  // settled by PartEnded once no answer can write into dest
      return;
    }
    CountOut();
    if (push || (into() && !into_result)) {
      push_done.set_value(st);
    } else if (view) {
      view_done.set_value(st);
    } else {
      pull_done.set_value(st);
    }
  }
  // A request of this op ended (answered, failed or expired; its answer no longer writes
  // anywhere). Returns false when the op is finished and the answer is not wanted.
  bool PartEnded() {
    --parts_sent;
    if (!finished) return true;
    if (failure && parts_sent == 0) {
      CountOut();
      push_done.set_value(*failure);
      failure.reset();
    }
    return false;
  }
  void Acked(size_t n) {
    outstanding -= n;
    if (outstanding != 0 || finished) return;
    finished = true;
    CountOut();
    if (push) {
      push_done.set_value(Status::Ok());
      return;
    }
    if (into_result) return FinishResult();
    if (into()) {
      const size_t total = std::accumulate(src_lens.begin(), src_lens.end(), size_t{0});
      if (total != dest_floats) {
        if (learner != nullptr) learner->ForgetLens(*this);
        answers.clear();
        push_done.set_value(Status(Code::kInvalidArgument, "pull: the keys hold " + std::to_string(total) +
                                                               " floats, the destination " +
                                                               std::to_string(dest_floats)));
        return;
      }
      CopyRestIntoDest();
      if (dest_lens != nullptr) *dest_lens = src_lens;
      answers.clear();
      push_done.set_value(Status::Ok());
      return;
    }
    if (view) {
      PullView out;
      out.lens = std::move(src_lens);
      out.values = std::move(src);
      out.owners = std::move(answers);
      view_done.set_value(std::move(out));
      return;
    }
    pull_done.set_value(CopyResult());
  }
  // Copies the values not read into dest to their place there (those that were are
  // already in place: checked by Misplaced; the total matches dest_floats).
  void CopyRestIntoDest() {
    float* out = dest;
    for (size_t i = 0; i < src.size(); ++i) {
      if (in_dest.empty() || !in_dest[i]) {
        std::memcpy(out, src[i], src_lens[i] * sizeof(float));
        CountCopied(src_lens[i] * sizeof(float));
      }
      out += src_lens[i];
    }
  }
  // Pull's result, every value copied once out of where it arrived (reserve + insert: the
  // values are written once; resize would zero them first).
  PullResult CopyResult() {
    PullResult out;
    out.lens = src_lens;
    ReserveResult(out.values, std::accumulate(src_lens.begin(), src_lens.end(), size_t{0}));
    // Keys whose values lie back to back in one answer are copied as one stretch.
    for (size_t i = 0; i < src.size();) {
      const float* from = src[i];
      const float* to = src[i] + src_lens[i];
      for (++i; i < src.size() && src[i] == to; ++i) to += src_lens[i];
      out.values.insert(out.values.end(), from, to);
    }
    CountCopied(out.values.size() * sizeof(float));
    answers.clear();
    return out;
  }
  // Pull into its own result: the answers read into it are in place; those that were not
  // (keys of a server not consecutive, a small answer) are copied to their place. Should
  // the sizes have changed since they were learned, the result is copied anew instead.
  void FinishResult() {
    const size_t total = std::accumulate(src_lens.begin(), src_lens.end(), size_t{0});
    if (total != dest_floats || Misplaced()) {
      learner->ForgetLens(*this);
      return pull_done.set_value(CopyResult());
    }
    CopyRestIntoDest();
    answers.clear();
    PullResult r;
    r.lens = std::move(src_lens);
    r.values = std::move(result);
    pull_done.set_value(std::move(r));
  }
};

// What one request carries: a push payload already encoded for `for_servers` servers
// (re-split from its own bytes if the server count changed), or pull key indices.
struct WorkerNode::KvPart {
  int server = -1;              // the key range (server rank of the partition) of its keys
  int target = -1;              // the server rank it was last sent to: the range's primary
  int for_servers = 0;
  Payload payload;              // push
  size_t num_keys = 0;          // push
  std::vector<size_t> indices;  // pull
  std::string addr;             // the server it was sent to
  Status lost;                  // set when that server's link died before the answer
  uint64_t push_seq = 0;        // push: its id's seq once sent (kept when sent again)
  uint64_t origin_seq = 0;      // push: the sent part it was split from (PushId.origin_seq)
  TimePoint sent_at{};          // its last send
  TimePoint lost_since{};       // the send that first met its server lost (retried until recovery_timeout)
  int attempts = 0;             // sends since then
  std::string lost_server;      // "node id (address)" of the server lost

  // A part made of some of this one's keys for a new split: no payload or id of its own
  // yet, but the same recovery clock (a loss is not forgotten by re-splitting).
  KvPart Successor() const {
    KvPart p;
    // A part split again after a scale: if this one was sent, a server may have applied it.
    p.origin_seq = push_seq != 0 ? push_seq : origin_seq;
    p.lost_since = lost_since;
    p.attempts = attempts;
    p.lost_server = lost_server;
    p.lost = lost;
    return p;
  }
};

namespace {

// Groups indices [0, n) of keys by owner among `servers`.
std::vector<std::vector<size_t>> ByOwner(const uint64_t* keys, size_t n, int servers) {
  std::vector<std::vector<size_t>> out(servers);
  if (servers == 1) {
    out[0].resize(n);
    std::iota(out[0].begin(), out[0].end(), size_t{0});
    return out;
  }
  // Counted first, so each group is allocated once at its size (millions of keys per call).
  std::vector<size_t> counts(servers);
  for (size_t i = 0; i < n; ++i) ++counts[core::ServerForKey(keys[i], servers)];
  for (int s = 0; s < servers; ++s) out[s].reserve(counts[s]);
  for (size_t i = 0; i < n; ++i) out[core::ServerForKey(keys[i], servers)].push_back(i);
  return out;
}

// A copied push part (EncodeKvPairsGather) of large values sent as head and tail, as
// ZPush's are: a server then folds the values into the store as they arrive instead of
// reading the whole frame into memory first (ServerNode::OnRequestStream).
Payload PushPayload(BufferPtr encoded, uint64_t floats, size_t num_keys) {
  if (floats * sizeof(float) < WorkerNode::kStreamedPushBytes * num_keys) return encoded;
  return core::SplitValuesTail(std::move(encoded), floats * sizeof(float));
}

}  // namespace

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

std::future<Status> WorkerNode::StartPush(const std::vector<uint64_t>& keys, const float* values,
                                          size_t num_values, const std::vector<uint32_t>& lens_in,
                                          std::shared_ptr<const void> shared) {
  auto op = std::make_shared<KvOp>();
  op->CountIn(kv_in_flight_, copied_counter());
  auto fut = op->push_done.get_future();
  std::vector<uint32_t> even_lens;  // no lens given: every key has the same length
  if (lens_in.empty() && !keys.empty()) even_lens.assign(keys.size(), static_cast<uint32_t>(num_values / keys.size()));
  const std::vector<uint32_t>& lens = lens_in.empty() ? even_lens : lens_in;
  if (lens.size() != keys.size() || std::accumulate(lens.begin(), lens.end(), uint64_t{0}) != num_values) {
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
  // Encode on the caller's thread, straight from its arrays: the one copy of the values,
  // or none when they are shared (ZPush) and large enough for writing them from where they
  // are to beat copying them (core::kZeroCopyBytes per key on average).
  // (`shared` itself stays alive to the end: it may own `values`.)
  const bool zero_copy = shared && num_values * sizeof(float) >= core::kZeroCopyBytes * keys.size();
  int n = std::max(1, server_count());
  std::vector<KvPart> parts;
  if (n == 1 && !zero_copy) {
    // One server takes every key: the caller's arrays are copied into the request as they
    // are (no index of the keys, no gathering).
    KvPart part;
    part.server = 0;
    part.for_servers = server_count() > 0 ? n : 0;
    part.num_keys = keys.size();
    part.payload = PushPayload(core::EncodeKvPairs(keys.data(), keys.size(), lens.data(), values, num_values),
                               num_values, keys.size());
    CountCopied(num_values * sizeof(float));
    parts.push_back(std::move(part));
    return DispatchPush(op, std::move(parts), std::move(fut));
  }
  std::vector<uint64_t> offsets(keys.size());
  uint64_t off = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    offsets[i] = off;
    off += lens[i];
  }
  std::vector<std::vector<size_t>> groups = ByOwner(keys.data(), keys.size(), n);
  for (int s = 0; s < n; ++s) {
    if (groups[s].empty()) continue;
    KvPart part;
    part.server = s;
    part.for_servers = server_count() > 0 ? n : 0;  // 0: split again once servers are known
    part.num_keys = groups[s].size();
    if (zero_copy) {
      std::vector<uint64_t> k;
      std::vector<uint32_t> l;
      std::vector<Slice> tail;
      for (size_t i : groups[s]) {
        k.push_back(keys[i]);
        l.push_back(lens[i]);
        tail.push_back(Slice{shared, reinterpret_cast<const char*>(values + offsets[i]), lens[i] * sizeof(float)});
      }
      Result<Payload> p = core::EncodeKvPairsShared(k.data(), k.size(), l.data(), std::move(tail));
      if (!p.ok()) {
        op->Fail(p.status());
        return fut;
      }
      part.payload = std::move(*p);
    } else {
      uint64_t floats = 0;
      for (size_t i : groups[s]) floats += lens[i];
      part.payload = PushPayload(core::EncodeKvPairsGather(keys.data(), lens.data(), values, offsets.data(),
                                                           groups[s].data(), groups[s].size()),
                                 floats, groups[s].size());
      CountCopied(floats * sizeof(float));
    }
    parts.push_back(std::move(part));
  }
  return DispatchPush(op, std::move(parts), std::move(fut));
}

std::future<Status> WorkerNode::DispatchPush(const std::shared_ptr<KvOp>& op, std::vector<KvPart> parts,
                                             std::future<Status> fut) {
  bool queued = loop()->Run([this, op, parts = std::move(parts)]() mutable {
    op->seq = ++op_seq_;
    for (KvPart& p : parts) Dispatch(op, std::move(p));
  });
  if (!queued) op->Fail(Stopped());  // never reached the loop: no other thread has op
  return fut;
}

std::future<Result<PullResult>> WorkerNode::Pull(const std::vector<uint64_t>& keys) {
  auto op = std::make_shared<KvOp>();
  op->CountIn(kv_in_flight_, copied_counter());
  auto fut = op->pull_done.get_future();
  AllocateResult(*op, keys);
  StartPull(op, keys);
  return fut;
}

// A pull of keys whose sizes earlier answers written from the store told: the result is
// allocated here (zero-filled: std::vector), on the calling thread, and each answer is read
// from the socket straight into its place in it (no copy on the worker, none on its loop
// thread). Otherwise the result is made when the answers are in (CopyResult).
void WorkerNode::AllocateResult(KvOp& op, const std::vector<uint64_t>& keys) {
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  if (!LearnedLayout(keys, &offsets, &total)) return;
  // No more than the answers can bring (one message per server): a larger request
  // fails as it did before, not by allocating first.
  uint64_t servers = 0;
  {
    std::lock_guard<std::mutex> lock(direct_mu_);
    servers = std::min<uint64_t>(route_.addrs.size(), keys.size());
  }
  if (total * sizeof(float) > options_.max_message_bytes * servers) return;
  ReserveResult(op.result, total);
  op.result.resize(total);
  op.into_result = true;
  op.learner = this;
  op.dest = op.result.data();
  op.dest_floats = total;
  op.expect_off = std::move(offsets);
}

// Every key's offset in a result of keys back to back, from the learned sizes, and the
// total; false when a key's size is not known.
bool WorkerNode::LearnedLayout(const std::vector<uint64_t>& keys, std::vector<uint64_t>* offsets, uint64_t* total) {
  if (keys.empty()) return false;
  offsets->resize(keys.size());
  *total = 0;
  std::lock_guard<std::mutex> lock(learned_mu_);
  if (learned_lens_.empty()) return false;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = learned_lens_.find(keys[i]);
    if (it == learned_lens_.end()) return false;
    (*offsets)[i] = *total;
    *total += it->second;
  }
  return true;
}

// Loop thread: remembers the sizes of the keys of an answer written from the store (at
// least 64 KiB per key on average, so a lookup per key is nothing beside the values).
void WorkerNode::LearnLens(const KvOp& op, const std::vector<size_t>& indices, const uint32_t* lens) {
  const size_t n = indices.size();
  if (n == 0 || std::accumulate(lens, lens + n, uint64_t{0}) * sizeof(float) < core::kZeroCopyBytes * n) return;
  std::lock_guard<std::mutex> lock(learned_mu_);
  if (learned_lens_.size() + n > kLearnedMax) learned_lens_.clear();  // a bound, rarely reached
  for (size_t j = 0; j < n; ++j) learned_lens_[op.keys[indices[j]]] = lens[j];
}

// Loop thread: op's result was allocated from sizes some of which were wrong. A key
// whose answer did not teach its new size (a small one) has the old one forgotten.
void WorkerNode::ForgetLens(const KvOp& op) {
  std::lock_guard<std::mutex> lock(learned_mu_);
  for (size_t i = 0; i < op.keys.size(); ++i) {
    const uint64_t end = i + 1 < op.keys.size() ? op.expect_off[i + 1] : op.dest_floats;
    const uint64_t expected = end - op.expect_off[i];
    if (op.src_lens[i] == expected) continue;
    auto it = learned_lens_.find(op.keys[i]);
    if (it != learned_lens_.end() && it->second == expected) learned_lens_.erase(it);
  }
}

std::future<Result<PullView>> WorkerNode::ZPull(const std::vector<uint64_t>& keys) {
  auto op = std::make_shared<KvOp>();
  op->CountIn(kv_in_flight_, copied_counter());
  op->view = true;
  auto fut = op->view_done.get_future();
  StartPull(op, keys);
  return fut;
}

std::future<Status> WorkerNode::PullInto(const std::vector<uint64_t>& keys, float* dest, size_t dest_floats,
                                         std::vector<uint32_t>* lens) {
  auto op = std::make_shared<KvOp>();
  op->CountIn(kv_in_flight_, copied_counter());
  auto fut = op->push_done.get_future();
  if (dest == nullptr && dest_floats > 0) {
    op->Fail(Status(Code::kInvalidArgument, "pull: null destination for " + std::to_string(dest_floats) + " floats"));
    return fut;
  }
  static float none;  // a non-null destination for zero floats
  op->dest = dest != nullptr ? dest : &none;
  op->dest_floats = dest_floats;
  op->dest_lens = lens;
  if (lens != nullptr && !keys.empty() && lens->size() == keys.size()) {
    // The caller's lens (e.g. from the last call with these keys) as the expected layout.
    op->expect_off.resize(keys.size());
    uint64_t off = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      op->expect_off[i] = off;
      off += (*lens)[i];
    }
    if (off != dest_floats) op->expect_off.clear();  // cannot be right: not used
  }
  uint64_t learned_total = 0;
  std::vector<uint64_t> learned;
  if (op->expect_off.empty() && keys.size() > 1 && LearnedLayout(keys, &learned, &learned_total) &&
      learned_total == dest_floats) {
    op->expect_off = std::move(learned);  // no layout given: the sizes earlier answers told
    op->learner = this;
  }
  StartPull(op, keys);
  return fut;
}

void WorkerNode::StartPull(const std::shared_ptr<KvOp>& op, const std::vector<uint64_t>& keys) {
  op->push = false;
  op->keys = keys;
  op->src.resize(keys.size());
  op->src_lens.resize(keys.size());
  op->outstanding = keys.size();
  op->deadline = std::chrono::steady_clock::now() + options_.request_timeout;
  if (keys.empty()) {
    op->Acked(0);
    return;
  }
  bool queued = loop()->Run([this, op] {
    op->seq = ++op_seq_;
    KvPart all;
    all.indices.resize(op->keys.size());
    std::iota(all.indices.begin(), all.indices.end(), 0);
    Dispatch(op, std::move(all));
  });
  if (!queued) op->Fail(Stopped());
}

void WorkerNode::Dispatch(const std::shared_ptr<KvOp>& op, KvPart part) {
  if (op->finished) return;
  if (closed()) return op->Fail(Stopped());  // a shared loop runs on after Stop
  int n = metadata().server_num();
  // While a scale holds traffic, and behind parts held for a re-send: an op issued after
  // a push that must be sent again must not overtake it.
  if (holding_ || n == 0 || !held_.empty()) {
    held_.emplace_back(op, std::move(part));
    WatchHeld();
    return;
  }
  if (op->push && part.for_servers != n) {
    // Encoded for another server count: split this payload again from its own bytes
    // (made contiguous first when its values are the caller's, sent without a copy).
    BufferPtr bytes = part.payload.Flatten();
    if (!part.payload.tail.empty() && bytes) op->CountCopied(bytes->size());
    Result<core::KvView> v = bytes ? core::DecodeKvPairs(bytes->data(), bytes->size(), true)
                                   : Result<core::KvView>(Status(Code::kInternal, "push part without payload"));
    if (!v.ok()) return op->Fail(v.status());
    std::vector<uint64_t> offsets(v->num_keys);
    uint64_t off = 0;
    for (size_t i = 0; i < v->num_keys; ++i) {
      offsets[i] = off;
      off += v->lens[i];
    }
    op->CountCopied(off * sizeof(float));  // every value once, into the new parts
    std::vector<std::vector<size_t>> groups = ByOwner(v->keys, v->num_keys, n);
    for (int s = 0; s < n; ++s) {
      if (groups[s].empty()) continue;
      KvPart sub = part.Successor();
      sub.server = s;
      sub.for_servers = n;
      sub.num_keys = groups[s].size();
      uint64_t floats = 0;
      for (size_t i : groups[s]) floats += v->lens[i];
      sub.payload = PushPayload(core::EncodeKvPairsGather(v->keys, v->lens, v->values, offsets.data(), groups[s].data(),
                                                          groups[s].size()),
                                floats, groups[s].size());
      Send(op, std::move(sub));
    }
    return;
  }
  if (op->push) return Send(op, std::move(part));
  if (n == 1) {  // every key to the one server: no grouping
    part.server = 0;
    part.for_servers = n;
    return Send(op, std::move(part));
  }
  std::vector<uint64_t> ks;
  ks.reserve(part.indices.size());
  for (size_t i : part.indices) ks.push_back(op->keys[i]);
  std::vector<std::vector<size_t>> groups = ByOwner(ks.data(), ks.size(), n);
  for (int s = 0; s < n; ++s) {
    if (groups[s].empty()) continue;
    KvPart sub = part.Successor();
    sub.server = s;
    sub.for_servers = n;
    for (size_t j : groups[s]) sub.indices.push_back(part.indices[j]);
    Send(op, std::move(sub));
  }
}

void WorkerNode::Send(const std::shared_ptr<KvOp>& op, KvPart part) {
  Payload payload = part.payload;
  comm::AnswerSink sink;
  if (!op->push) {
    const std::vector<size_t>& idx = part.indices;
    const bool consecutive =
        !idx.empty() && std::adjacent_find(idx.begin(), idx.end(), [](size_t a, size_t b) { return b != a + 1; }) ==
                            idx.end();
    if (consecutive) {
      // Consecutive keys (all of them, for one server): encoded from op->keys as they are.
      payload = core::EncodeKvPairs(op->keys.data() + idx.front(), idx.size(), nullptr, nullptr, 0);
    } else {
      std::vector<uint64_t> ks;
      ks.reserve(idx.size());
      for (size_t i : idx) ks.push_back(op->keys[i]);
      payload = core::EncodeKvPairs(ks.data(), ks.size(), nullptr, nullptr, 0);
    }
    // PullInto: an answer written from the store (head + values) whose place in dest is
    // known has its values read straight into it.
    uint64_t off = 0;
    uint64_t floats = 0;
    if (op->SinkRegion(part.indices, &off, &floats)) {
      sink = comm::AnswerSink{reinterpret_cast<char*>(op->dest + off), floats * sizeof(float)};
    }
  }
  // The range's primary under the current metadata (with replicas, the first live copy);
  // with every copy down, the range's own rank (the send fails and is retried).
  int server = Primary(part.server);
  if (server < 0) server = part.server;
  part.target = server;
  ++op->parts_sent;
  part.addr = ServerAddress(server);
  const Status last_error = part.lost;
  part.lost = Status::Ok();
  if (part.lost_since != TimePoint{}) ++part.attempts;
  pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::WORKER, -1);
  meta.set_handler(op->push ? kPushHandler : kPullHandler);
  if (op->push) {
    // The same id on every send of this part: a server that applied it acknowledges a
    // repeat without applying it again.
    if (part.push_seq == 0) part.push_seq = ++push_seq_;
    pb::PushId* id = meta.mutable_push_id();
    id->set_writer(options_.node_id);
    id->set_incarnation(push_incarnation_);
    id->set_seq(part.push_seq);
    if (part.origin_seq != 0) id->set_origin_seq(part.origin_seq);
  }
  // A part sent again while its server is lost ends at its recovery deadline even when
  // the send is still under way then (a dial alone may take connect_timeout), unless the
  // metadata has named a new address for the server meanwhile: then the send (to the old
  // one) ends by itself and the part goes to the new one. The timer ends with the send.
  auto timer = std::make_shared<comm::TimerId>(0);
  part.sent_at = std::chrono::steady_clock::now();
  if (part.lost_since != TimePoint{}) {
    const Duration left = HeldUntil(*op, part) - part.sent_at;
    *timer = loop()->AddTimer(std::max(left, Duration::zero()), Duration::zero(),
                              [this, op, timer, rank = server, range = part.server, addr = part.addr,
                               server_name = part.lost_server, since = part.lost_since, sends = part.attempts + 1,
                               last = last_error] {
                                *timer = 0;
                                if (ServerAddress(rank) != addr || Primary(range) != rank) return;
                                op->Fail(GaveUpStatus(server_name, since, sends, last, options_.recovery_timeout));
                              });
  }
  Issue(server, std::move(meta), std::move(payload), sink,
        [this, op, timer, part = std::move(part)](Result<Frame> r) mutable {
          if (*timer != 0) loop()->CancelTimer(*timer);
          *timer = 0;
          OnPart(op, std::move(part), std::move(r));
        });
}

// Loop thread: keeps a part to send again; held parts go out 50 ms later (or when the
// scale that holds traffic ends).
void WorkerNode::HoldForRetry(const std::shared_ptr<KvOp>& op, KvPart part) {
  if (closed()) return op->Fail(Stopped());  // StopRole has answered the held ones already
  held_.emplace_back(op, std::move(part));
  WatchHeld();
}

// Loop thread: every 50 ms while parts are held, sends them again once no scale holds
// traffic, and meanwhile fails those past their op's deadline (a scale may last up to the
// scheduler's scale_timeout, longer than a request may wait).
void WorkerNode::WatchHeld() {
  if (retry_timer_ != 0 || closed()) return;
  retry_timer_ = loop()->AddTimer(std::chrono::milliseconds(50), Duration::zero(), [this] {
    retry_timer_ = 0;
    if (!holding_ && metadata().server_num() > 0) return ReleaseHeld();
    TimePoint now = std::chrono::steady_clock::now();
    auto expired = std::stable_partition(held_.begin(), held_.end(),
                                         [this, now](const auto& h) { return now < HeldUntil(*h.first, h.second); });
    std::vector<std::pair<std::shared_ptr<KvOp>, KvPart>> late(std::make_move_iterator(expired),
                                                               std::make_move_iterator(held_.end()));
    held_.erase(expired, held_.end());
    for (auto& [op, part] : late) op->Fail(part.lost_since != TimePoint{} ? GaveUp(part) : HeldTooLong());
    if (!held_.empty()) WatchHeld();
  });
}

void WorkerNode::OnPart(const std::shared_ptr<KvOp>& op, KvPart part, Result<Frame> r) {
  if (!op->PartEnded()) return;
  size_t keys = op->push ? part.num_keys : part.indices.size();
  if (!r.ok()) {
    // kAborted: the server no longer owns these keys (a scale operation moved them). Nothing
    // of this part was applied, so it is safe to send it again once the metadata is new.
    if (r.status().code() == Code::kAborted && std::chrono::steady_clock::now() < op->deadline) {
      VLOG(1) << options_.node_id << ": " << keys << " keys moved; re-sending after the scale";
      return HoldForRetry(op, std::move(part));
    }
    // The link died before the answer, or the server cannot be reached (killed, restarting
    // on the same or a new address), or it asks for the push again (being applied by an
    // earlier send). Sent again with the same push id until recovery_timeout: a server that
    // applied it acknowledges the repeat without applying it. A server that left by a
    // scale-in had handed its keys over first: the part goes to their new owner.
    const Code code = r.status().code();
    if (code == Code::kUnavailable || (code == Code::kTimeout && part.lost_since != TimePoint{})) {
      return RetryLost(op, std::move(part), r.status());
    }
    op->Fail(r.status());
    return;
  }
  if (!op->push && AfterHeldPush(*op, part)) {
    // Answered after an earlier push to that server was refused and held for a re-send:
    // the answer cannot show that push. Pulled again behind it.
    VLOG(1) << options_.node_id << ": pull answered before an earlier push's re-send; pulling again after it";
    return HoldForRetry(op, std::move(part));
  }
  if (!op->push) {
    BufferPtr b = r->payload ? std::move(r->payload) : Buffer::Allocate(0);
    // Values read into dest (the sink) leave only the head here.
    const bool in_dest = r->tail_bytes > 0;
    Result<core::KvView> view = in_dest ? core::DecodeKvPairsHead(b->data(), b->size(), r->tail_bytes)
                                        : core::DecodeKvPairs(b->data(), b->size(), /*expect_values=*/true);
    if (!view.ok()) return op->Fail(view.status());
    if (view->num_keys != keys) {
      return op->Fail(Status(Code::kProtocol, "pull: answer has " + std::to_string(view->num_keys) +
                                                  " keys, asked " + std::to_string(keys)));
    }
    const float* p = view->values;
    if (in_dest) {
      uint64_t off = 0;
      uint64_t floats = 0;
      if (!op->SinkRegion(part.indices, &off, &floats)) {
        return op->Fail(Status(Code::kInternal, "pull: an answer was read into dest without a place there"));
      }
      p = op->dest + off;
      if (op->in_dest.empty()) op->in_dest.assign(op->keys.size(), 0);
      in_place_pulls_.fetch_add(1, std::memory_order_relaxed);
    }
    for (size_t j = 0; j < keys; ++j) {
      op->src[part.indices[j]] = p;
      op->src_lens[part.indices[j]] = view->lens[j];
      if (in_dest) op->in_dest[part.indices[j]] = 1;
      p += view->lens[j];
    }
    LearnLens(*op, part.indices, view->lens);
    op->answers.push_back(b);
    if (!op->into_result && op->outstanding == keys && op->Misplaced() &&
        std::accumulate(op->src_lens.begin(), op->src_lens.end(), uint64_t{0}) == op->dest_floats) {
      // The caller's layout put an answer's values where they do not belong: pull all the
      // keys again and copy them this time (rare: only a wrong layout gets here).
      VLOG(1) << options_.node_id << ": PullInto layout did not match the keys; pulling again";
      if (op->learner != nullptr) ForgetLens(*op);
      op->no_sinks = true;
      op->answers.clear();
      op->in_dest.clear();
      op->outstanding = op->keys.size();
      KvPart all;
      all.indices.resize(op->keys.size());
      std::iota(all.indices.begin(), all.indices.end(), 0);
      return Dispatch(op, std::move(all));
    }
  }
  op->Acked(keys);
}

Status WorkerNode::HeldTooLong() const {
  return Status(Code::kTimeout, "key-value request held past its deadline (request_timeout " +
                                    std::to_string(ToMillis(options_.request_timeout)) +
                                    " ms) while the cluster scaled");
}

void WorkerNode::RetryLost(const std::shared_ptr<KvOp>& op, KvPart part, const Status& why) {
  const TimePoint now = std::chrono::steady_clock::now();
  if (part.lost_since == TimePoint{}) {
    // The clock starts with the send that failed (a dial may have taken connect_timeout).
    part.lost_since = part.sent_at;
    part.lost_server = ServerName(part.target);
    LOG(WARNING) << options_.node_id << ": " << (op->push ? "push" : "pull") << " to server " << part.lost_server
                 << " lost (" << why << "); sending it again for up to "
                 << ToMillis(options_.recovery_timeout) << " ms";
  }
  part.lost = why;
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
// wait up to their op's deadline.
TimePoint WorkerNode::HeldUntil(const KvOp& op, const KvPart& part) const {
  if (part.lost_since == TimePoint{}) return op.deadline;
  return part.lost_since + options_.recovery_timeout;
}

std::string WorkerNode::ServerName(int rank) const {
  std::string id;
  const pb::SendMetadataMessage md = metadata();
  for (const pb::ServersMeta& s : md.servers_meta()) {
    if (s.role() == pb::SERVER && s.rank_id() == rank) id = s.node_id();
  }
  return (id.empty() ? "rank " + std::to_string(rank) : id) + " (" + ServerAddress(rank) + ")";
}

bool WorkerNode::AfterHeldPush(const KvOp& op, const KvPart& part) const {
  // Same server: same address, or the same rank of the same view (restarted elsewhere).
  for (const auto& [held_op, held_part] : held_) {
    if (held_op->push && held_op->seq < op.seq &&
        (held_part.addr == part.addr ||
         (held_part.server == part.server && held_part.for_servers == part.for_servers))) {
      return true;
    }
  }
  return false;
}

void WorkerNode::ReleaseHeld() {
  auto held = std::move(held_);
  held_.clear();
  // In issue order: parts are held in the order they were refused (a pull held while the
  // cluster scales, then an earlier push refused as its keys moved), and go out on one
  // link per server, in order.
  std::stable_sort(held.begin(), held.end(), [](const auto& a, const auto& b) { return a.first->seq < b.first->seq; });
  TimePoint now = std::chrono::steady_clock::now();
  for (auto& [op, part] : held) {
    if (now >= HeldUntil(*op, part)) {
      op->Fail(part.lost_since != TimePoint{} ? GaveUp(part) : HeldTooLong());
      continue;
    }
    Dispatch(op, std::move(part));
  }
}

void WorkerNode::OnStateApplied(pb::ClusterState state) {
  bool scaling = state == pb::CLUSTER_SCALE_OUT || state == pb::CLUSTER_SCALE_IN;
  const bool release = scaling != holding_ && !scaling;
  holding_ = scaling;
  // The live replicas first: Node::ApplyMetadata applies the state before
  // OnMetadataApplied, and parts released under the previous metadata's live set would go
  // to a server it has just marked down (a rolled-back scale-out whose server timed out),
  // over a fresh link that nothing closes again: they would wait out request_timeout.
  UpdateRoute();
  if (release) ReleaseHeld();
}

void WorkerNode::OnMetadataApplied() {
  if (!holding_ && !held_.empty()) ReleaseHeld();
  UpdateRoute();
}

void WorkerNode::OnScaleOutReady(const pb::SendMetadataMessage&, std::function<void()> done) { done(); }

void WorkerNode::OnScaleInStart(const pb::ScaleInMessage&, std::function<void()> done) {
  holding_ = true;
  UpdateRoute();
  done();
}

void WorkerNode::OnClusterEvent(const pb::ClusterEventMessage& ev) {
  // A silent server (stopped, cut off) never closes its link, so parts in flight on it
  // would wait out request_timeout. Closed now, they fail kUnavailable and go through
  // RetryLost: to the range's new primary once the metadata marks the server down
  // (replicas >= 2, Node::ApplyMetadata closes the link then too), else to the same
  // server, whose answer is waited for until recovery_timeout from the first send.
  // By rank, without copying the metadata (a wave of timeouts brings one notice each).
  if (ev.kind() != pb::ClusterEventMessage::NODE_TIMED_OUT || ev.role() != pb::SERVER) return;
  const std::string addr = ServerAddress(ev.rank_id());
  if (addr.empty()) return;
  CloseServerLink(addr, Status(Code::kUnavailable, "server " + ev.node_id() + " (" + addr +
                                                       ") timed out at the scheduler (no heartbeat)"));
  // PullSync's direct calls to it as well; new ones take the loop's way until the next
  // metadata or state sets the route again.
  std::lock_guard<std::mutex> lock(direct_mu_);
  route_.usable = false;
  InterruptDirectLocked(addr, "timed out at the scheduler");
}

// ---- PullSync: the direct way ----

void WorkerNode::StopRole() {
  // Parts held for a scale to end are answered now: nothing will send them any more.
  if (retry_timer_ != 0) loop()->CancelTimer(retry_timer_);
  retry_timer_ = 0;
  auto held = std::move(held_);
  held_.clear();
  for (auto& [op, part] : held) op->Fail(Stopped());
  std::lock_guard<std::mutex> lock(direct_mu_);
  route_ = Route();
  route_.stopped = true;
  idle_links_.clear();  // a link out with a caller is dropped when it comes back
  for (const auto& [addr, link] : busy_links_) link->Interrupt();  // its caller ends now
}

int WorkerNode::Primary(int range) const {
  if (replicas_ <= 1) return range;
  return core::PrimaryOf(range, static_cast<int>(live_.size()), replicas_, live_);
}

void WorkerNode::UpdateRoute() {
  {
    // Where each range is read and written: its first live replica (docs/reliability.md).
    const pb::SendMetadataMessage md = metadata();
    const int n = std::max(0, md.server_num());
    replicas_ = std::max(1, md.replicas());
    live_.assign(static_cast<size_t>(n), 1);
    for (const pb::ServersMeta& s : md.servers_meta()) {
      if (s.role() == pb::SERVER && s.rank_id() >= 0 && s.rank_id() < n) live_[s.rank_id()] = s.is_alive() ? 1 : 0;
    }
  }
  Route r;
  r.usable = !holding_ && cluster_state() == pb::CLUSTER_READY;
  // server_num comes from the wire: walk only the ranks the metadata gave an address
  // (a count with no addresses behind it must not size anything here).
  const int n = metadata().server_num();
  for (int range = 0; range < n; ++range) {
    const int primary = Primary(range);
    std::string addr = primary < 0 ? std::string() : ServerAddress(primary);
    if (addr.empty()) {
      r.usable = false;
      break;
    }
    r.addrs.push_back(std::move(addr));
  }
  std::lock_guard<std::mutex> lock(direct_mu_);
  if (route_.stopped) return;
  // Links to servers that left or serve no range now (marked down: their ranges' backups
  // were promoted) are closed, calls in flight on them interrupted; the others stay.
  std::vector<std::string> gone;
  for (const auto& [addr, links] : idle_links_) gone.push_back(addr);
  for (const auto& [addr, link] : busy_links_) gone.push_back(addr);
  for (const std::string& addr : gone) {
    if (std::find(r.addrs.begin(), r.addrs.end(), addr) == r.addrs.end()) {
      InterruptDirectLocked(addr, "serves no key range now");
    }
  }
  route_ = std::move(r);
}

void WorkerNode::InterruptDirectLocked(const std::string& addr, const char* why) {
  idle_links_.erase(addr);
  auto [begin, end] = busy_links_.equal_range(addr);
  for (auto it = begin; it != end; ++it) {
    VLOG(1) << options_.node_id << ": direct pull to " << addr << " interrupted: " << why;
    it->second->Interrupt();
  }
}

Result<PullResult> WorkerNode::PullSync(const std::vector<uint64_t>& keys) {
  if (loop()->OnRunningLoop()) {
    return Status(Code::kFailedPrecondition, "PullSync blocks: call it from a thread other than the node's loop");
  }
  std::optional<Result<PullResult>> direct = TryDirectPull(keys);
  if (direct.has_value()) return std::move(*direct);
  std::future<Result<PullResult>> f = Pull(keys);
  // Pull ends by itself within the request timeout, or the recovery timeout of a lost
  // server (held parts fail then); the margin only guards against a stopped loop.
  if (f.wait_for(options_.request_timeout + options_.recovery_timeout + std::chrono::seconds(5)) !=
      std::future_status::ready) {
    return Status(Code::kTimeout, "pull: no answer within the request timeout");
  }
  return f.get();
}

void WorkerNode::KeepIdle(const std::string& addr, std::unique_ptr<comm::BlockingLink> link) {
  std::lock_guard<std::mutex> lock(direct_mu_);
  if (route_.stopped) return;  // dropped: the link closes as the caller lets go of it
  idle_links_[addr].push_back(std::move(link));
}

std::optional<Result<PullResult>> WorkerNode::TryDirectPull(const std::vector<uint64_t>& keys) {
  constexpr size_t kMaxDirectKeys = 2048;  // a request of at most 16 KiB of keys
  if (keys.empty() || keys.size() > kMaxDirectKeys) return std::nullopt;
  // The direct links are plaintext blocking sockets: with TLS every pull goes over the
  // loop's (encrypted) links.
  if (options_.tls != nullptr) return std::nullopt;
  // Ordering: an earlier Push of this worker still in flight on its loop link could be
  // overtaken on another connection, so the direct way is only for a quiet worker.
  if (kv_in_flight_->load(std::memory_order_acquire) != 0) return std::nullopt;
  std::string addr;
  std::unique_ptr<comm::BlockingLink> link;
  {
    std::lock_guard<std::mutex> lock(direct_mu_);
    const int n = static_cast<int>(route_.addrs.size());
    if (!route_.usable || n == 0) return std::nullopt;
    const int owner = core::ServerForKey(keys[0], n);
    for (uint64_t k : keys) {
      if (core::ServerForKey(k, n) != owner) return std::nullopt;
    }
    addr = route_.addrs[owner];
    auto idle = idle_links_.find(addr);
    if (idle != idle_links_.end() && !idle->second.empty()) {
      link = std::move(idle->second.back());
      idle->second.pop_back();
    }
  }
  if (!link) {
    comm::BlockingLinkOptions lo;
    lo.limits.max_message_bytes = options_.max_message_bytes;
    lo.auth_token = options_.cluster_token;
    lo.connect_timeout = std::min<Duration>(options_.connect_timeout, std::chrono::seconds(2));
    const size_t colon = addr.rfind(':');
    Result<std::unique_ptr<comm::BlockingLink>> dialed =
        comm::BlockingLink::Dial(addr.substr(0, colon), std::atoi(addr.c_str() + colon + 1), lo);
    if (!dialed.ok()) {
      VLOG(1) << options_.node_id << ": direct link to " << addr << ": " << dialed.status();
      return std::nullopt;
    }
    link = std::move(*dialed);
    // Say who we are first, as on the loop's links: servers serve members only.
    pb::HelloMessage hello;
    hello.set_node_id(options_.node_id);
    hello.set_role(pb::WORKER);
    hello.set_rank_id(rank());
    if (!link->Notify(MakeMeta(pb::HELLO, pb::WORKER, rank()), ToBuffer(hello), lo.connect_timeout).ok()) {
      return std::nullopt;
    }
  }
  {
    // Out with this thread from here: the loop interrupts it once the server is timed out
    // or no longer the keys' primary. Checked again under the lock, so a route that
    // changed while the link was taken or dialled is not missed.
    std::lock_guard<std::mutex> lock(direct_mu_);
    if (!route_.usable || std::find(route_.addrs.begin(), route_.addrs.end(), addr) == route_.addrs.end()) {
      return std::nullopt;
    }
    busy_links_.emplace(addr, link.get());
  }
  pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::WORKER, rank());
  meta.set_handler(kPullHandler);
  const uint64_t copied_before = link->payload_bytes_copied();
  Result<comm::Frame> answer =
      link->Call(meta, core::EncodeKvPairs(keys.data(), keys.size(), nullptr, nullptr, 0), options_.request_timeout);
  {
    std::lock_guard<std::mutex> lock(direct_mu_);
    auto [begin, end] = busy_links_.equal_range(addr);
    for (auto it = begin; it != end; ++it) {
      if (it->second == link.get()) {
        busy_links_.erase(it);
        break;
      }
    }
  }
  CountCopied(link->payload_bytes_copied() - copied_before);
  if (!answer.ok()) {
    const Code code = answer.status().code();
    // The link failed (the loop's path knows how to wait for a server or a scale), or
    // the keys moved in a scale (kAborted; nothing was read): the ordinary Pull decides.
    if (link->broken() && code != Code::kTimeout) return std::nullopt;
    if (code == Code::kAborted) return std::nullopt;
    if (!link->broken()) KeepIdle(addr, std::move(link));
    return Result<PullResult>(answer.status());
  }
  KeepIdle(addr, std::move(link));
  const BufferPtr& b = answer->payload;
  Result<core::KvView> view = core::DecodeKvPairs(b ? b->data() : "", b ? b->size() : 0, /*expect_values=*/true);
  if (!view.ok()) return Result<PullResult>(view.status());
  if (view->num_keys != keys.size()) {
    return Result<PullResult>(Status(Code::kProtocol, "pull: answer has " + std::to_string(view->num_keys) +
                                                          " keys, asked " + std::to_string(keys.size())));
  }
  PullResult out;
  out.lens.assign(view->lens, view->lens + view->num_keys);
  out.values.assign(view->values, view->values + view->num_values);
  CountCopied(view->num_values * sizeof(float));
  direct_pulls_.fetch_add(1, std::memory_order_relaxed);
  return Result<PullResult>(std::move(out));
}

}  // namespace pscore::node
