// DirectPuller: PullSync's direct way. A pull whose keys all live on one server goes over a
// blocking link that the calling thread writes and reads itself (no hand-off to the loop
// thread and back). Owned by WorkerNode: its loop thread sets the route and interrupts
// links to servers lost; calling threads pull. Every method is thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "pscore/comm/blocking_link.h"
#include "pscore/node/common/options.h"
#include "pscore/node/worker/pull_result.h"

namespace pscore::node {

class DirectPuller {
 public:
  // options outlive this; copied counts the payload bytes copied (the node's count); rank
  // tells this worker's rank (any thread).
  DirectPuller(const NodeOptions& options, std::shared_ptr<std::atomic<uint64_t>> copied,
               std::function<int()> rank);

  // Calling thread: the pull's answer over a direct link, or nullopt when the direct way
  // does not apply or cannot answer (then Pull decides).
  std::optional<Result<PullResult>> TryPull(const std::vector<uint64_t>& keys);
  // Loop thread: where each key range is read now (its primary's address, by range) and
  // whether direct pulls may go (READY and not scaling). Links to servers that serve no
  // range now are closed, calls on them interrupted; the others stay.
  void SetRoute(bool usable, std::vector<std::string> addrs);
  // Loop thread: the server at `addr` timed out at the scheduler. Calls to it are
  // interrupted (they go the loop's way) and no direct pull goes until the next SetRoute.
  void ServerTimedOut(const std::string& addr);
  // The node stopped: no link is kept or opened again; calls out end now.
  void Stop();
  // Key ranges in the route (0 before any).
  size_t ranges();
  uint64_t pulls() const { return pulls_.load(std::memory_order_relaxed); }

 private:
  struct Route {
    bool stopped = false;            // Stop() ran: no direct link is kept or opened again
    bool usable = false;             // READY and not scaling
    std::vector<std::string> addrs;  // by key range: its primary's address
  };
  // The owner of every key, if one server owns them all; and an idle link to it, if any.
  bool Owner(const std::vector<uint64_t>& keys, std::string* addr, std::unique_ptr<comm::BlockingLink>* link);
  std::unique_ptr<comm::BlockingLink> Dial(const std::string& addr);
  // Marks link as out with this thread to addr; false when addr serves the keys no more.
  bool TakeOut(const std::string& addr, comm::BlockingLink* link);
  void Bring(const std::string& addr, comm::BlockingLink* link);
  void KeepIdle(const std::string& addr, std::unique_ptr<comm::BlockingLink> link);
  // mu_ held: interrupts the busy links to `addr` and drops its idle ones.
  void InterruptLocked(const std::string& addr, const char* why);
  Result<PullResult> Decode(const comm::Frame& answer, size_t keys);

  const NodeOptions& options_;
  std::shared_ptr<std::atomic<uint64_t>> copied_;
  std::function<int()> rank_;
  std::atomic<uint64_t> pulls_{0};
  std::mutex mu_;
  Route route_;  // guarded by mu_
  // Idle links by server address; a calling thread takes one for a call (mu_).
  std::unordered_map<std::string, std::vector<std::unique_ptr<comm::BlockingLink>>> idle_;
  // Links out with a calling thread, by server address (mu_). A server that falls silent
  // never answers them: once it is timed out, or its ranges have another primary, they are
  // interrupted and the calls go the loop's way (RetryLost, the new primary) instead of
  // waiting out request_timeout.
  std::unordered_multimap<std::string, comm::BlockingLink*> busy_;
};

}  // namespace pscore::node
