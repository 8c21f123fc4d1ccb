// The key-value requests of a WorkerNode: what every Push, Pull, ZPull and PullInto call
// shares (KvRequest: counting in flight, the deadline, keys still unanswered, how it ends)
// and the parts it is split into per server (KvPart: where a part goes and how its retries
// stand). Created on a calling thread, then touched only on the worker's loop thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pscore/core/buffer.h"
#include "pscore/core/clock.h"
#include "pscore/core/status.h"
#include "pscore/node/worker/key_indices.h"

namespace pscore::node {

// The worker's counters a request counts in (shared: a request may end after its call).
struct KvCounters {
  // Push/Pull/PullInto calls not yet answered: a request counts in it until it ends (down
  // before the caller's future is ready, so PullSync after Push().get() sees zero).
  std::shared_ptr<std::atomic<int>> in_flight;
  // Payload bytes copied in user space (Node::payload_bytes_copied).
  std::shared_ptr<std::atomic<uint64_t>> copied;
};

class KvRequest {
 public:
  enum class Kind : uint8_t { kPush, kPull };
  virtual ~KvRequest() = default;
  KvRequest(const KvRequest&) = delete;
  KvRequest& operator=(const KvRequest&) = delete;

  bool is_push() const { return kind_ == Kind::kPush; }

  // Ends the request with `st` (once; later calls and answers are ignored).
  void Fail(const Status& st);
  // `n` keys were answered; the request ends once every key was.
  void Acked(size_t n);
  // A request of this one ended (answered, failed or expired; its answer no longer writes
  // anywhere). Returns false when this one has ended and the answer is not wanted.
  bool PartEnded();
  void CountCopied(uint64_t bytes) { counters_.copied->fetch_add(bytes, std::memory_order_relaxed); }

  size_t outstanding = 0;  // keys not yet answered
  TimePoint deadline;
  bool finished = false;
  size_t parts_sent = 0;  // requests sent and not yet ended
  uint64_t seq = 0;       // issue order on the loop (WorkerNode::op_seq_)

 protected:
  KvRequest(Kind kind, KvCounters counters);
  // Every key was answered: the caller gets the result.
  virtual void Complete() = 0;
  // The caller gets `st`.
  virtual void Settle(const Status& st) = 0;
  // The request failed: it lets go of what it holds for the result.
  virtual void Abandon() {}
  // True while a failure must wait for the requests sent (their answers may still be
  // written into the caller's memory: the caller owns it again the moment it has the error).
  virtual bool DeferFailure() const { return false; }
  void CountOut();

 private:
  const Kind kind_;
  KvCounters counters_;
  bool counted_ = true;
  std::optional<Status> failure_;  // a deferred failure, settled once parts_sent is 0
};

// Push, ZPush: done once every server acknowledged its part.
class PushRequest final : public KvRequest {
 public:
  explicit PushRequest(KvCounters counters) : KvRequest(Kind::kPush, std::move(counters)) {}
  std::future<Status> future() { return done_.get_future(); }

 private:
  void Complete() override { done_.set_value(Status::Ok()); }
  void Settle(const Status& st) override { done_.set_value(st); }
  std::promise<Status> done_;
};

// What one request to a server carries: a push payload already encoded for `for_servers`
// servers (split again from its own bytes if the server count changed), or pull key
// indices; and where it went and how its retries stand.
struct KvPart {
  // Route.
  int server = -1;       // the key range (server rank of the partition) of its keys
  int target = -1;       // the server rank it was last sent to: the range's primary
  int for_servers = 0;   // the server count its keys were split for (0: not yet known)
  std::string addr;      // the server it was sent to
  int via = -1;          // the server that relayed it there (-1: sent directly)
  // Retry.
  Status lost;               // set when that server's link died before the answer
  TimePoint sent_at{};       // its last send
  TimePoint lost_since{};    // the send that first met its server lost (retried until recovery_timeout)
  int attempts = 0;          // sends since then
  std::string lost_server;   // "node id (address)" of the server lost
  // Push.
  Payload payload;
  size_t num_keys = 0;
  uint64_t push_seq = 0;     // its id's seq once sent (kept when sent again)
  uint64_t origin_seq = 0;   // the sent part it was split from (PushId.origin_seq)
  // Pull.
  KeyIndices indices;  // of the request's keys

  // A part made of some of this one's keys for a new split: no payload or id of its own
  // yet, but the same recovery clock (a loss is not forgotten by re-splitting).
  KvPart Successor() const;
};

}  // namespace pscore::node
