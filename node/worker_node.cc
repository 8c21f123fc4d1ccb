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

std::future<Status> WorkerNode::Push(const std::vector<uint64_t>& keys, const std::vector<float>& values,
                                     const std::vector<uint32_t>& lens_in) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto fut = promise->get_future();
  std::vector<uint32_t> lens = lens_in;
  if (lens.empty() && !keys.empty()) lens.assign(keys.size(), static_cast<uint32_t>(values.size() / keys.size()));
  if (lens.size() != keys.size() ||
      std::accumulate(lens.begin(), lens.end(), uint64_t{0}) != values.size()) {
    promise->set_value(Status(Code::kInvalidArgument, "push: " + std::to_string(keys.size()) + " keys, " +
                                                          std::to_string(lens.size()) + " lens and " +
                                                          std::to_string(values.size()) + " values do not match"));
    return fut;
  }
  int n = server_count();
  if (n == 0) {
    promise->set_value(Status(Code::kUnavailable, "push: no servers in the metadata yet"));
    return fut;
  }
  // Group keys by owning server, keeping each key's values.
  std::vector<std::vector<uint64_t>> k(n);
  std::vector<std::vector<uint32_t>> l(n);
  std::vector<std::vector<float>> v(n);
  size_t off = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    int s = core::ServerForKey(keys[i], n);
    k[s].push_back(keys[i]);
    l[s].push_back(lens[i]);
    v[s].insert(v[s].end(), values.begin() + off, values.begin() + off + lens[i]);
    off += lens[i];
  }
  auto g = std::make_shared<Gather<BufferPtr>>(n);
  for (int s = 0; s < n; ++s) {
    if (k[s].empty()) {
      g->Put(s, BufferPtr());
      continue;
    }
    BufferPtr payload = core::EncodeKvPairs(k[s].data(), k[s].size(), l[s].data(), v[s].data(), v[s].size());
    SendAsync(s, 0, kPushHandler, payload, [g, s](Result<BufferPtr> r) { g->Put(s, std::move(r)); });
  }
  auto gf = std::make_shared<std::future<Result<std::vector<BufferPtr>>>>(g->promise.get_future());
  return std::async(std::launch::deferred, [gf] { return gf->get().status(); });
}

std::future<Result<PullResult>> WorkerNode::Pull(const std::vector<uint64_t>& keys) {
  int n = server_count();
  if (n == 0) {
    std::promise<Result<PullResult>> p;
    p.set_value(Status(Code::kUnavailable, "pull: no servers in the metadata yet"));
    return p.get_future();
  }
  auto groups = std::make_shared<std::vector<std::vector<size_t>>>(n);  // indices into keys
  for (size_t i = 0; i < keys.size(); ++i) (*groups)[core::ServerForKey(keys[i], n)].push_back(i);
  auto g = std::make_shared<Gather<BufferPtr>>(n);
  for (int s = 0; s < n; ++s) {
    if ((*groups)[s].empty()) {
      g->Put(s, BufferPtr());
      continue;
    }
    std::vector<uint64_t> ks;
    for (size_t i : (*groups)[s]) ks.push_back(keys[i]);
    BufferPtr payload = core::EncodeKvPairs(ks.data(), ks.size(), nullptr, nullptr, 0);
    SendAsync(s, 0, kPullHandler, payload, [g, s](Result<BufferPtr> r) { g->Put(s, std::move(r)); });
  }
  auto gf = std::make_shared<std::future<Result<std::vector<BufferPtr>>>>(g->promise.get_future());
  size_t num_keys = keys.size();
  return std::async(std::launch::deferred, [gf, groups, num_keys]() -> Result<PullResult> {
    Result<std::vector<BufferPtr>> answers = gf->get();
    if (!answers.ok()) return answers.status();
    // Reassemble in the caller's key order.
    std::vector<const float*> src(num_keys);
    std::vector<uint32_t> lens(num_keys);
    for (size_t s = 0; s < groups->size(); ++s) {
      if ((*groups)[s].empty()) continue;
      const BufferPtr& b = (*answers)[s];
      Result<core::KvView> view = core::DecodeKvPairs(b->data(), b->size(), /*expect_values=*/true);
      if (!view.ok()) return view.status();
      if (view->num_keys != (*groups)[s].size()) {
        return Status(Code::kProtocol, "pull: server " + std::to_string(s) + " answered " +
                                           std::to_string(view->num_keys) + " keys, asked " +
                                           std::to_string((*groups)[s].size()));
      }
      const float* p = view->values;
      for (size_t j = 0; j < view->num_keys; ++j) {
        size_t i = (*groups)[s][j];
        src[i] = p;
        lens[i] = view->lens[j];
        p += view->lens[j];
      }
    }
    PullResult out;
    out.lens = lens;
    out.values.reserve(std::accumulate(lens.begin(), lens.end(), size_t{0}));
    for (size_t i = 0; i < num_keys; ++i) out.values.insert(out.values.end(), src[i], src[i] + lens[i]);
    return out;
  });
}

}  // namespace pscore::node
