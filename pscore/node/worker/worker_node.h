// WorkerNode: the training side. Sends requests to servers by rank (by user_cmd or by
// handler name), broadcasts to all servers, and pushes/pulls keyed float tensors that
// are partitioned over the servers by key range (pscore/core/key_range.h). Every call is
// thread-safe and asynchronous (a future or a callback); callbacks run on the loop thread.
// A push or pull is a request object (kv_request.h, pull_request.h) split into one part per
// server (push_parts.h) and handled on the loop thread (worker_dispatch.cc); PullSync's
// direct way is DirectPuller (direct_pull.h).
#pragma once

#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "pscore/node/common/node.h"
#include "pscore/node/worker/direct_pull.h"
#include "pscore/node/worker/kv_request.h"
#include "pscore/node/worker/learned_lens.h"
#include "pscore/node/worker/pull_result.h"
#include "pscore/node/worker/scratch_arrays.h"

namespace pscore::node {

class PullRequest;

using ReplyCallback = std::function<void(Result<BufferPtr>)>;

class WorkerNode : public Node {
 public:
  explicit WorkerNode(NodeOptions options, comm::EventLoop* loop = nullptr);
  ~WorkerNode() override;

  // One request to server `rank`, addressed by user_cmd (handler empty) or handler name.
  // The payload may carry zero-copy tail slices (pscore/core/buffer.h): their memory is written
  // to the socket as it is and must stay unchanged until cb runs with the answer; after an
  // error (a deadline, a lost link) a slice may still be queued for writing, so until
  // pscore has released the slices' owners (give every slice one).
  void SendAsync(int rank, int user_cmd, const std::string& handler, Payload payload, ReplyCallback cb);
  std::future<Result<BufferPtr>> Send(int rank, int user_cmd, BufferPtr payload);
  std::future<Result<BufferPtr>> Call(int rank, const std::string& handler, BufferPtr payload);
  // The same request to every server; all answers in rank order, or the first error.
  std::future<Result<std::vector<BufferPtr>>> Broadcast(int user_cmd, const std::string& handler, BufferPtr payload);

  // Push: lens[i] floats of values belong to keys[i] (lens empty: every key has
  // values.size()/keys.size()). Keys go to their owning servers; done when all answered.
  std::future<Status> Push(const std::vector<uint64_t>& keys, const std::vector<float>& values,
                           const std::vector<uint32_t>& lens = {});
  // From this many value bytes per key (on average) a copied Push is sent as ZPush's are,
  // head then values, so a server may fold the values into its store as they arrive
  // instead of receiving the whole message first. Smaller ones measured faster sent whole.
  static constexpr uint64_t kStreamedPushBytes = uint64_t{4} << 20;
  // Push of values the caller gives away (std::move, or a temporary): no copy is needed,
  // so it is ZPush of them (large values are written from the moved vector itself).
  std::future<Status> Push(const std::vector<uint64_t>& keys, std::vector<float>&& values,
                           const std::vector<uint32_t>& lens = {});
  // Push without copying the values (as ps-lite's ZPush): large values are written to the
  // sockets from *values itself, which the worker holds a reference to while it may still
  // read them. Do not change them before the future is ready; after an error, not before
  // values.use_count() is 1 again (a part may still be queued for writing). Otherwise like
  // Push. Values under core::kZeroCopyBytes per key on average are copied as Push does,
  // except in a job of one server: there the values are one range of *values, written
  // from there once they reach core::kZeroCopyBytes in all.
  std::future<Status> ZPush(const std::vector<uint64_t>& keys, std::shared_ptr<const std::vector<float>> values,
                            const std::vector<uint32_t>& lens = {});
  // ZPush of floats held by something other than a vector (a numpy array, a tensor):
  // `owner` keeps values[0, num_values) alive; the same rules as the ZPush above, with
  // owner.use_count() in place of values.use_count(). A null owner: copied, as Push does.
  std::future<Status> ZPush(const std::vector<uint64_t>& keys, const float* values, size_t num_values,
                            std::shared_ptr<const void> owner, const std::vector<uint32_t>& lens = {});
  std::future<Result<PullResult>> Pull(const std::vector<uint64_t>& keys);
  // Push ids chosen by the caller (docs/reliability.md, "Redoing a step"): pushes issued
  // after this call carry incarnation `incarnation` (non-zero) and, per server part in
  // server rank order, seqs next_seq, next_seq + 1, ... A restarted process that redoes a
  // push with the ids its predecessor used has every part a server applied already
  // acknowledged without applying it again. Any thread; ordered with the pushes it issues.
  void SetPushIds(uint64_t incarnation, uint64_t next_seq);
  // Pull without copying the values on the worker: the result points into the answers as
  // they were read from the sockets (a runtime can copy them once, straight to where they
  // are used, e.g. a device). Same errors as Pull; a pull issued after a push sees it.
  std::future<Result<PullView>> ZPull(const std::vector<uint64_t>& keys);
  // Pull straight into the caller's memory (dest_floats floats, back to back in key order;
  // *lens, when given, gets each key's float count): no result vector is allocated. The
  // values of an answer written from the store (64 KiB or more per key, docs/embedding.md)
  // are read from the socket straight into dest, with no copy on the worker, when their
  // place there is known: when all the keys live on one server, or when *lens already holds
  // one count per key on entry (the layout: e.g. from the last call with the same keys) and
  // each server's keys are consecutive in `keys` (keys in position order are:
  // core::SortKeysByPosition). A wrong layout costs a second pull, never a wrong result.
  // dest (and lens) must stay valid until the future is ready. kInvalidArgument when the
  // keys hold a different number of floats (dest is then left as it was, unless *lens held
  // a layout); after other errors dest may have been written in part.
  std::future<Status> PullInto(const std::vector<uint64_t>& keys, float* dest, size_t dest_floats,
                               std::vector<uint32_t>* lens = nullptr);
  // Pull, blocking the calling thread (never the loop's) until the values are here. When
  // every key lives on one server and this worker has no Push or Pull of its own in
  // flight, the request goes over a direct link that the calling thread writes and reads
  // itself (no hand-off to the loop thread and back: about the latency of a blocking
  // socket ping-pong). Otherwise, and whenever the direct way cannot answer (the link
  // fails, the keys moved in a scale), it is Pull(keys).get(). Same results and errors
  // as Pull; a Pull issued after a Push of this worker sees that Push either way.
  Result<PullResult> PullSync(const std::vector<uint64_t>& keys);
  // PullSync calls answered over a direct link (for tests and benchmarks).
  uint64_t direct_pulls() const { return direct_.pulls(); }
  // Answers whose values were read from the socket straight into a PullInto destination
  // or a Pull's result.
  uint64_t in_place_pulls() const { return in_place_pulls_.load(std::memory_order_relaxed); }
  // Push and pull parts sent through another server because this worker could not reach
  // their own (worker_relay.cc).
  uint64_t relayed_parts() const { return relayed_parts_.load(std::memory_order_relaxed); }
  void AppendRoleMetrics(MetricsText* m) const override;
  int server_count() const { return server_num(); }

