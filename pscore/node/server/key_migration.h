// KeyMigration: moving the built-in store's entries to their new owners when the cluster
// scales out or in, and dropping the entries a stable view no longer gives this server.
//
// Protocol (docs/operations.md, Scaling): workers hold key-value traffic while the cluster
// scales. Each server switches its ownership view first (KeyOwnership::Switch), then sends
// the entries it no longer owns to their new owners (kMigrateHandler) with its push-id
// window (kMigrateWindowHandler), and answers *_DONE once all are stored. Requests for keys
// a server does not own under its view are refused with kAborted (nothing applied), and
// workers re-send them under the new metadata. Moved entries are erased only when the
// cluster is READY under the new view (DropNotHeld), so a rollback needs no copying back.
//
// Threads: what scans or rewrites the whole store runs on executor threads (the loop
// thread without an executor), each kind on its own lane in the order asked: the moves of
// a scale (switch, plan, encode) on the move lane, the drops on the drop lane. Entries
// that arrive while a drop is queued are stored after it, on the drop lane, so a drop
// computed for a view never erases what a later scale moved here. Sending runs on the loop
// thread; the handlers run where handlers run. State lives in KeyOwnership and
// ParamService. Owned by ServerNode.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/node/common/executor.h"
#include "pscore/node/server/data_handler.h"
#include "pscore/node/server/key_ownership.h"
#include "pscore/node/server/param_service.h"
#include "pscore/node/server/server_links.h"

namespace pscore::node {

class KeyMigration {
 public:
  // Executor affinities: the moves of a scale, and the drops (with the entries that arrive
  // while one is queued). Separate, so a drop waiting for a store stripe that a slow
  // update holds does not delay the next scale's switch; one lane when the executor has
  // one thread.
  static constexpr uint64_t kMoveLane = 0;
  static constexpr uint64_t kDropLane = 1;

  KeyMigration(std::string node_id, comm::EventLoop* loop, Executor* executor, comm::AliveToken::Watch alive,
               KeyOwnership* ownership, ParamService* params, ServerLinks* links);

  void HandleEntries(const DataRequest& req, Responder r);  // kMigrateHandler
  void HandleWindow(const DataRequest& req, Responder r);   // kMigrateWindowHandler
  // Scale-out: every new node is in (md is the complete new membership); done() once
  // this server's part is stored (any thread).
  void OnScaleOutReady(const pb::SendMetadataMessage& md, std::function<void()> done);
  // Scale-in started under the metadata `md`; msg names the leaving nodes.
  void OnScaleInStart(const pb::SendMetadataMessage& md, const pb::ScaleInMessage& msg,
                      std::function<void()> done);
  // Loop thread. Stable under the view (rank, n, replicas): the entries restored from the
  // journal are this server's, and entries moved away (or copied here by a rolled-back
  // operation) are no longer needed here. `changed`: the view changed. Drops them on the
  // drop lane, then calls dropped(how many keys) there.
  void DropNotHeld(int rank, int n, int replicas, bool changed, std::function<void(size_t)> dropped);

 private:
  // Encoded entries by destination rank, each payload at most kMigrateChunkBytes of values.
  using Batches = std::map<int, std::vector<BufferPtr>>;
  // Runs work on an executor lane (inline without an executor).
  void OnLane(uint64_t lane, std::function<void()> work);
  size_t Drop(int rank, int n, int replicas, bool changed);
  void StoreEntries(const DataRequest& req, const Responder& r);
  // Switches the view to (rank, n) and ships the entries it no longer owns to
  // dest_rank(new range) (a rank of the current metadata); done() once all are stored.
  void MoveKeys(int rank, int n, std::function<int(int)> dest_rank, std::function<void()> done);
  // Which keys go where after the switch from `old` to (rank, n), sorted per destination.
  std::map<int, std::vector<uint64_t>> PlanMoves(const KeyView& old, int rank, int n,
                                                 const std::function<int(int)>& dest_rank) const;
  // Encodes the planned keys straight from the store: one copy of their values.
  Result<Batches> Encode(const std::map<int, std::vector<uint64_t>>& plan) const;
  // Loop thread: sends the window, then the entries, to every destination; done() once
  // every one answered ok.
  void Send(Batches batches, BufferPtr window, std::function<void()> done);

  const std::string node_id_;
  comm::EventLoop* const loop_;
  Executor* const executor_;  // may be null
  const comm::AliveToken::Watch alive_;
  KeyOwnership* const ownership_;
  ParamService* const params_;
  ServerLinks* const links_;
  std::atomic<int> drops_queued_{0};  // drops asked for and not yet done
  // Entries were moved here since the last drop (or none ran yet): it must look.
  std::atomic<bool> maybe_stale_{true};
};

}  // namespace pscore::node
