// ParamService: the built-in parameter store of a server and what makes it exactly-once
// and durable: pushes (whole, or folded in as their values arrive), pulls, the push-id
// window that applies a push sent again at most once, forwarding a push to the backups of
// its range, and the journal on disk (--data_dir). It knows the keys this server serves
// through KeyOwnership, the other servers through ServerLinks, and a range being rebuilt
// here through ReplicaGate.
//
// Threads: the handlers (HandlePush, HandlePull) run on the executor's threads or the loop
// thread; the store and the push-id window are thread-safe on their own; journal_mu_
// orders journal records with the store changes they describe. Lock order: the ownership
// lock, then the resync lock (ReplicaGate), then journal_mu_. Owned by ServerNode.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/frame_decoder.h"
#include "pscore/core/kv_codec.h"
#include "pscore/core/param_journal.h"
#include "pscore/core/param_store.h"
#include "pscore/core/push_dedup.h"
#include "pscore/node/server/data_handler.h"
#include "pscore/node/server/key_ownership.h"
#include "pscore/node/server/server_journal.h"
#include "pscore/node/server/server_links.h"

namespace pscore::node {

// Where forwarded pushes of a range still being copied here wait (ReplicaResync).
class ReplicaGate {
 public:
  virtual ~ReplicaGate() = default;
  // Called with the ownership lock held (shared). A forwarded push with a key of a range
  // still being copied: held (Ok: it is answered once applied); nullopt when it is to be
  // applied now; otherwise refused with the status.
  virtual std::optional<Status> HoldForResync(const DataRequest& req, const Responder& r) = 0;
};

class ParamService {
 public:
  struct Options {
    std::string node_id;   // for logs and errors
    std::string data_dir;  // the journal's directory ("": none)
    uint64_t journal_compact_bytes = 0;
    uint64_t max_message_bytes = 0;  // a pull's answer above it is refused
  };
  ParamService(Options options, core::ParamStore::Options store, comm::EventLoop* loop, KeyOwnership* ownership,
               ServerLinks* links, std::shared_ptr<std::atomic<uint64_t>> copied);
  void set_gate(ReplicaGate* gate) { gate_ = gate; }  // before the first request
  // Called (on the thread that journals, any) with each change the journal refused; set
  // before the first request.
  void set_on_journal_error(std::function<void(const Status&)> fn) { on_journal_error_ = std::move(fn); }

  // Opens the journal, when there is a data_dir, and restores what it holds.
  Status Open();
  // No handler runs any more: a compaction still being written ends here.
  void Stop();

  core::ParamStore& store() { return store_; }
  const core::ParamStore& store() const { return store_; }
  core::PushDedup& dedup() { return dedup_; }
  const core::PushDedup& dedup() const { return dedup_; }
  uint64_t repeated_pushes() const { return repeated_pushes_.load(std::memory_order_relaxed); }
  uint64_t streamed_pushes() const { return streamed_pushes_.load(std::memory_order_relaxed); }
  // Changes the journal could not write (a full disk, a file size limit): each refused.
  uint64_t journal_errors() const { return journal_errors_.load(std::memory_order_relaxed); }
  bool journaled() const { return journal_ != nullptr; }
  bool journal_compacting();

  // A push from a worker (applied here as the keys' primary and forwarded to the live
  // backups, answered once all applied it), or forwarded by a primary (`replica`).
  void HandlePush(const DataRequest& req, Responder r, bool replica);
  void HandlePull(const DataRequest& req, Responder r);
  // A built-in push of at most 16 KiB (not journaled), or a pull asking for at most 16 KiB
  // of values or for at most 16 keys answered without a copy (>= core::kZeroCopyBytes each
  // on average): quick enough for the loop thread.
  bool SmallBuiltin(const pb::MessageMeta& meta, const BufferPtr& payload) const;
  // Loop thread: a stream that folds a large push's values into the store as they arrive.
  std::shared_ptr<comm::TailStream> NewPushTail();
  // Loop thread: commits a push whose values were folded in as they arrived; the answer.
  Status CommitStreamedPush(comm::Frame& frame);

  // Applies one store change, journaled first when there is a journal (journal_mu_ orders
  // records as the changes are applied). An append error is returned and nothing applied.
  Status Journaled(core::JournalOp op, std::string_view body, const std::function<Status()>& apply);
  // Stores the entries of a migration or a snapshot (journaled as kInsert).
  Status InsertEntries(std::string_view body, const core::KvView& view);
  // The keys restored from the journal belong to this server (it is a member of the view).
  void ConfirmRestored();
  // A server joining a scale-out as a new member: drops the restored entries no
  // migration has overwritten (they belong to an earlier membership); returns how many.
  // A journal that refuses the drop is reported as any refused change is.
  size_t DropUnconfirmedRestored();

 private:
  class PushTail;
  // A pull answer's bytes: `floats` values, the keys unless `keys` leaves them out, and a
  // length per key unless the keys are left out of a `uniform` answer (one row length
  // stands for the lengths then).
  static uint64_t AnswerBytes(size_t num_keys, uint64_t floats, core::Keys keys, bool uniform);
  // Whether a copied answer to `request` writes its keys.
  static core::Keys AnswerKeys(const core::KvView& request);
  // A pull answer made in one walk when all keys hold as many floats as the first; null
  // when HandlePull's two steps must serve (param_service.cc).
  Result<BufferPtr> PullUniform(const core::KvView& view) const;
  // The same as Journaled with the record's head (header, and for kPushId the id) made.
  Status JournaledRecord(const std::string& head, std::string_view body, const std::function<Status()>& apply);
  // A push with an id: nullopt when it is new (claimed: apply it, then end the claim),
  // otherwise the answer to give without applying it (ok: it was applied already).
  std::optional<Status> ClaimPush(const core::PushId& id);
  // journal_mu_ held: writes the drop of stale restored entries the journal refused before.
  Status AppendPendingDropLocked();
  // Sends the push to the server ranks `backups` (kReplicateHandler, same push id) and
  // returns the callback through which this server reports its own apply (once): r is
  // answered ok when that and every backup's apply are, or fails at the first that is not
  // (a backup's as kUnavailable). Any thread.
  std::function<void(const Status&)> Replicate(const DataRequest& req, std::vector<int> backups, Responder r);

  const Options options_;
  comm::EventLoop* const loop_;
  KeyOwnership* const ownership_;
  ServerLinks* const links_;
  ReplicaGate* gate_ = nullptr;
  const std::shared_ptr<std::atomic<uint64_t>> copied_;  // the node's copied-bytes count
  core::ParamStore store_;
  // Applied push ids. With a journal, a push's id is recorded with it and the window
  // enters the dedup window under journal_mu_, so a compaction sees both or neither.
  core::PushDedup dedup_;
  std::atomic<uint64_t> repeated_pushes_{0};
  std::atomic<uint64_t> streamed_pushes_{0};
  std::atomic<uint64_t> journal_errors_{0};
  std::function<void(const Status&)> on_journal_error_;
  std::unique_ptr<ServerJournal> journal_;
  std::mutex journal_mu_;
  // Keys restored from the journal and not yet confirmed: by a view of this server as a
  // member or by a migration overwriting them (guarded by journal_mu_).
  std::unordered_set<uint64_t> restored_unconfirmed_;
  std::vector<uint64_t> pending_drop_;  // journal_mu_: dropped from the store, not yet journaled
};

}  // namespace pscore::node
