// ReplicaResync: rebuilding a server that came back in a replicated job from its ranges'
// primaries while the job runs, both sides (replica_resync.cc states the protocol;
// docs/reliability.md, Resync). It reaches the primaries through ServerLinks, stores what
// it fetches through ParamService, and holds the pushes forwarded to it meanwhile
// (ReplicaGate). Owned by ServerNode.
//
// Threads: fetches, retries and the report run on the loop thread (they assert it); a
// snapshot is installed on an executor thread (or the loop's without one); the source's
// handler runs where handlers run. resync_mu_ guards the state below; it is taken after
// the ownership lock and before ParamService's journal lock.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/node/common/executor.h"
#include "pscore/node/server/data_handler.h"
#include "pscore/node/server/key_ownership.h"
#include "pscore/node/server/param_service.h"
#include "pscore/node/server/server_links.h"

namespace pscore::node {

class ReplicaResync : public ReplicaGate {
 public:
  struct Options {
    std::string node_id;
    uint64_t max_message_bytes = 0;  // a chunk is at most half of it
  };
  // report_done(cb) tells the scheduler this server is rebuilt (RESYNC_DONE), cb its answer.
  using ReportDone = std::function<void(std::function<void(const Status&)>)>;
  ReplicaResync(Options options, comm::EventLoop* loop, Executor* executor, comm::AliveToken::Watch alive,
                KeyOwnership* ownership, ParamService* params, ServerLinks* links, ReportDone report_done);

  // Source: a chunk of a range's snapshot for the resyncing server rank req.from_rank.
  void HandleFetch(const DataRequest& req, Responder r);
  // Target, the ownership lock held exclusively with the new view in place: starts,
  // redirects or ends this server's resync; returns the (range, source) fetches to start.
  std::vector<std::pair<int, int>> UpdateLocked(bool self_resyncing);
  void StartFetches(std::vector<std::pair<int, int>> fetches);  // loop thread
  std::optional<Status> HoldForResync(const DataRequest& req, const Responder& r) override;
  void Stop();  // loop thread: no retry or report starts any more

 private:
  // The range's entries and the push-id window, copied under the ownership lock held
  // exclusively; kUnavailable unless this server is the range's primary forwarding to
  // `from_rank`.
  Result<BufferPtr> EncodeRangeSnapshot(int range, int from_rank);
  bool ResyncCurrent(uint64_t generation);
  void FetchSnapshot(int range, int source, uint64_t generation, uint64_t offset, uint64_t token,
                     std::shared_ptr<std::string> got);  // loop thread
  void OnChunk(int range, int source, uint64_t generation, uint64_t offset, uint64_t token,
               std::shared_ptr<std::string> got, Result<comm::Frame> res);
  void RetryFetch(int range, uint64_t generation, const Status& why);  // loop thread
  void InstallSnapshot(int range, uint64_t generation, std::shared_ptr<std::string> bytes);
  void ReportResynced(uint64_t generation);  // loop thread
  bool HeldRangesPending(const DataRequest& req) const;  // resync_mu_ held

  const Options options_;
  comm::EventLoop* const loop_;
  Executor* const executor_;  // may be null
  const comm::AliveToken::Watch alive_;  // the owner's: closures posted for later check it
  KeyOwnership* const ownership_;
  ParamService* const params_;
  ServerLinks* const links_;
  const ReportDone report_done_;
  bool stopped_ = false;  // loop thread

  std::mutex resync_mu_;
  struct Snapshot {
    uint64_t token = 0;
    BufferPtr bytes;
  };
  // Source: encoded snapshots being fetched, by (asking rank, range); one each.
  std::map<std::pair<int, int>, Snapshot> snapshots_;
  uint64_t next_snapshot_token_ = 1;
  struct Resync {
    bool active = false;
    uint64_t generation = 0;  // bumped when fetches restart (sources changed)
    int n = 0;                // server count of the view the ranges are of
    std::set<int> pending;    // ranges not installed yet
    std::map<int, int> sources;  // range -> the primary it is fetched from
    std::vector<std::pair<DataRequest, Responder>> held;  // forwarded pushes of pending ranges
    uint64_t held_bytes = 0;
  };
  Resync resync_;  // target
};

}  // namespace pscore::node
