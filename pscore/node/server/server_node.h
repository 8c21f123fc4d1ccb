// ServerNode: a parameter server. Serves SEND_DATA requests from workers through
// handlers registered by user_cmd or by name, hosts the built-in parameter store
// (Push/Pull), and exchanges COLLECTIVE_SEND_DATA with other servers by rank and tag.
// Handlers run on the executor (options.handler_threads > 0) or the loop thread, and
// answer through a Responder that may be completed from any thread.
#pragma once

#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "pscore/core/kv_codec.h"
#include "pscore/core/param_journal.h"
#include "pscore/core/param_store.h"
#include "pscore/core/push_dedup.h"
#include "pscore/node/common/executor.h"
#include "pscore/node/common/node.h"
#include "pscore/node/server/server_journal.h"

namespace pscore::node {

struct DataRequest {
  pb::NodeRole from_role = pb::WORKER;
  int from_rank = -1;
  int user_cmd = 0;
  std::string handler;  // empty when addressed by user_cmd
  BufferPtr payload;    // may be null (empty request)
  std::optional<core::PushId> push_id;  // a built-in push's id, as the wire gave it (unchecked)
};

// Answers one request exactly once; copyable handle, any thread. Dropping every copy
// without answering answers kInternal "handler did not answer".
class Responder {
 public:
  // The answer's bytes: a Buffer, or a head with zero-copy tail slices (pscore/core/buffer.h)
  // whose owners keep the memory alive and unchanged until the answer is written.
  void Reply(Payload payload = nullptr) const;
  void Fail(const Status& status) const;

 private:
  friend class ServerNode;
  struct State;
  std::shared_ptr<State> state_;
};

using DataHandler = std::function<void(const DataRequest&, Responder)>;

// Reserved handler names of the built-in parameter store (kPushHandler, kPullHandler) are
// in wire.h: workers send them.
inline constexpr char kMigrateHandler[] = "pscore.migrate";  // server to server, during scaling
// During scaling, with the entries: the sender's push-id window, merged by the receiver.
inline constexpr char kMigrateWindowHandler[] = "pscore.migrate_window";
// A push forwarded by its range's primary to a backup (same payload and push id).
inline constexpr char kReplicateHandler[] = "pscore.replicate";
// A resyncing server fetches a chunk of a range's snapshot from the range's primary.
inline constexpr char kResyncHandler[] = "pscore.resync";

class ServerNode : public Node {
 public:
  ServerNode(NodeOptions options, core::ParamStore::Options store = {}, comm::EventLoop* loop = nullptr);
  ~ServerNode() override;

  // Register before Start. Names starting with "pscore." are reserved.
  void RegisterHandler(int user_cmd, DataHandler handler);
  void RegisterHandler(const std::string& name, DataHandler handler);
  core::ParamStore& store() { return store_; }
  // Built-in pushes folded into the store while their values arrived (any thread).
  uint64_t streamed_pushes() const { return streamed_pushes_.load(std::memory_order_relaxed); }
  // Whether a journal compaction is being written or waits to be ended (tests).
  bool journal_compacting();
  // Which pushes with an id were applied (pscore/core/push_dedup.h), and how many pushes came
  // again after they were applied and were acknowledged without being applied (any thread).
  const core::PushDedup& push_window() const { return dedup_; }
  uint64_t repeated_pushes() const { return repeated_pushes_.load(std::memory_order_relaxed); }

  // Server-to-server messages matched by (sender rank, tag), whatever the arrival order.
  std::future<Status> CollectiveSend(int rank, const std::string& tag, BufferPtr payload);
  std::future<Result<BufferPtr>> CollectiveRecv(int rank, const std::string& tag);
  // Element-wise sum of `data` over all servers (same length everywhere); `tag` names
  // the round and must be unique per call. Blocking; not on the loop thread.
  Status AllReduce(const std::string& tag, std::vector<float>* data, Duration timeout);

 protected:
  Status StartRole() override;
  void OnPeerRequest(comm::ConnId conn, comm::Frame&& frame) override;
  void StopRole() override;
  void OnStopCalled() override;  // from a handler: its executor thread is not waited for
  void OnPeerClosed(comm::ConnId conn, const Status& why) override;
  std::shared_ptr<comm::TailStream> OnRequestStream(comm::ConnId conn, const pb::MessageMeta& meta,
                                                    uint64_t tail) override;
  void OnMetadataApplied() override;
  void OnStateApplied(pb::ClusterState state) override;
  void OnClusterEvent(const pb::ClusterEventMessage& ev) override;
  void OnScaleOutReady(const pb::SendMetadataMessage& md, std::function<void()> done) override;
  void OnScaleInStart(const pb::ScaleInMessage& msg, std::function<void()> done) override;

