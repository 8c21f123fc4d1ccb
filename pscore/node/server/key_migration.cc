#include "pscore/node/server/key_migration.h"

#include <algorithm>
#include <atomic>
#include <set>

#include <glog/logging.h>

#include "pscore/core/key_range.h"
#include "pscore/core/kv_codec.h"

namespace pscore::node {

using comm::Frame;

namespace {
constexpr size_t kMigrateChunkBytes = 32u << 20;

pb::MessageMeta HandlerMeta(const char* handler) {
  pb::MessageMeta meta;
  meta.set_cmd(pb::SEND_DATA);
  meta.set_handler(handler);
  return meta;
}
}  // namespace

KeyMigration::KeyMigration(std::string node_id, comm::EventLoop* loop, Executor* executor,
                           comm::AliveToken::Watch alive, KeyOwnership* ownership, ParamService* params, ServerLinks* links)
    : node_id_(std::move(node_id)),
      loop_(loop),
      executor_(executor),
      alive_(std::move(alive)),
      ownership_(ownership),
      params_(params),
      links_(links) {}

void KeyMigration::HandleEntries(const DataRequest& req, Responder r) {
  if (executor_ && drops_queued_.load(std::memory_order_acquire) > 0) {
    // A drop for an earlier view is queued: these entries, perhaps of a range it would
    // erase, are stored after it.
    return OnLane(kDropLane, [this, req, r] { HandleEntries(req, r); });
  }
  StoreEntries(req, r);
  // After storing: a drop that looked before these entries were in leaves the mark for the
  // next one (entries of a scale rolled back are not held here).
  maybe_stale_.store(true, std::memory_order_release);
}

void KeyMigration::StoreEntries(const DataRequest& req, const Responder& r) {
  const char* data = req.payload ? req.payload->data() : "";
  size_t size = req.payload ? req.payload->size() : 0;
  Result<core::KvView> view = core::DecodeKvPairs(data, size, /*expect_values=*/true);
  if (!view.ok()) return r.Fail(view.status());
  Status st = params_->InsertEntries(std::string_view(data, size), *view);
  if (!st.ok()) return r.Fail(st);
  r.Reply(nullptr);
}

void KeyMigration::HandleWindow(const DataRequest& req, Responder r) {
  const std::string_view bytes = req.payload ? std::string_view(req.payload->data(), req.payload->size()) : "";
  Status st = params_->dedup().Merge(bytes);
  st.ok() ? r.Reply(nullptr) : r.Fail(st);
}

void KeyMigration::OnLane(uint64_t lane, std::function<void()> work) {
  if (executor_) {
    executor_->Submit(lane, std::move(work));
  } else {
    work();
  }
}

void KeyMigration::DropNotHeld(int rank, int n, int replicas, bool changed, std::function<void(size_t)> dropped) {
  DCHECK(loop_->InLoopThread());
  drops_queued_.fetch_add(1, std::memory_order_release);
  // The scan, and the journal record with its compaction, keep off the loop thread.
  OnLane(kDropLane, [this, rank, n, replicas, changed, dropped = std::move(dropped)] {
    params_->ConfirmRestored();  // this server is a member with this view: they are its own
    const size_t count = Drop(rank, n, replicas, changed);
    drops_queued_.fetch_sub(1, std::memory_order_release);
    dropped(count);
  });
}

size_t KeyMigration::Drop(int rank, int n, int replicas, bool changed) {
  core::ParamStore& store = params_->store();
  size_t dropped = 0;
  // Entries not held appear only with a view change or entries moved here: without either
  // since the last drop there is nothing to look for (no scan, no stripe lock).
  const bool stale = maybe_stale_.exchange(false, std::memory_order_acq_rel);
  if (!changed && !stale) return 0;
  if (replicas <= 1 && store.HasNotOwned(rank, n)) {
    Status st = params_->Journaled(core::JournalOp::kDrop, core::EncodeJournalDrop(rank, n), [&] {
      dropped = store.ExtractNotOwned(rank, n, /*erase=*/true).size();
      return Status::Ok();
    });
    if (!st.ok()) LOG(ERROR) << "server " << node_id_ << ": entries owned elsewhere kept: " << st;
  } else if (replicas > 1 && changed && rank >= 0) {
    // With replicas this server holds the ranges of its chains; after a scale some of its
    // entries may be of ranges it no longer holds.
    std::vector<uint64_t> gone;
    for (uint64_t key : store.Keys()) {
      if (!core::HoldsRange(rank, core::ServerForKey(key, n), n, replicas)) gone.push_back(key);
    }
    if (!gone.empty()) {
      Status st = params_->Journaled(core::JournalOp::kDropKeys, core::EncodeJournalDropKeys(gone), [&] {
        dropped = store.Erase(gone.data(), gone.size());
        return Status::Ok();
      });
      if (!st.ok()) LOG(ERROR) << "server " << node_id_ << ": entries held elsewhere kept: " << st;
    }
  }
  return dropped;
}

void KeyMigration::OnScaleOutReady(const pb::SendMetadataMessage& md, std::function<void()> done) {
  bool old_member;
  {
    auto lock = ownership_->Share();
    old_member = ownership_->view().n > 0;
  }
  const int old_n = md.scale_out_old_server_num();
  if (!old_member && old_n > 0 && old_n < md.server_num() && md.rank_id() >= 0 && md.rank_id() < old_n &&
      md.replicas() <= 1) {
    // A member of the old membership restarted (from its --data_dir) while the scale-out
    // ran: what it restored is its old range, and it moves what it no longer owns as the
    // other old servers do (a copy they already received is overwritten with the same
    // values: workers push nothing until READY).
    {
      auto lock = ownership_->Exclusive();
      ownership_->Adopt(md.rank_id(), old_n, /*replicas=*/1);
    }
    OnLane(kDropLane, [this] { params_->ConfirmRestored(); });
    LOG(INFO) << "server " << node_id_ << " restarted during a scale-out: serves its old key range " << md.rank_id()
              << "/" << old_n << " and moves what it no longer owns";
    old_member = true;
  }
  if (!old_member) {
    // A new server: it receives entries (some may have arrived already); workers send
    // nothing until READY. Entries it restored from a journal of an earlier membership
    // and no owner has sent again are stale: dropped before its part is done.
    OnLane(kDropLane, [this, rank = md.rank_id(), n = md.server_num(), done = std::move(done)] {
      if (size_t stale = params_->DropUnconfirmedRestored(); stale > 0) {
        LOG(WARNING) << "server " << node_id_ << " joins as a new server: dropped " << stale
                     << " keys restored from an earlier membership";
      }
      {
        auto lock = ownership_->Exclusive();
        ownership_->Adopt(rank, n);
      }
      done();
    });
    return;
  }
  // Scale-out keeps existing ranks: the new owner's rank is its rank in md.
  MoveKeys(md.rank_id(), md.server_num(), [](int r) { return r; }, std::move(done));
}

void KeyMigration::OnScaleInStart(const pb::SendMetadataMessage& md, const pb::ScaleInMessage& msg,
                                  std::function<void()> done) {
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
    if (survivors[i].second == node_id_) new_rank = static_cast<int>(i);
  }
  MoveKeys(new_rank, static_cast<int>(survivors.size()), [old_rank_of](int r) { return old_rank_of[r]; },
           std::move(done));
}