 protected:
  void OnMetadataApplied() override;
  void OnStateApplied(pb::ClusterState state) override;
  void OnHoldReleased() override;  // parts held while the cluster scaled go out
  void OnScaleOutReady(const pb::SendMetadataMessage& md, std::function<void()> done) override;
  void OnScaleInStart(const pb::ScaleInMessage& msg, std::function<void()> done) override;
  // A server timed out by the scheduler: its link is closed (requests in flight on it are
  // retried under recovery_timeout instead of waiting out request_timeout).
  void OnClusterEvent(const pb::ClusterEventMessage& ev) override;
  void StopRole() override;  // closes PullSync's direct links

 private:
  using Held = std::pair<std::shared_ptr<KvRequest>, KvPart>;
  // One request to server `rank`; with a sink, the answer's values may arrive in it.
  void Issue(int rank, pb::MessageMeta meta, Payload payload, comm::AnswerSink sink, comm::ResponseCallback cb);
  // Loop thread. Zero `lost_after`: a dial gives up after connect_timeout and fails kTimeout.
  // Otherwise the dial gives up after `lost_after` and fails kUnavailable: a server the worker
  // cannot reach (a cut that drops its SYNs, a host that is down) is a lost server, retried
  // and routed around (docs/reliability.md), not a request timeout.
  void IssueOnLoop(int rank, pb::MessageMeta meta, Payload payload, comm::AnswerSink sink,
                   comm::ResponseCallback cb, Duration lost_after = Duration::zero());
  // A key-value part's request (loop thread): IssueOnLoop with lost_after DataDialTimeout().
  void IssuePart(int rank, pb::MessageMeta meta, Payload payload, comm::AnswerSink sink, comm::ResponseCallback cb);
  // min(connect_timeout, twice the heartbeat timeout): as long as a cut link stays open.
  Duration DataDialTimeout() const;
  KvCounters counters() const { return KvCounters{kv_in_flight_, copied_counter()}; }
  // Push and ZPush; `shared` (ZPush) owns values, which are then written without a copy.
  std::future<Status> StartPush(const std::vector<uint64_t>& keys, const float* values, size_t num_values,
                                const std::vector<uint32_t>& lens, std::shared_ptr<const void> shared);
  // Any thread: hands a pull (keys set) to the loop.
  void StartPull(std::shared_ptr<PullRequest> op);

