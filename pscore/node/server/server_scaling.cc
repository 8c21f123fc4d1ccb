// ServerNode, scaling half: which keys this server owns, and moving the built-in
// parameter store's entries to their new owners during scale-out and scale-in.
//
// Protocol (see docs/operations.md, Scaling): workers hold key-value traffic while the cluster
// scales. Each server switches its ownership view first, then copies the entries it
// no longer owns to their new owners (kMigrateHandler) and answers *_DONE once all are
// stored. Requests for keys a server does not own under its view are refused with
// kAborted (nothing applied), and workers re-send them under the new metadata. Moved
// entries are erased only when the cluster is READY under the new view, so a rollback
// needs no copying back.
#include <algorithm>
#include <atomic>
#include <set>

#include "pscore/core/key_range.h"
#include "pscore/core/kv_codec.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {

using comm::ConnId;
using comm::Frame;

namespace {
constexpr size_t kMigrateChunkBytes = 32u << 20;

// Copies of the entries whose range `rank` is the primary of under (n, replicas, live).
std::vector<std::pair<uint64_t, std::vector<float>>> EntriesPrimaryOf(const core::ParamStore& store, int rank, int n,
                                                                      int replicas, const std::vector<char>& live) {
  std::vector<uint64_t> keys;
  for (uint64_t key : store.Keys()) {
    if (core::PrimaryOf(core::ServerForKey(key, n), n, replicas, live) == rank) keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end());
  std::vector<std::pair<uint64_t, std::vector<float>>> out;
  out.reserve(keys.size());
  for (uint64_t key : keys) {
    uint32_t len = 0;
    if (!store.Lens(&key, 1, &len).ok()) continue;
    std::vector<float> values(len);
    if (!store.CopyValues(&key, 1, &len, values.data()).ok()) continue;
    out.emplace_back(key, std::move(values));
  }
  return out;
}
}  // namespace

Status ServerNode::CheckOwned(const uint64_t* keys, size_t n, bool as_primary, std::vector<int>* backups) const {
  if (view_n_ <= 0) return Status(Code::kAborted, "server " + options_.node_id + " owns no keys yet");
  if (view_replicas_ <= 1) {
    for (size_t i = 0; i < n; ++i) {
      int owner = core::ServerForKey(keys[i], view_n_);
      if (owner != view_rank_) {
        return Status(Code::kAborted, "key " + std::to_string(keys[i]) + " is owned by server rank " +
                                          std::to_string(owner) + " of " + std::to_string(view_n_) +
                                          ", not " + std::to_string(view_rank_));
      }
    }
    return Status::Ok();
  }
  int last_range = -1;
  for (size_t i = 0; i < n; ++i) {
    const int range = core::ServerForKey(keys[i], view_n_);
    if (range == last_range) continue;
    last_range = range;
    const int primary = core::PrimaryOf(range, view_n_, view_replicas_, view_live_);
    const bool ok = as_primary ? primary == view_rank_ : core::HoldsRange(view_rank_, range, view_n_, view_replicas_);
    if (!ok && !as_primary && HeldBeforeSwitch(keys[i])) {
      last_range = -1;  // the next key's range is another question under this view
      continue;
    }
    if (!ok) {
      // kAborted: nothing applied; the worker sends it again under newer metadata.
      return Status(Code::kAborted, "key " + std::to_string(keys[i]) + " is of range " + std::to_string(range) + "/" +
                                        std::to_string(view_n_) + ", whose primary is server rank " +
                                        std::to_string(primary) + ", not " + std::to_string(view_rank_) +
                                        (as_primary ? "" : " (nor is it a replica)"));
    }
    if (backups == nullptr) continue;
    for (int rank : core::ReplicaChain(range, view_n_, view_replicas_)) {
      // A resyncing replica gets the range's pushes too: its copy is being rebuilt.
      const size_t at = static_cast<size_t>(rank);
      const bool live = at >= view_live_.size() || view_live_[at] ||
                        (at < view_resyncing_.size() && view_resyncing_[at]);
      if (rank != view_rank_ && live && std::find(backups->begin(), backups->end(), rank) == backups->end()) {
        backups->push_back(rank);
      }
    }
  }
  return Status::Ok();
}