 private:
  // Answers the receives waiting on `rank` (all ranks of at least `rank` when `and_above`).
  void FailReceives(int rank, bool and_above, const Status& why);
  void Dispatch(comm::ConnId conn, comm::Frame&& frame);
  // A push from a worker (applied here as the keys' primary and forwarded to the live
  // backups, answered once all applied it), or forwarded by a primary (`replica`).
  void HandlePush(const DataRequest& req, Responder r, bool replica);
  // Sends the push to the server ranks `backups` (kReplicateHandler, same push id) and
  // returns the callback through which this server reports its own apply (once): r is
  // answered ok when that and every backup's apply are, or fails at the first that is not
  // (a backup's as kUnavailable). Any thread.
  std::function<void(const Status&)> Replicate(const DataRequest& req, std::vector<int> backups, Responder r);
  // Commits a push whose values were folded in as they arrived (PushTail), and answers.
  void CommitStreamedPush(comm::ConnId conn, comm::Frame&& frame);
  class PushTail;
  void HandlePull(const DataRequest& req, Responder r);
  void HandleCollective(comm::ConnId conn, comm::Frame&& frame);
  void HandleHello(comm::ConnId conn, const comm::Frame& frame);
  // A HELLO from a node this server's metadata does not list yet (the scheduler's
  // broadcast may reach the peer first): its link is held, frames queued, until the
  // metadata lists it (then they are served in order) or the hold ends (then refused).
  void HoldHello(comm::ConnId conn, const pb::MessageMeta& hello_meta, const std::string& node_id);
  void RecheckHeldHellos();
  void RefuseHeld(comm::ConnId conn, const Status& why);
  struct HeldHello;
  // Removes conn's held HELLO (its timer cancelled) and returns it; nullopt if none.
  std::optional<HeldHello> TakeHeld(comm::ConnId conn);
  bool IsMemberId(const std::string& node_id) const;
  // Rebuilds member_ids_ from the metadata just applied (loop thread).
  void RefreshMemberIds();
  // Refuses (and closes) a data request from a connection that did not identify itself
  // as a member of the job; true when the request may be served.
  bool CheckMember(comm::ConnId conn, const pb::MessageMeta& meta);
  void HandleMigrate(const DataRequest& req, Responder r);
  // Outside a scale operation, serve the key range of the current metadata.
  void RefreshView();
  // Which keys this server serves: those whose range (ServerForKey(key, view_n_)) it is
  // the primary of (`as_primary`), or whose range's replica chain it is in (a forwarded
  // push; also a range it held under the view before a scale's switch, until READY). With
  // one replica both are ServerForKey(key, view_n_) == view_rank_. When `backups` is given,
  // it gets the live replicas of the keys' ranges other than this one.
  Status CheckOwned(const uint64_t* keys, size_t n, bool as_primary = true,
                    std::vector<int>* backups = nullptr) const;  // view_mu_ held (shared)
  bool HeldBeforeSwitch(uint64_t key) const;  // view_mu_ held (shared)
  // Switches the view to (rank, n) and ships the entries it no longer owns to
  // dest_rank(new owner) (a rank of the current metadata); done() once all are stored.
  void MoveKeys(int rank, int n, std::function<int(int)> dest_rank, std::function<void()> done);
  void SendEntries(std::vector<std::pair<uint64_t, std::vector<float>>> entries, std::function<int(int)> dest_rank,
                   int n, std::function<void()> done);
  // Sends `window` (PushDedup::Encode) to each of `ranks` (kMigrateWindowHandler); done()
  // once every one merged it. Loop thread.
  void SendWindow(BufferPtr window, const std::set<int>& ranks, std::function<void()> done);
  Responder MakeResponder(comm::ConnId conn, const pb::MessageMeta& meta);
  // A built-in push of at most 16 KiB (not journaled), or a pull asking for at most 16 KiB
  // of values or for at most 16 keys answered without a copy (>= core::kZeroCopyBytes each
  // on average): quick enough for the loop thread.
  bool SmallBuiltin(const pb::MessageMeta& meta, const BufferPtr& payload) const;