  // Loop thread (worker_dispatch.cc). Sends a part of op to its owners, or holds it while
  // the cluster is scaling; parts refused as moved are held and re-sent under new metadata.
  void Dispatch(const std::shared_ptr<KvRequest>& op, KvPart part);
  // A push part encoded for another server count: split again for `servers`.
  void Resplit(const std::shared_ptr<KvRequest>& op, KvPart part, int servers);
  void SplitPull(const std::shared_ptr<KvRequest>& op, KvPart part, int servers);
  void Send(const std::shared_ptr<KvRequest>& op, KvPart part);
  // A pull part's request (its keys) and, where its values' place in dest is known, the
  // sink they are read into. `req` is the pull (op), kept alive while the request is
  // written from its keys.
  static Payload PullPayload(const std::shared_ptr<KvRequest>& req, const KvPart& part, comm::AnswerSink* sink);
  // A part sent again while its server is lost ends at its recovery deadline (a timer).
  void WatchRecovery(const std::shared_ptr<KvRequest>& op, const KvPart& part, const Status& last,
                     const std::shared_ptr<comm::TimerId>& timer);
  void OnPart(const std::shared_ptr<KvRequest>& op, KvPart part, Result<comm::Frame> r);
  // An answered pull part: its keys' floats located (or the pull sent again after a
  // wrong layout, or held behind an earlier push's re-send).
  void OnPullAnswer(const std::shared_ptr<KvRequest>& op, KvPart part, comm::Frame frame);
  void HoldForRetry(const std::shared_ptr<KvRequest>& op, KvPart part);
  void WatchHeld();
  void FailExpiredHeld();
  Status HeldTooLong() const;
  void ReleaseHeld();
  // A part whose server was lost: held to be sent again, or failed once it has been
  // retried for options_.recovery_timeout (then the status names the server and the tries).
  void RetryLost(const std::shared_ptr<KvRequest>& op, KvPart part, const Status& why);
  Status GaveUp(const KvPart& part) const;
  TimePoint HeldUntil(const KvRequest& op, const KvPart& part) const;
  std::string ServerName(int rank) const;  // "node id (address)" from the metadata
  bool AfterHeldPush(const KvRequest& op, const KvPart& part) const;

  void UpdateRoute();  // loop thread: where key ranges are read and written

  // Partial partitions (worker_relay.cc, loop thread; docs/reliability.md). A server whose
  // link from this worker was lost while the metadata still lists it live (the scheduler
  // hears it) is reached through another live server: every part for it goes that way, in
  // order, until a direct link opens again with none of them in flight.
  struct RelayRoute {
    int via = -1;                                            // the relaying server's rank
    std::string addr;                                        // the target's address then
    std::shared_ptr<int> in_flight = std::make_shared<int>(0);  // parts relayed, unanswered
    bool probing = false;                                    // a direct dial is under way
  };
  // The rank that relays parts for server `rank` now, or -1 (sent directly). A route whose
  // target has another address now, or is not live, or whose relay is not, ends here.
  int RelayFor(int rank);
  // Whether server `rank` may relay: live in the metadata, with an address, and not timed
  // out at the scheduler (whose time-out the metadata may not show yet).
  bool CanRelay(int rank) const;
  // The next server after rank `after` (wrapping) that can relay, not `target`; -1 when
  // there is none.
  int NextRelay(int target, int after) const;
  // A part for `part.target` failed with its link (`why`): with that server still live in
  // the metadata and no link to it open, its parts go through another live server from now
  // on (the next one, when the part had gone through one already).
  void RouteAround(const KvPart& part, const Status& why);
  // Every heartbeat interval while routes exist: a route whose target is gone from its rank
  // ends (RelayFor); one with nothing in flight pings its target on a direct link, and once
  // that answers, the route ends.
  void WatchRelays();
  void ProbeRelays();
  void OnProbed(int target, const std::string& addr, const Status& answered);
  std::map<int, RelayRoute> relays_;  // by target rank
  // Addresses of servers the scheduler timed out (NODE_TIMED_OUT, until NODE_RECOVERED or
  // NODE_RESTARTED): not routed around, their loss is the scheduler's to handle.
  std::set<std::string> timed_out_servers_;
  comm::TimerId relay_timer_ = 0;
  std::atomic<uint64_t> relayed_parts_{0};
  // Loop thread: the server rank that reads and writes key range `range` (its primary);
  // -1 when every replica of it is down.
  int Primary(int range) const;
  int replicas_ = 1;        // loop thread: the metadata's replicas
  std::vector<char> live_;  // loop thread: by server rank, whether it is a live replica

  // Push/Pull/PullInto calls not yet answered (shared with their requests, which count down).
  std::shared_ptr<std::atomic<int>> kv_in_flight_ = std::make_shared<std::atomic<int>>(0);
  std::atomic<uint64_t> in_place_pulls_{0};
  DirectPuller direct_;  // PullSync's direct way
  LearnedLens learned_;
  const std::shared_ptr<ScratchArrays> scratch_ = std::make_shared<ScratchArrays>();  // pulls' large arrays
  // Parts held for a re-send (loop thread).
  std::vector<Held> held_;
  // Issue order of pushes and pulls on the loop (loop thread): parts held for a re-send go
  // out again in it, and later ones wait behind them (a Pull after a Push sees it).
  uint64_t op_seq_ = 0;
  comm::TimerId retry_timer_ = 0;
  // Push ids (docs/reliability.md): this process's number, fresh per start, and the
  // sequence of push requests (loop thread); a part sent again keeps its id.
  uint64_t push_incarnation_;
  uint64_t push_seq_ = 0;
};

}  // namespace pscore::node