void KeyMigration::MoveKeys(int rank, int n, std::function<int(int)> dest_rank, std::function<void()> done) {
  DCHECK(loop_->InLoopThread());
  uint64_t settles;
  {
    auto lock = ownership_->Share();
    settles = ownership_->settles();
  }
  auto work = [this, rank, n, dest_rank, done, settles]() mutable {
    KeyView old;
    {
      // Once the view is switched no push or pull of a key this server gives up can be
      // applied: each checks ownership and applies under the ownership lock (shared). So
      // the lock covers only the switch; the copy below, which may take long, runs under
      // the store's own stripe locks while the loop thread goes on serving.
      auto lock = ownership_->Exclusive();
      if (ownership_->settles() != settles) {
        // The view settled since the scale started: it was rolled back (or ended) before
        // this lane ran. Switching now would take the ranges of a membership that is gone.
        LOG(INFO) << "server " << node_id_ << ": the scale ended before its switch to rank " << rank << " of " << n
                  << "; nothing moved";
        return;
      }
      old = ownership_->Switch(rank, n);
    }
    const std::map<int, std::vector<uint64_t>> plan = PlanMoves(old, rank, n, dest_rank);
    size_t moving = 0;
    for (const auto& [dest, keys] : plan) moving += keys.size();
    LOG(INFO) << "server " << node_id_ << " now rank " << rank << " of " << n << "; moving " << moving
              << (old.replicas > 1 ? " copies of keys to their new replicas" : " keys");
    Result<Batches> batches = Encode(plan);
    if (!batches.ok()) {
      // The operation cannot complete; the scheduler's scale timeout rolls it back.
      LOG(ERROR) << "server " << node_id_ << ": moving keys failed: " << batches.status();
      return;
    }
    // The push-id window as it is after the switch (every push applied under the old view
    // is in it), for the new owners of the entries: a part split from a push whose answer
    // was lost is then acknowledged there without being applied again.
    BufferPtr window = Buffer::FromString(params_->dedup().Encode());
    comm::AliveToken::Watch alive = alive_;
    loop_->Run([this, alive, batches = std::move(*batches), window, done]() mutable {
      if (alive) Send(std::move(batches), window, done);
    });
  };
  // Copying the entries may take a while: keep it off the loop thread when possible.
  OnLane(kMoveLane, std::move(work));
}

