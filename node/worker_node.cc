#include "node/worker_node.h"

#include <atomic>
#include <numeric>

#include "core/key_range.h"
#include "core/kv_codec.h"
#include "node/server_node.h"
#include "node/wire.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

WorkerNode::WorkerNode(NodeOptions options, comm::EventLoop* loop)
    : Node([&] {
        options.role = pb::WORKER;
        return options;
      }(), loop) {}

WorkerNode::~WorkerNode() { Stop(); }

void WorkerNode::Issue(int rank, pb::MessageMeta meta, BufferPtr payload, ReplyCallback cb) {
  loop()->Run([this, rank, meta = std::move(meta), payload = std::move(payload), cb = std::move(cb)]() mutable {
    WithServerConn(rank, [this, meta = std::move(meta), payload = std::move(payload),
                          cb = std::move(cb)](Result<ConnId> c) mutable {
      if (!c.ok()) return cb(c.status());
      meta.set_rank_id(Node::rank());
      messenger().Call(*c, std::move(meta), std::move(payload), options_.request_timeout,
                       [cb = std::move(cb)](Result<Frame> r) {
                         if (!r.ok()) return cb(r.status());
                         cb(r->payload ? r->payload : Buffer::Allocate(0));
                       });
    });
  });
}

void WorkerNode::SendAsync(int rank, int user_cmd, const std::string& handler, BufferPtr payload,
                           ReplyCallback cb) {
  pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::WORKER, -1);
  meta.set_user_cmd(user_cmd);
  meta.set_handler(handler);
  Issue(rank, std::move(meta), std::move(payload), std::move(cb));
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

// One Push or Pull across servers. Loop thread only after creation.
struct WorkerNode::KvOp {
  bool push = true;
  std::vector<uint64_t> keys;
  std::vector<uint32_t> lens;      // push
  std::vector<float> values;       // push
  std::vector<uint64_t> offsets;   // push: first value of each key
  std::vector<std::vector<float>> pulled;  // pull: per key
  size_t outstanding = 0;          // keys not yet acknowledged
  TimePoint deadline;
  bool finished = false;
  std::promise<Status> push_done;
  std::promise<Result<PullResult>> pull_done;

  void Fail(const Status& st) {
    if (finished) return;
    finished = true;
    if (push) {
      push_done.set_value(st);
    } else {
      pull_done.set_value(st);
    }
  }
  void Acked(size_t n) {
    outstanding -= n;
    if (outstanding != 0 || finished) return;
    finished = true;
    if (push) {
      push_done.set_value(Status::Ok());
      return;
    }
    PullResult out;
    for (auto& v : pulled) {
      out.lens.push_back(static_cast<uint32_t>(v.size()));
      out.values.insert(out.values.end(), v.begin(), v.end());
    }
    pull_done.set_value(std::move(out));
  }
};

std::future<Status> WorkerNode::Push(const std::vector<uint64_t>& keys, const std::vector<float>& values,
                                     const std::vector<uint32_t>& lens_in) {
  auto op = std::make_shared<KvOp>();
  auto fut = op->push_done.get_future();
  op->lens = lens_in;
  if (op->lens.empty() && !keys.empty()) {
    op->lens.assign(keys.size(), static_cast<uint32_t>(values.size() / keys.size()));
  }
  if (op->lens.size() != keys.size() ||
      std::accumulate(op->lens.begin(), op->lens.end(), uint64_t{0}) != values.size()) {
    op->Fail(Status(Code::kInvalidArgument, "push: " + std::to_string(keys.size()) + " keys, " +
                                                std::to_string(lens_in.size()) + " lens and " +
                                                std::to_string(values.size()) + " values do not match"));
    return fut;
  }
  op->keys = keys;
  op->values = values;  // Kept until acknowledged: a part refused during scaling is re-sent.
  op->offsets.resize(keys.size());
  uint64_t off = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    op->offsets[i] = off;
    off += op->lens[i];
  }
  op->outstanding = keys.size();
  op->deadline = std::chrono::steady_clock::now() + options_.request_timeout;
  if (keys.empty()) {
    op->Acked(0);
    return fut;
  }
  loop()->Run([this, op] {
    std::vector<size_t> all(op->keys.size());
    std::iota(all.begin(), all.end(), 0);
    Dispatch(op, std::move(all));
  });
  return fut;
}