bool ServerNode::HeldBeforeSwitch(uint64_t key) const {
  if (prev_view_n_ <= 0 || prev_view_rank_ < 0 || prev_view_replicas_ <= 1) return false;
  return core::HoldsRange(prev_view_rank_, core::ServerForKey(key, prev_view_n_), prev_view_n_, prev_view_replicas_);
}

void ServerNode::HandleMigrate(const DataRequest& req, Responder r) {
  const char* data = req.payload ? req.payload->data() : "";
  size_t size = req.payload ? req.payload->size() : 0;
  Result<core::KvView> view = core::DecodeKvPairs(data, size, /*expect_values=*/true);
  if (!view.ok()) return r.Fail(view.status());
  Status st = InsertEntries(std::string_view(data, size), *view);
  if (!st.ok()) return r.Fail(st);
  r.Reply(nullptr);
}

void ServerNode::OnMetadataApplied() {
  RefreshMemberIds();
  RefreshView();
  RecheckHeldHellos();
}

void ServerNode::OnStateApplied(pb::ClusterState) { RefreshView(); }

void ServerNode::RefreshView() {
  pb::SendMetadataMessage md = metadata();
  pb::ClusterState s = cluster_state();
  if (s == pb::CLUSTER_SCALE_OUT || s == pb::CLUSTER_SCALE_IN || s == pb::ClUSTER_STARTING) return;
  int rank = md.rank_id();
  int n = md.server_num();
  const int replicas = std::max(1, md.replicas());
  // Which servers hold their ranges' copies: not those timed out or back after a loss.
  std::vector<char> live(static_cast<size_t>(std::max(n, 0)), 1);
  std::vector<char> resyncing(static_cast<size_t>(std::max(n, 0)), 0);
  bool self_resyncing = false;
  for (const pb::ServersMeta& s : md.servers_meta()) {
    if (s.role() != pb::SERVER || s.rank_id() < 0 || s.rank_id() >= n) continue;
    live[s.rank_id()] = s.is_alive() ? 1 : 0;
    resyncing[s.rank_id()] = replicas >= 2 && s.resyncing() ? 1 : 0;
    if (s.node_id() == options_.node_id) self_resyncing = resyncing[s.rank_id()] != 0;
  }
  bool changed;
  std::vector<std::pair<int, int>> fetches;
  {
    std::unique_lock<std::shared_mutex> lock(view_mu_);
    // A scale's switch (prev_view_n_ set) counts: ranges held before it are dropped now.
    changed = view_rank_ != rank || view_n_ != n || view_live_ != live || view_resyncing_ != resyncing ||
              prev_view_n_ > 0;
    prev_view_n_ = 0;  // READY under this view: no primary applies under an older one
    view_rank_ = rank;
    view_n_ = n;
    view_replicas_ = replicas;
    view_live_ = std::move(live);
    view_resyncing_ = std::move(resyncing);
    fetches = UpdateResyncLocked(self_resyncing);
  }
  if (!fetches.empty()) StartFetches(std::move(fetches));
  if (n != mailbox_servers_) {
    // Ranks are numbered anew: a timed-out rank may be a live server now, and a receive
    // from a rank the cluster no longer has would wait for nothing.
    gone_ranks_.clear();
    FailReceives(n, /*and_above=*/true,
                 Status(Code::kUnavailable, "the cluster has " + std::to_string(n) +
                                                " servers now: no message will come from that rank"));
    mailbox_servers_ = n;
  }
  if (journal_) {
    std::lock_guard<std::mutex> lock(journal_mu_);
    restored_unconfirmed_.clear();  // this server is a member with this view: they are its own
  }
  // Stable under this view: entries moved away (or copied here by a rolled-back
  // operation) are no longer needed here.
  size_t dropped = 0;
  if (replicas <= 1 && store_.HasNotOwned(rank, n)) {
    Status st = Journaled(core::JournalOp::kDrop, core::EncodeJournalDrop(rank, n), [&] {
      dropped = store_.ExtractNotOwned(rank, n, /*erase=*/true).size();
      return Status::Ok();
    });
    if (!st.ok()) LOG(ERROR) << "server " << options_.node_id << ": entries owned elsewhere kept: " << st;
  } else if (replicas > 1 && changed && rank >= 0) {
    // With replicas this server holds the ranges of its chains; after a scale some of its
    // entries may be of ranges it no longer holds.
    std::vector<uint64_t> gone;
    for (uint64_t key : store_.Keys()) {
      if (!core::HoldsRange(rank, core::ServerForKey(key, n), n, replicas)) gone.push_back(key);
    }
    if (!gone.empty()) {
      Status st = Journaled(core::JournalOp::kDropKeys, core::EncodeJournalDropKeys(gone), [&] {
        dropped = store_.Erase(gone.data(), gone.size());
        return Status::Ok();
      });
      if (!st.ok()) LOG(ERROR) << "server " << options_.node_id << ": entries held elsewhere kept: " << st;
    }
  }
  if (changed || dropped > 0) {
    LOG(INFO) << "server " << options_.node_id << " serves key range " << rank << "/" << n
              << (replicas > 1 ? " (replicas " + std::to_string(replicas) + ")" : "")
              << (dropped ? " (dropped " + std::to_string(dropped) + " keys owned elsewhere)" : "");
  }
}

