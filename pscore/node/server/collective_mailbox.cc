#include "pscore/node/server/collective_mailbox.h"

#include <glog/logging.h>

#include "pscore/node/common/wire.h"

namespace pscore::node {

using comm::Frame;

CollectiveMailbox::CollectiveMailbox(std::string node_id, comm::EventLoop* loop, ServerLinks* links)
    : node_id_(std::move(node_id)), loop_(loop), links_(links) {}

Status CollectiveMailbox::Deliver(int rank, const std::string& tag, BufferPtr payload) {
  DCHECK(loop_->InLoopThread());
  Key key(rank, tag);
  auto w = waiting_.find(key);
  if (w != waiting_.end()) {
    w->second->set_value(payload);
    waiting_.erase(w);
    return Status::Ok();
  }
  if (!arrived_.emplace(key, payload).second) {
    return Status(Code::kAlreadyExists, "collective tag '" + tag + "' from rank " + std::to_string(rank) +
                                            " already delivered and not received");
  }
  return Status::Ok();
}

void CollectiveMailbox::OnServerLost(int rank, const Status& why) {
  DCHECK(loop_->InLoopThread());
  gone_ranks_[rank] = why;
  FailReceives(rank, /*and_above=*/false, why);
}

void CollectiveMailbox::OnServerBack(int rank) {
  DCHECK(loop_->InLoopThread());
  gone_ranks_.erase(rank);
}

void CollectiveMailbox::OnServerCount(int n) {
  DCHECK(loop_->InLoopThread());
  if (n == servers_) return;
  // Ranks are numbered anew: a timed-out rank may be a live server now, and a receive
  // from a rank the cluster no longer has would wait for nothing.
  gone_ranks_.clear();
  FailReceives(n, /*and_above=*/true,
               Status(Code::kUnavailable, "the cluster has " + std::to_string(n) +
                                              " servers now: no message will come from that rank"));
  servers_ = n;
}

void CollectiveMailbox::Stop() {
  DCHECK(loop_->InLoopThread());
  stopped_ = true;
  for (auto& [key, p] : waiting_) p->set_value(Status(Code::kCancelled, "server stopped"));
  waiting_.clear();
}

void CollectiveMailbox::FailReceives(int rank, bool and_above, const Status& why) {
  for (auto it = waiting_.lower_bound({rank, std::string()}); it != waiting_.end();) {
    if (!and_above && it->first.first != rank) break;
    it->second->set_value(why);
    it = waiting_.erase(it);
  }
}

std::future<Status> CollectiveMailbox::Send(int rank, const std::string& tag, BufferPtr payload) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto fut = promise->get_future();
  bool queued = loop_->Run([this, rank, tag, payload, promise] {
    pb::MessageMeta meta;
    meta.set_cmd(pb::COLLECTIVE_SEND_DATA);
    meta.set_tag(tag);
    links_->CallServer(rank, std::move(meta), payload,
                       [promise](Result<Frame> r) { promise->set_value(r.status()); });
  });
  if (!queued) promise->set_value(Stopped());
  return fut;
}

std::future<Result<BufferPtr>> CollectiveMailbox::Recv(int rank, const std::string& tag) {
  auto promise = std::make_shared<std::promise<Result<BufferPtr>>>();
  auto fut = promise->get_future();
  bool queued = loop_->Run([this, rank, tag, promise] {
    Key key(rank, tag);
    auto a = arrived_.find(key);
    if (a != arrived_.end()) {
      promise->set_value(a->second);
      arrived_.erase(a);
      return;
    }
    if (waiting_.count(key)) {
      promise->set_value(Status(Code::kAlreadyExists, "a receive of tag '" + tag + "' from rank " +
                                                          std::to_string(rank) + " is already waiting"));
      return;
    }
    if (stopped_) return promise->set_value(Stopped());  // a shared loop runs on after Stop
    auto gone = gone_ranks_.find(rank);
    if (gone != gone_ranks_.end()) return promise->set_value(gone->second);
    waiting_[key] = promise;
  });
  if (!queued) promise->set_value(Stopped());
  return fut;
}

Status CollectiveMailbox::AllReduce(int me, int n, const std::string& tag, std::vector<float>* data,
                                    Duration timeout) {
  if (n <= 1) return Status::Ok();
  // One deadline for the whole call, however many ranks are slow.
  const TimePoint deadline = std::chrono::steady_clock::now() + timeout;
  BufferPtr mine = Buffer::Copy(data->data(), data->size() * sizeof(float));
  std::vector<std::future<Status>> sends;
  for (int r = 0; r < n; ++r) {
    if (r != me) sends.push_back(Send(r, tag, mine));
  }
  // Sum in rank order so every server computes bit-identical results.
  std::vector<float> sum(data->size(), 0.0f);
  for (int r = 0; r < n; ++r) {
    const float* part = data->data();
    BufferPtr got;
    if (r != me) {
      auto fut = Recv(r, tag);
      if (fut.wait_until(deadline) != std::future_status::ready) {
        // The receive would wait on for a tag nobody receives again: withdrawn.
        loop_->Run([this, key = Key(r, tag)] { waiting_.erase(key); });
        return Status(Code::kTimeout, "allreduce '" + tag + "': nothing from server rank " + std::to_string(r) +
                                          " within " + std::to_string(ToMillis(timeout)) + " ms");
      }
      Result<BufferPtr> res = fut.get();
      if (!res.ok()) return res.status();
      got = *res;
      if (got->size() != data->size() * sizeof(float)) {
        return Status(Code::kInvalidArgument, "allreduce '" + tag + "': rank " + std::to_string(r) + " sent " +
                                                  std::to_string(got->size()) + " bytes, expected " +
                                                  std::to_string(data->size() * sizeof(float)));
      }
      part = reinterpret_cast<const float*>(got->data());
    }
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  for (auto& f : sends) {
    if (f.wait_until(deadline) != std::future_status::ready) {
      return Status(Code::kTimeout, "allreduce '" + tag + "': a send was not answered within " +
                                        std::to_string(ToMillis(timeout)) + " ms");
    }
    PSCORE_RETURN_IF_ERROR(f.get());
  }
  *data = std::move(sum);
  return Status::Ok();
}

}  // namespace pscore::node