std::map<int, std::vector<uint64_t>> KeyMigration::PlanMoves(const KeyView& old, int rank, int n,
                                                             const std::function<int(int)>& dest_rank) const {
  std::vector<uint64_t> keys = params_->store().Keys();
  std::sort(keys.begin(), keys.end());
  std::map<int, std::vector<uint64_t>> plan;
  if (old.replicas <= 1) {
    // Every key this server no longer owns goes to its new owner (a rank outside [0, n),
    // a leaving server, owns nothing).
    for (uint64_t key : keys) {
      const int range = core::ServerForKey(key, n);
      if (range != rank) plan[dest_rank(range)].push_back(key);
    }
    return plan;
  }
  // Every copy of a range is complete, so its old primary alone sends it, to each member
  // of the key's new chain that is not this server.
  const int copies = std::clamp(old.replicas, 1, std::max(n, 1));
  for (uint64_t key : keys) {
    if (core::PrimaryOf(core::ServerForKey(key, old.n), old.n, old.replicas, old.live) != old.rank) continue;
    const int range = core::ServerForKey(key, n);
    for (int position = 0; position < copies; ++position) {
      const int member = (range + position) % n;
      if (member != rank) plan[dest_rank(member)].push_back(key);
    }
  }
  return plan;
}

Result<KeyMigration::Batches> KeyMigration::Encode(const std::map<int, std::vector<uint64_t>>& plan) const {
  const core::ParamStore& store = params_->store();
  Batches batches;
  std::vector<uint64_t> keys;
  std::vector<uint32_t> lens;
  for (const auto& [dest, planned] : plan) {
    size_t at = 0;
    while (at < planned.size()) {
      // One batch: keys until kMigrateChunkBytes of values; a key gone meanwhile is skipped.
      keys.clear();
      lens.clear();
      uint64_t floats = 0;
      for (; at < planned.size() && floats * sizeof(float) < kMigrateChunkBytes; ++at) {
        uint32_t len = 0;
        if (!store.Lens(&planned[at], 1, &len).ok()) continue;
        keys.push_back(planned[at]);
        lens.push_back(len);
        floats += len;
      }
      if (keys.empty()) continue;
      // Values go straight from the store into the payload: one copy, no staging.
      Result<BufferPtr> payload = core::EncodeKvPairsFilled(
          keys.data(), keys.size(), lens.data(), floats,
          [&](float* dst) { return store.CopyValues(keys.data(), keys.size(), lens.data(), dst); });
      if (!payload.ok()) return payload.status();
      batches[dest].push_back(std::move(*payload));
    }
  }
  return batches;
}

void KeyMigration::Send(Batches batches, BufferPtr window, std::function<void()> done) {
  DCHECK(loop_->InLoopThread());
  // done() once every new owner merged the window and stored every batch.
  size_t total = 0;
  for (const auto& [dest, list] : batches) total += 1 + list.size();
  if (total == 0) return done();
  auto left = std::make_shared<std::atomic<size_t>>(total);
  auto failed = std::make_shared<std::atomic<bool>>(false);
  for (auto& batch : batches) {
    const int dest = batch.first;  // a named copy: C++17 lambdas cannot capture a structured binding
    auto finish = [this, left, failed, done, dest](Result<Frame> res) {
      if (!res.ok()) {
        // The operation cannot complete; the scheduler's scale timeout rolls it back.
        LOG(ERROR) << "server " << node_id_ << ": moving keys to rank " << dest << " failed: " << res.status();
        failed->store(true);
      }
      if (--*left == 0 && !failed->load()) done();
    };
    links_->CallServer(dest, HandlerMeta(kMigrateWindowHandler), window, finish);
    for (BufferPtr& payload : batch.second) {
      links_->CallServer(dest, HandlerMeta(kMigrateHandler), std::move(payload), finish);
    }
  }
}

}  // namespace pscore::node