void ServerNode::OnScaleOutReady(const pb::SendMetadataMessage& md, std::function<void()> done) {
  bool old_member;
  {
    std::shared_lock<std::shared_mutex> lock(view_mu_);
    old_member = view_n_ > 0;
  }
  const int old_n = md.scale_out_old_server_num();
  if (!old_member && old_n > 0 && old_n < md.server_num() && md.rank_id() >= 0 && md.rank_id() < old_n &&
      md.replicas() <= 1) {
    // A member of the old membership restarted (from its --data_dir) while the scale-out
    // ran: what it restored is its old range, and it moves what it no longer owns as the
    // other old servers do (a copy they already received is overwritten with the same
    // values: workers push nothing until READY).
    {
      std::unique_lock<std::shared_mutex> lock(view_mu_);
      view_rank_ = md.rank_id();
      view_n_ = old_n;
      view_replicas_ = 1;
    }
    if (journal_) {
      std::lock_guard<std::mutex> lock(journal_mu_);
      restored_unconfirmed_.clear();
    }
    LOG(INFO) << "server " << options_.node_id << " restarted during a scale-out: serves its old key range "
              << md.rank_id() << "/" << old_n << " and moves what it no longer owns";
    old_member = true;
  }
  if (!old_member) {
    // A new server: it receives entries (some may have arrived already); workers send
    // nothing until READY. Entries it restored from a journal of an earlier membership
    // and no owner has sent again are stale.
    if (size_t stale = DropUnconfirmedRestored(); stale > 0) {
      LOG(WARNING) << "server " << options_.node_id << " joins as a new server: dropped " << stale
                   << " keys restored from an earlier membership";
    }
    std::unique_lock<std::shared_mutex> lock(view_mu_);
    view_rank_ = md.rank_id();
    view_n_ = md.server_num();
    lock.unlock();
    done();
    return;
  }
  // Scale-out keeps existing ranks: the new owner's rank is its rank in md.
  MoveKeys(md.rank_id(), md.server_num(), [](int r) { return r; }, std::move(done));
}

size_t ServerNode::DropUnconfirmedRestored() {
  if (!journal_) return 0;
  std::lock_guard<std::mutex> lock(journal_mu_);
  if (restored_unconfirmed_.empty()) return 0;
  std::vector<uint64_t> keys(restored_unconfirmed_.begin(), restored_unconfirmed_.end());
  restored_unconfirmed_.clear();
  Status logged = journal_->Append(core::JournalOp::kDropKeys, core::EncodeJournalDropKeys(keys));
  if (!logged.ok()) {
    LOG(ERROR) << "server " << options_.node_id << ": stale restored entries kept: " << logged;
    return 0;
  }
  size_t dropped = store_.Erase(keys.data(), keys.size());
  journal_->MaybeCompact(/*may_wait=*/!loop()->InLoopThread());
  return dropped;
}

void ServerNode::OnScaleInStart(const pb::ScaleInMessage& msg, std::function<void()> done) {
  pb::SendMetadataMessage md = metadata();
  std::set<std::string> leaving(msg.leaving_node_ids().begin(), msg.leaving_node_ids().end());
  std::vector<std::pair<int, std::string>> survivors;  // old rank, node id
  for (const pb::ServersMeta& s : md.servers_meta()) {
    if (!leaving.count(s.node_id())) survivors.emplace_back(s.rank_id(), s.node_id());
  }
  std::sort(survivors.begin(), survivors.end());
  // Survivors keep their relative order: new rank = position among the survivors.
  int new_rank = -1;
  std::vector<int> old_rank_of(survivors.size());
  for (size_t i = 0; i < survivors.size(); ++i) {
    old_rank_of[i] = survivors[i].first;
    if (survivors[i].second == options_.node_id) new_rank = static_cast<int>(i);
  }
  MoveKeys(new_rank, static_cast<int>(survivors.size()),
           [old_rank_of](int r) { return old_rank_of[r]; }, std::move(done));
}