  // Applies one store change, journaled first when options_.data_dir is set (the journal
  // lock orders records as the changes are applied). An append error is returned and
  // nothing is applied.
  Status Journaled(core::JournalOp op, std::string_view body, const std::function<Status()>& apply);
  // The same with the record's head (header, and for kPushId the id) made by the caller.
  Status JournaledRecord(const std::string& head, std::string_view body, const std::function<Status()>& apply);
  // A push with an id: nullopt when it is new (claimed: apply it, then end the claim),
  // otherwise the answer to give without applying it (ok: it was applied already).
  std::optional<Status> ClaimPush(const core::PushId& id);
  // ---- resync (server_resync.cc; docs/reliability.md) ----
  // Source: a chunk of a range's snapshot for the resyncing server rank req.from_rank.
  void HandleResyncFetch(const DataRequest& req, Responder r);
  // The range's entries and the push-id window, copied under view_mu_ held exclusively;
  // kUnavailable unless this server is the range's primary forwarding to `from_rank`.
  Result<BufferPtr> EncodeRangeSnapshot(int range, int from_rank);
  // Target, view_mu_ held exclusively with the new view in place: starts, redirects or ends
  // this server's resync; returns the (range, source) fetches to start.
  std::vector<std::pair<int, int>> UpdateResyncLocked(bool self_resyncing);
  void StartFetches(std::vector<std::pair<int, int>> fetches);  // loop thread
  bool ResyncCurrent(uint64_t generation);
  void FetchSnapshot(int range, int source, uint64_t generation, uint64_t offset, uint64_t token,
                     std::shared_ptr<std::string> got);  // loop thread
  void OnChunk(int range, int source, uint64_t generation, uint64_t offset, uint64_t token,
               std::shared_ptr<std::string> got, Result<comm::Frame> res);
  void RetryFetch(int range, uint64_t generation, const Status& why);  // loop thread
  void InstallSnapshot(int range, uint64_t generation, std::shared_ptr<std::string> bytes);
  void ReportResynced(uint64_t generation);  // loop thread
  // A forwarded push with a key of a range still being copied: held (its answer Ok here
  // means held, answered once applied); nullopt when it is to be applied now; else refused.
  std::optional<Status> HoldForResync(const DataRequest& req, const Responder& r);
  bool HeldRangesPending(const DataRequest& req) const;  // resync_mu_ held
  // Stores the entries of a migration or a snapshot (journaled as kInsert).
  Status InsertEntries(std::string_view body, const core::KvView& view);

  // A server joining a scale-out as a new member: drops the restored entries no
  // migration has overwritten (they belong to an earlier membership); returns how many.
  size_t DropUnconfirmedRestored();

  core::ParamStore store_;
  // Applied push ids. With a journal, a push's id is recorded with it and the window
  // enters the dedup window under journal_mu_, so a compaction sees both or neither.
  core::PushDedup dedup_;
  std::atomic<uint64_t> repeated_pushes_{0};
  std::atomic<uint64_t> streamed_pushes_{0};
  std::unique_ptr<ServerJournal> journal_;
  std::mutex journal_mu_;
  // Keys restored from the journal and not yet confirmed: by a view of this server as a
  // member (RefreshView) or by a migration overwriting them (guarded by journal_mu_).
  std::unordered_set<uint64_t> restored_unconfirmed_;
  std::unique_ptr<Executor> executor_;
  // Per link: closures submitted to the executor and not yet finished (the map is loop
  // state; the count is decremented by the executor thread when a closure ends). A small
  // built-in request on a link with none runs at once on the loop thread: ordering per
  // link is kept, and two thread hand-offs are saved.
  std::unordered_map<comm::ConnId, std::shared_ptr<std::atomic<int>>> in_executor_;
  std::unordered_map<int, DataHandler> by_cmd_;
  std::unordered_map<std::string, DataHandler> by_name_;
  // Collective mailbox (loop thread): arrived payloads and waiting receivers.
  std::map<std::pair<int, std::string>, BufferPtr> arrived_;
  std::map<std::pair<int, std::string>, std::shared_ptr<std::promise<Result<BufferPtr>>>> waiting_;
  // Server ranks the scheduler has declared timed out, and why: a receive from one fails
  // at once (unless its message arrived before). Cleared when the rank recovers or
  // restarts, or when the view changes (ranks are then numbered anew).
  std::map<int, Status> gone_ranks_;
  int mailbox_servers_ = 0;  // the server count of the last stable view the mailbox saw
  std::shared_ptr<ServerNode*> alive_;
  std::unordered_map<comm::ConnId, std::string> members_;  // identified peer links (loop thread)
  // Node ids of every member in the current metadata (loop thread): one lookup per HELLO.
  std::unordered_set<std::string> member_ids_;
  struct HeldHello {
    std::string node_id;
    pb::MessageMeta hello_meta;  // answered (when it asked for an answer) once decided
    comm::TimerId timer = 0;
    std::vector<comm::Frame> queued;
    uint64_t queued_bytes = 0;
  };
  std::unordered_map<comm::ConnId, HeldHello> held_;  // loop thread
  mutable std::shared_mutex view_mu_;
  int view_rank_ = -1;
  int view_n_ = 0;
  int view_replicas_ = 1;        // copies of each range (the metadata's replicas)
  std::vector<char> view_live_;  // by server rank: a live replica (the metadata's is_alive)
  std::vector<char> view_resyncing_;  // by server rank: being rebuilt (forwarded to, not read)
  // With replicas: the view this server held before it switched for a scale, kept until
  // the cluster is READY again (prev_view_n_ 0: none). A primary that has not switched yet
  // applies a worker's push under that view and forwards it here: it is applied (the
  // primary's migration sends its entries to the new chain after the forward, on the same
  // link), so the push is acknowledged once, not refused and sent again under new ids.
  int prev_view_rank_ = -1;
  int prev_view_n_ = 0;
  int prev_view_replicas_ = 1;

  // Resync state, both roles (resync_mu_; taken after view_mu_, before journal_mu_).
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