std::future<Result<PullResult>> WorkerNode::Pull(const std::vector<uint64_t>& keys) {
  auto op = std::make_shared<KvOp>();
  op->push = false;
  auto fut = op->pull_done.get_future();
  op->keys = keys;
  op->pulled.resize(keys.size());
  op->outstanding = keys.size();
  op->deadline = std::chrono::steady_clock::now() + options_.request_timeout;
  if (keys.empty()) {
    op->Acked(0);
    return fut;
  }
  loop()->Run([this, op] {
    std::vector<size_t> all(op->keys.size());
    std::iota(all.begin(), all.end(), 0);
    Dispatch(op, std::move(all));
  });
  return fut;
}

void WorkerNode::Dispatch(const std::shared_ptr<KvOp>& op, std::vector<size_t> indices) {
  if (op->finished) return;
  int n = metadata().server_num();
  if (holding_ || n == 0) {
    held_.emplace_back(op, std::move(indices));
    return;
  }
  std::vector<std::vector<size_t>> by_server(n);
  for (size_t i : indices) by_server[core::ServerForKey(op->keys[i], n)].push_back(i);
  for (int s = 0; s < n; ++s) {
    if (by_server[s].empty()) continue;
    std::vector<size_t>& part = by_server[s];
    BufferPtr payload;
    if (op->push) {
      payload = core::EncodeKvPairsGather(op->keys.data(), op->lens.data(), op->values.data(),
                                          op->offsets.data(), part.data(), part.size());
    } else {
      std::vector<uint64_t> ks;
      ks.reserve(part.size());
      for (size_t i : part) ks.push_back(op->keys[i]);
      payload = core::EncodeKvPairs(ks.data(), ks.size(), nullptr, nullptr, 0);
    }
    SendAsync(s, 0, op->push ? kPushHandler : kPullHandler, payload,
              [this, op, part = std::move(part)](Result<BufferPtr> r) mutable {
                OnPart(op, std::move(part), std::move(r));
              });
  }
}

void WorkerNode::OnPart(const std::shared_ptr<KvOp>& op, std::vector<size_t> indices, Result<BufferPtr> r) {
  if (op->finished) return;
  if (!r.ok()) {
    // kAborted: the server no longer owns these keys (a scale operation moved them). Nothing
    // of this part was applied, so it is safe to send it again once the metadata is new.
    if (r.status().code() == Code::kAborted && std::chrono::steady_clock::now() < op->deadline) {
      VLOG(1) << options_.node_id << ": " << indices.size() << " keys moved; re-sending after the scale";
      held_.emplace_back(op, std::move(indices));
      if (retry_timer_ == 0) {
        retry_timer_ = loop()->AddTimer(std::chrono::milliseconds(50), Duration::zero(), [this] {
          retry_timer_ = 0;
          if (!holding_) ReleaseHeld();
        });
      }
      return;
    }
    op->Fail(r.status());
    return;
  }
  if (!op->push) {
    const BufferPtr& b = *r;
    Result<core::KvView> view = core::DecodeKvPairs(b->data(), b->size(), /*expect_values=*/true);
    if (!view.ok()) return op->Fail(view.status());
    if (view->num_keys != indices.size()) {
      return op->Fail(Status(Code::kProtocol, "pull: answer has " + std::to_string(view->num_keys) +
                                                  " keys, asked " + std::to_string(indices.size())));
    }
    const float* p = view->values;
    for (size_t j = 0; j < indices.size(); ++j) {
      op->pulled[indices[j]].assign(p, p + view->lens[j]);
      p += view->lens[j];
    }
  }
  op->Acked(indices.size());
}

void WorkerNode::ReleaseHeld() {
  auto held = std::move(held_);
  held_.clear();
  TimePoint now = std::chrono::steady_clock::now();
  for (auto& [op, indices] : held) {
    if (now >= op->deadline) {
      op->Fail(Status(Code::kTimeout, "key-value request held past its deadline while the cluster scaled"));
      continue;
    }
    Dispatch(op, std::move(indices));
  }
}

void WorkerNode::OnStateApplied(pb::ClusterState state) {
  bool scaling = state == pb::CLUSTER_SCALE_OUT || state == pb::CLUSTER_SCALE_IN;
  if (scaling == holding_) return;
  holding_ = scaling;
  if (!holding_) ReleaseHeld();
}

void WorkerNode::OnMetadataApplied() {
  if (!holding_ && !held_.empty()) ReleaseHeld();
}

void WorkerNode::OnScaleOutReady(const pb::SendMetadataMessage&, std::function<void()> done) { done(); }

void WorkerNode::OnScaleInStart(const pb::ScaleInMessage&, std::function<void()> done) {
  holding_ = true;
  done();
}

}  // namespace pscore::node