void ServerNode::MoveKeys(int rank, int n, std::function<int(int)> dest_rank, std::function<void()> done) {
  auto work = [this, rank, n, dest_rank, done]() mutable {
    int old_rank;
    int old_n;
    int replicas;
    std::vector<char> old_live;
    {
      // Once the view is switched no push or pull of a key this server gives up can be
      // applied: each checks ownership and applies under the view lock (shared). So the
      // lock covers only the switch; the copy below, which may take long, runs under the
      // store's own stripe locks while the loop thread goes on serving.
      std::unique_lock<std::shared_mutex> lock(view_mu_);
      old_rank = view_rank_;
      old_n = view_n_;
      replicas = view_replicas_;
      old_live = view_live_;
      if (replicas > 1 && old_n > 0) {
        prev_view_rank_ = old_rank;
        prev_view_n_ = old_n;
        prev_view_replicas_ = replicas;
      }
      view_rank_ = rank;
      view_n_ = n;
      if (replicas > 1) {
        // A replicated scale starts with every server live (the scheduler checks it);
        // the metadata of the READY cluster sets liveness again.
        view_live_.assign(static_cast<size_t>(std::max(n, 0)), 1);
        view_resyncing_.assign(static_cast<size_t>(std::max(n, 0)), 0);
      }
    }
    // Per position in a range's chain (one pass with one replica): which entries go to the
    // new chain's member at that position, dest_rank((range + position) % n).
    std::vector<std::vector<std::pair<uint64_t, std::vector<float>>>> passes;
    if (replicas <= 1) {
      passes.push_back(store_.ExtractNotOwned(rank, n, /*erase=*/false));
    } else {
      // Every copy of a range is complete, so its old primary alone sends it, to each
      // member of the key's new chain that is not this server.
      std::vector<std::pair<uint64_t, std::vector<float>>> mine =
          EntriesPrimaryOf(store_, old_rank, old_n, replicas, old_live);
      const int copies = std::clamp(replicas, 1, std::max(n, 1));
      for (int position = 0; position < copies; ++position) {
        passes.emplace_back();
        for (const auto& entry : mine) {
          if ((core::ServerForKey(entry.first, n) + position) % n != rank) passes.back().push_back(entry);
        }
      }
    }
    // The push-id window as it is after the switch (every push applied under the old view
    // is in it), for the new owners of the entries: a part split from a push whose answer
    // was lost is then acknowledged there without being applied again.
    const std::string window_bytes = dedup_.Encode();
    BufferPtr window = Buffer::Allocate(window_bytes.size());
    std::copy(window_bytes.begin(), window_bytes.end(), window->data());
    std::set<int> window_to;
    for (size_t position = 0; position < passes.size(); ++position) {
      for (const auto& entry : passes[position]) {
        window_to.insert(dest_rank((core::ServerForKey(entry.first, n) + static_cast<int>(position)) % n));
      }
    }
    size_t moving = 0;
    for (const auto& pass : passes) moving += pass.size();
    LOG(INFO) << "server " << options_.node_id << " now rank " << rank << " of " << n << "; moving " << moving
              << (replicas > 1 ? " copies of keys to their new replicas" : " keys");
    std::weak_ptr<ServerNode*> weak = alive_;
    loop()->Run([this, weak, passes = std::move(passes), window, window_to, dest_rank, n, done]() mutable {
      if (!weak.lock()) return;
      // done() once every pass has stored its entries and every new owner merged the window.
      auto left = std::make_shared<std::atomic<size_t>>(passes.size() + 1);
      auto one_done = [left, done] {
        if (--*left == 0) done();
      };
      SendWindow(window, window_to, one_done);
      for (size_t position = 0; position < passes.size(); ++position) {
        const int p = static_cast<int>(position);
        auto dest = [dest_rank, p, n](int range) { return dest_rank((range + p) % n); };
        SendEntries(std::move(passes[position]), dest, n, one_done);
      }
    });
  };
  // Copying the entries may take a while: keep it off the loop thread when possible.
  if (executor_) {
    executor_->Submit(0, std::move(work));
  } else {
    work();
  }
}

