// DirectControl: a user thread's blocking coordination call (a KV request, a barrier) over
// a blocking link to the scheduler that the calling thread writes and reads itself. A round
// trip then costs the two wake-ups of a blocking ping-pong instead of four (the hand-off to
// the node's loop thread and the answer's way back).
//
// The node's loop thread opens the way once the node is registered on a scheduler link and
// closes it when that link, its session or the node ends; closing interrupts the calls out.
// A call the direct way cannot answer goes the loop's way, which parks and re-issues across
// scheduler restarts. The links are plaintext blocking sockets: with TLS every call goes the
// loop's way. Every method is thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "pscore/comm/blocking_link.h"
#include "pscore/node/common/options.h"

namespace pscore::node {

// A node's direct links (DirectControl's to the scheduler, a worker's DirectPuller's to a
// server) are dialed with the node's message limit and cluster token; the dial waits at
// most DirectConnectTimeout, after which the caller goes the loop's way.
Duration DirectConnectTimeout(const NodeOptions& options);
// The link to host:port, or null (logged at VLOG 1, naming `what`) when it cannot be made.
std::unique_ptr<comm::BlockingLink> DialDirect(const NodeOptions& options, const std::string& host, int port,
                                               const std::string& what);

class DirectControl {
 public:
  // One link to the scheduler, for one calling thread at a time: callers that find it out
  // go the loop's way, where the calls of many threads share writes, reads and the
  // scheduler's wake-ups.
  static constexpr size_t kMaxLinks = 1;

  explicit DirectControl(const NodeOptions& options) : options_(options) {}

  // Calling thread: the scheduler's answer to `cmd` with `payload` (an error the scheduler
  // answered is returned as that error: a refusal of a stale session too, which the caller
  // must act on); `*session` is the session the call carried. nullopt when the direct way
  // is closed or busy, or when its link failed: the call may then have reached the
  // scheduler, and the caller sends it again the loop's way (KV and barrier requests are
  // idempotent when sent again).
  std::optional<Result<comm::Frame>> TryCall(pb::NodeCommand cmd, const BufferPtr& payload, Duration timeout,
                                             uint64_t* session = nullptr);
  // Loop thread: registered with the scheduler (options.scheduler_host and _port); calls
  // carry `meta` (role, rank, session).
  void Open(pb::MessageMeta meta);
  // Loop thread: the scheduler link, its session or the node ended. Idle links are dropped
  // and calls out are interrupted (they go the loop's way) until the next Open.
  void Close(const char* why);
  // The node stopped: the way is never opened again.
  void Stop();
  uint64_t calls() const { return calls_.load(std::memory_order_relaxed); }

 private:
  struct Way {
    bool open = false;
    bool stopped = false;
    pb::MessageMeta meta;
    uint64_t generation = 0;  // counts Open and Close: a link of an older one is dropped
    // A dial failed: calls go the loop's way until then, not each paying a dial.
    TimePoint no_dial_until{};
  };
  // After a failed dial, how long calls go the loop's way before one dials again.
  static constexpr Duration kDialBackoff = std::chrono::seconds(1);
  // A link out with this thread (an idle one or a new dial), or null when closed or full.
  std::unique_ptr<comm::BlockingLink> TakeOut(pb::MessageMeta* meta, uint64_t* generation);
  // Back from a call: kept idle when the way is still the one it was taken under.
  void Bring(std::unique_ptr<comm::BlockingLink> link, uint64_t generation);
  void CloseLocked(const char* why);  // mu_ held

  const NodeOptions& options_;
  std::atomic<uint64_t> calls_{0};  // answered the direct way
  std::mutex mu_;
  Way way_;                                                // mu_
  std::vector<std::unique_ptr<comm::BlockingLink>> idle_;  // mu_
  std::unordered_set<comm::BlockingLink*> busy_;           // out with a calling thread (mu_)
  size_t dialing_ = 0;                                     // dials under way (mu_)
};

}  // namespace pscore::node
