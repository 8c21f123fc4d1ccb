// CollectiveMailbox: server-to-server messages (COLLECTIVE_SEND_DATA) matched by (sender
// rank, tag), whatever the arrival order, and the AllReduce built on them. Owned by
// ServerNode; its maps are loop state: Send, Recv and AllReduce may be called from any
// thread (they post to the loop), every other method runs on the loop thread.
#pragma once

#include <future>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/core/clock.h"
#include "pscore/node/server/server_links.h"

namespace pscore::node {

class CollectiveMailbox {
 public:
  CollectiveMailbox(std::string node_id, comm::EventLoop* loop, ServerLinks* links);

  // Any thread.
  std::future<Status> Send(int rank, const std::string& tag, BufferPtr payload);
  std::future<Result<BufferPtr>> Recv(int rank, const std::string& tag);
  // Element-wise sum of `data` over the `n` servers (this one is rank `me`); blocking,
  // not on the loop thread.
  Status AllReduce(int me, int n, const std::string& tag, std::vector<float>* data, Duration timeout);

  // Loop thread. A message arrived from server `rank`: handed to its receiver or kept;
  // kAlreadyExists when one of the same tag is kept and not received yet.
  Status Deliver(int rank, const std::string& tag, BufferPtr payload);
  // The scheduler declared `rank` timed out: its receives fail (unless its message came).
  void OnServerLost(int rank, const Status& why);
  void OnServerBack(int rank);  // it recovered or restarted
  // A stable view with `n` servers: ranks are numbered anew when n changed.
  void OnServerCount(int n);
  void Stop();  // every receive fails kCancelled; later ones are refused

 private:
  using Key = std::pair<int, std::string>;
  // Answers the receives waiting on `rank` (all ranks of at least `rank` when `and_above`).
  void FailReceives(int rank, bool and_above, const Status& why);
  Status Stopped() const { return Status(Code::kCancelled, node_id_ + " stopped"); }

  const std::string node_id_;
  comm::EventLoop* const loop_;
  ServerLinks* const links_;
  std::map<Key, BufferPtr> arrived_;
  std::map<Key, std::shared_ptr<std::promise<Result<BufferPtr>>>> waiting_;
  // Server ranks the scheduler has declared timed out, and why: a receive from one fails
  // at once (unless its message arrived before). Cleared when the rank recovers or
  // restarts, or when the server count changes (ranks are then numbered anew).
  std::map<int, Status> gone_ranks_;
  int servers_ = 0;  // the server count of the last stable view
  bool stopped_ = false;
};

}  // namespace pscore::node