void ServerNode::SendWindow(BufferPtr window, const std::set<int>& ranks, std::function<void()> done) {
  DCHECK(loop()->InLoopThread());
  if (ranks.empty()) return done();
  auto left = std::make_shared<std::atomic<size_t>>(ranks.size());
  auto failed = std::make_shared<std::atomic<bool>>(false);
  for (int dest : ranks) {
    WithServerConn(dest, [this, window, left, failed, done, dest](Result<ConnId> c) {
      auto finish = [left, failed, done, this, dest](const Status& st) {
        if (!st.ok()) {
          // As with the entries: the scale cannot complete; its timeout rolls it back.
          LOG(ERROR) << "server " << options_.node_id << ": sending the push-id window to rank " << dest
                     << " failed: " << st;
          failed->store(true);
        }
        if (--*left == 0 && !failed->load()) done();
      };
      if (!c.ok()) return finish(c.status());
      pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::SERVER, rank());
      meta.set_handler(kMigrateWindowHandler);
      messenger().Call(*c, meta, window, options_.request_timeout,
                       [finish](Result<Frame> r) { finish(r.status()); });
    });
  }
}

void ServerNode::SendEntries(std::vector<std::pair<uint64_t, std::vector<float>>> entries,
                             std::function<int(int)> dest_rank, int n, std::function<void()> done) {
  // Batches per destination, each at most kMigrateChunkBytes of values.
  std::map<int, std::vector<BufferPtr>> batches;
  std::map<int, std::vector<size_t>> pending;  // destination -> entry indices of the open batch
  auto flush = [&](int dest, std::vector<size_t>& idx) {
    if (idx.empty()) return;
    std::vector<uint64_t> keys;
    std::vector<uint32_t> lens;
    size_t total = 0;
    for (size_t i : idx) {
      keys.push_back(entries[i].first);
      lens.push_back(static_cast<uint32_t>(entries[i].second.size()));
      total += entries[i].second.size();
    }
    // Values go straight from the entries into the payload: one copy, no staging vector.
    Result<BufferPtr> payload =
        core::EncodeKvPairsFilled(keys.data(), keys.size(), lens.data(), total, [&](float* dst) {
          for (size_t i : idx) {
            std::copy(entries[i].second.begin(), entries[i].second.end(), dst);
            dst += entries[i].second.size();
          }
          return Status::Ok();
        });
    CHECK(payload.ok()) << payload.status();  // the fill above cannot fail
    batches[dest].push_back(*payload);
    idx.clear();
  };
  std::map<int, size_t> open_bytes;
  for (size_t i = 0; i < entries.size(); ++i) {
    int dest = dest_rank(core::ServerForKey(entries[i].first, n));
    pending[dest].push_back(i);
    open_bytes[dest] += entries[i].second.size() * sizeof(float);
    if (open_bytes[dest] >= kMigrateChunkBytes) {
      flush(dest, pending[dest]);
      open_bytes[dest] = 0;
    }
  }
  for (auto& [dest, idx] : pending) flush(dest, idx);
  size_t total = 0;
  for (auto& [dest, list] : batches) total += list.size();
  if (total == 0) {
    done();
    return;
  }
  auto left = std::make_shared<std::atomic<size_t>>(total);
  auto failed = std::make_shared<std::atomic<bool>>(false);
  for (auto& batch : batches) {
    const int dest = batch.first;  // a named copy: C++17 lambdas cannot capture a structured binding
    for (BufferPtr& payload : batch.second) {
      WithServerConn(dest, [this, payload, left, failed, done, dest](Result<ConnId> c) {
        auto finish = [left, failed, done, this, dest](const Status& st) {
          if (!st.ok()) {
            // The operation cannot complete; the scheduler's scale timeout rolls it back.
            LOG(ERROR) << "server " << options_.node_id << ": moving keys to rank " << dest << " failed: " << st;
            failed->store(true);
          }
          if (--*left == 0 && !failed->load()) done();
        };
        if (!c.ok()) return finish(c.status());
        pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::SERVER, rank());
        meta.set_handler(kMigrateHandler);
        messenger().Call(*c, meta, payload, options_.request_timeout,
                         [finish](Result<Frame> r) { finish(r.status()); });
      });
    }
  }
}

}  // namespace pscore::node
