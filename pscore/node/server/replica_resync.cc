// ReplicaResync: a server that came back in a replicated job (the metadata marks
// it resyncing) is rebuilt from its ranges' primaries while the job runs
// (docs/reliability.md, Resync).
//
// Target (the resyncing server): on the metadata that marks it resyncing it drops its
// entries and push-id window, marks every range it holds pending, and fetches each
// range's snapshot from the range's primary, chunk by chunk (kResyncHandler). Pushes the
// primaries forward to it meanwhile are held, unanswered, while any of their ranges is
// pending. A snapshot is installed (entries journaled as a migration's are, window merged
// into this server's), then the held pushes of the ranges no longer pending go through
// the ordinary replica path: one whose id is in the installed window is acknowledged
// without being applied (the snapshot has it), the others are applied. When no range is
// pending it tells the scheduler (RESYNC_DONE), whose next epoch marks it alive.
//
// Source (a range's primary): serves a fetch only once its own metadata marks the asker
// resyncing, i.e. once every push it applies is forwarded to the asker too. The snapshot
// (the range's entries and the window) is copied under the ownership lock held exclusively:
// a push holds it shared from its id's claim to its apply, so each push is either wholly
// in the snapshot (entries and window) or forwarded to the asker after it. It is encoded
// once and handed out in chunks of at most max_message_bytes.
#include <algorithm>

#include <glog/logging.h>

#include "pscore/core/endian.h"
#include "pscore/core/key_range.h"
#include "pscore/core/kv_codec.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/server/replica_resync.h"

namespace pscore::node {

using comm::Frame;

namespace {

// Fetch request: | range u32 | server_num u32 | offset u64 | token u64 |.
// Answer: | token u64 | total u64 | snapshot bytes [offset, offset + chunk) |.
// Snapshot: | kv_bytes u64 | kv pairs (pscore/core/kv_codec.h) | push-id window (pscore/core/push_dedup.h) |.
constexpr size_t kFetchBytes = 24;
constexpr size_t kChunkHead = 16;
constexpr uint64_t kMaxChunkBytes = 16u << 20;
// Forwarded pushes held at once while their ranges are copied; past it they are refused
// (kUnavailable: the worker sends them again).
constexpr uint64_t kMaxHeldBytes = 256u << 20;
constexpr Duration kRetryDelay = std::chrono::milliseconds(200);

std::string FetchRequest(int range, int n, uint64_t offset, uint64_t token) {
  std::string out(kFetchBytes, '\0');
  core::PutLe(static_cast<uint64_t>(range), 4, &out[0]);
  core::PutLe(static_cast<uint64_t>(n), 4, &out[4]);
  core::PutLe(offset, 8, &out[8]);
  core::PutLe(token, 8, &out[16]);
  return out;
}

}  // namespace

ReplicaResync::ReplicaResync(Options options, comm::EventLoop* loop, Executor* executor, comm::AliveToken::Watch alive,
                             KeyOwnership* ownership, ParamService* params, ServerLinks* links, ReportDone report_done)
    : options_(std::move(options)),
      loop_(loop),
      executor_(executor),
      alive_(std::move(alive)),
      ownership_(ownership),
      params_(params),
      links_(links),
      report_done_(std::move(report_done)) {}

void ReplicaResync::Stop() {
  DCHECK(loop_->InLoopThread());
  stopped_ = true;
}

// ---- source ----

Result<BufferPtr> ReplicaResync::EncodeRangeSnapshot(int range, int from_rank) {
  std::vector<uint64_t> keys;
  std::vector<uint32_t> lens;
  std::string window;
  uint64_t floats = 0;
  auto lock = ownership_->Exclusive();
  const KeyView& v = ownership_->view();
  const bool asker_resyncing = from_rank >= 0 && static_cast<size_t>(from_rank) < v.resyncing.size() &&
                               v.resyncing[static_cast<size_t>(from_rank)] != 0;
  const int primary = core::PrimaryOf(range, v.n, v.replicas, v.live);
  if (primary != v.rank || !asker_resyncing || !core::HoldsRange(from_rank, range, v.n, v.replicas)) {
    // The asker sees a newer (or older) epoch than this server: it asks again.
    return Status(Code::kUnavailable, "server " + options_.node_id + " (rank " + std::to_string(v.rank) +
                                          "): not the primary of range " + std::to_string(range) +
                                          " forwarding to resyncing rank " + std::to_string(from_rank) +
                                          " under its metadata yet");
  }
  core::ParamStore& store = params_->store();
  for (uint64_t key : store.Keys()) {
    if (core::ServerForKey(key, v.n) == range) keys.push_back(key);
  }
  lens.resize(keys.size());
  Status st = store.Lens(keys.data(), keys.size(), lens.data());
  if (!st.ok()) return st;
  for (uint32_t l : lens) floats += l;
  Result<BufferPtr> kv = core::EncodeKvPairsFilled(keys.data(), keys.size(), lens.data(), floats, [&](float* dst) {
    return store.CopyValues(keys.data(), keys.size(), lens.data(), dst);
  });
  if (!kv.ok()) return kv.status();
  window = params_->dedup().Encode();
  lock.unlock();
  BufferPtr out = Buffer::Allocate(8 + (*kv)->size() + window.size());
  core::PutLe((*kv)->size(), 8, out->data());
  std::copy((*kv)->data(), (*kv)->data() + (*kv)->size(), out->data() + 8);
  std::copy(window.begin(), window.end(), out->data() + 8 + (*kv)->size());
  return out;
}

void ReplicaResync::HandleFetch(const DataRequest& req, Responder r) {
  if (!req.payload || req.payload->size() != kFetchBytes || req.from_role != pb::SERVER) {
    return r.Fail(Status(Code::kInvalidArgument, "resync fetch: a " + std::to_string(kFetchBytes) +
                                                     "-byte request from a server expected"));
  }
  const char* p = req.payload->data();
  const int range = static_cast<int>(core::GetLe(p, 4));
  const int n = static_cast<int>(core::GetLe(p + 4, 4));
  const uint64_t offset = core::GetLe(p + 8, 8);
  const uint64_t token = core::GetLe(p + 16, 8);
  {
    auto lock = ownership_->Share();
    const int view_n = ownership_->view().n;
    if (n != view_n || range < 0 || range >= n) {
      return r.Fail(Status(Code::kUnavailable, "resync fetch of range " + std::to_string(range) + "/" +
                                                   std::to_string(n) + ": this server serves " +
                                                   std::to_string(view_n) + " ranges"));
    }
  }
  const auto slot = std::make_pair(req.from_rank, range);
  Snapshot snap;
  if (offset == 0) {
    Result<BufferPtr> bytes = EncodeRangeSnapshot(range, req.from_rank);
    if (!bytes.ok()) return r.Fail(bytes.status());
    std::lock_guard<std::mutex> lock(resync_mu_);
    snap = Snapshot{next_snapshot_token_++, *bytes};
    snapshots_[slot] = snap;
  } else {
    std::lock_guard<std::mutex> lock(resync_mu_);
    auto it = snapshots_.find(slot);
    if (it == snapshots_.end() || it->second.token != token || offset >= it->second.bytes->size()) {
      return r.Fail(Status(Code::kAborted, "resync fetch: snapshot " + std::to_string(token) + " of range " +
                                               std::to_string(range) + " is gone; start again"));
    }
    snap = it->second;
  }
  const uint64_t limit = std::max<uint64_t>(4096, std::min(kMaxChunkBytes, options_.max_message_bytes / 2));
  const uint64_t total = snap.bytes->size();
  const uint64_t len = std::min(limit, total - std::min(offset, total));
  BufferPtr out = Buffer::Allocate(kChunkHead + len);
  core::PutLe(snap.token, 8, out->data());
  core::PutLe(total, 8, out->data() + 8);
  std::copy(snap.bytes->data() + offset, snap.bytes->data() + offset + len, out->data() + kChunkHead);
  if (offset + len >= total) {
    std::lock_guard<std::mutex> lock(resync_mu_);
    auto it = snapshots_.find(slot);
    if (it != snapshots_.end() && it->second.token == snap.token) snapshots_.erase(it);
  }
  r.Reply(out);
}

// ---- target ----

std::vector<std::pair<int, int>> ReplicaResync::UpdateLocked(bool self_resyncing) {
  const KeyView& v = ownership_->view();
  std::lock_guard<std::mutex> lock(resync_mu_);
  // Source: snapshots a resyncing server left half fetched go once none is resyncing.
  if (std::none_of(v.resyncing.begin(), v.resyncing.end(), [](char c) { return c != 0; })) {
    snapshots_.clear();
  }
  if (!self_resyncing || v.rank < 0 || v.n <= 0) {
    if (resync_.active) {
      LOG(INFO) << "server " << options_.node_id << " (rank " << v.rank << ") is a live replica again";
    }
    resync_.active = false;
    resync_.pending.clear();
    resync_.sources.clear();
    resync_.held.clear();  // none when it reported done; else answered kInternal, sent again
    resync_.held_bytes = 0;
    return {};
  }
  const std::vector<std::pair<int, int>> plan = core::ResyncSources(v.rank, v.n, v.replicas, v.live);
  const bool fresh = !resync_.active || resync_.n != v.n;
  if (fresh) {
    resync_.active = true;
    resync_.n = v.n;
    resync_.pending.clear();
    resync_.sources.clear();
    for (const auto& [range, source] : plan) resync_.pending.insert(range);
    // What this server held is stale: its ranges are rebuilt from their primaries.
    const std::vector<uint64_t> keys = params_->store().Keys();
    Status dropped = params_->Journaled(core::JournalOp::kDropKeys, core::EncodeJournalDropKeys(keys), [&] {
      params_->store().Erase(keys.data(), keys.size());
      return Status::Ok();
    });
    if (!dropped.ok()) LOG(ERROR) << "server " << options_.node_id << ": stale entries kept: " << dropped;
    params_->dedup().Decode(std::string(4, '\0')).IgnoreError();  // an empty window
    LOG(INFO) << "server " << options_.node_id << " (rank " << v.rank << ") resyncing " << plan.size()
              << " key ranges from their primaries";
  }
  std::vector<std::pair<int, int>> start;
  bool moved = fresh;
  for (const auto& [range, source] : plan) {
    if (!resync_.pending.count(range)) continue;
    auto it = resync_.sources.find(range);
    if (it == resync_.sources.end() || it->second != source) moved = true;
  }
  if (!moved) return {};
  ++resync_.generation;  // fetches under way are dropped: the sources are named anew
  for (const auto& [range, source] : plan) {
    if (!resync_.pending.count(range)) continue;
    resync_.sources[range] = source;
    start.emplace_back(range, source);
  }
  return start;
}

void ReplicaResync::StartFetches(std::vector<std::pair<int, int>> fetches) {
  DCHECK(loop_->InLoopThread());
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(resync_mu_);
    generation = resync_.generation;
  }
  for (const auto& [range, source] : fetches) {
    FetchSnapshot(range, source, generation, 0, 0, std::make_shared<std::string>());
  }
}

bool ReplicaResync::ResyncCurrent(uint64_t generation) {
  std::lock_guard<std::mutex> lock(resync_mu_);
  return resync_.active && resync_.generation == generation;
}

void ReplicaResync::RetryFetch(int range, uint64_t generation, const Status& why) {
  DCHECK(loop_->InLoopThread());
  LOG_EVERY_N(WARNING, 20) << "server " << options_.node_id << ": resync of range " << range
                           << " fetch failed, trying again: " << why;
  comm::AliveToken::Watch alive = alive_;
  (void)loop_->AddTimer(kRetryDelay, Duration::zero(), [this, alive, range, generation] {
    if (!alive || stopped_ || !ResyncCurrent(generation)) return;
    int source;
    {
      std::lock_guard<std::mutex> lock(resync_mu_);
      source = resync_.sources.count(range) ? resync_.sources[range] : -1;
    }
    FetchSnapshot(range, source, generation, 0, 0, std::make_shared<std::string>());
  });
}

void ReplicaResync::FetchSnapshot(int range, int source, uint64_t generation, uint64_t offset, uint64_t token,
                               std::shared_ptr<std::string> got) {
  DCHECK(loop_->InLoopThread());
  if (!ResyncCurrent(generation)) return;
  if (source < 0) return RetryFetch(range, generation, Status(Code::kUnavailable, "no live copy of the range"));
  int n;
  {
    std::lock_guard<std::mutex> lock(resync_mu_);
    n = resync_.n;
  }
  BufferPtr request = Buffer::FromString(FetchRequest(range, n, offset, token));
  pb::MessageMeta meta;
  meta.set_cmd(pb::SEND_DATA);
  meta.set_handler(kResyncHandler);
  links_->CallServer(source, std::move(meta), request,
                     [this, range, source, generation, offset, token, got](Result<Frame> res) {
                       OnChunk(range, source, generation, offset, token, got, std::move(res));
                     });
}

void ReplicaResync::OnChunk(int range, int source, uint64_t generation, uint64_t offset, uint64_t want_token,
                         std::shared_ptr<std::string> got, Result<Frame> res) {
  DCHECK(loop_->InLoopThread());
  if (!ResyncCurrent(generation)) return;
  if (!res.ok()) return RetryFetch(range, generation, res.status());
  const BufferPtr& payload = res->payload;
  if (!payload || payload->size() < kChunkHead) {
    return RetryFetch(range, generation, Status(Code::kProtocol, "resync chunk shorter than its head"));
  }
  const uint64_t token = core::GetLe(payload->data(), 8);
  const uint64_t total = core::GetLe(payload->data() + 8, 8);
  const size_t len = payload->size() - kChunkHead;
  // Bytes are kept only as they arrive; a chunk that does not continue the copy ends it.
  if (offset != got->size() || len == 0 || total < offset + len || (offset > 0 && token != want_token)) {
    return RetryFetch(range, generation, Status(Code::kProtocol, "resync chunk does not continue the snapshot"));
  }
  got->append(payload->data() + kChunkHead, len);
  if (got->size() < total) return FetchSnapshot(range, source, generation, got->size(), token, got);
  auto install = [this, range, generation, got] { InstallSnapshot(range, generation, got); };
  if (executor_) {
    comm::AliveToken::Watch alive = alive_;
    executor_->Submit(static_cast<uint64_t>(range), [alive, install] {
      if (alive) install();
    });
  } else {
    install();
  }
}

void ReplicaResync::InstallSnapshot(int range, uint64_t generation, std::shared_ptr<std::string> bytes) {
  auto bad = [&](const Status& why) {
    LOG(ERROR) << "server " << options_.node_id << ": resync snapshot of range " << range << " refused: " << why;
    comm::AliveToken::Watch alive = alive_;
    loop_->Run([this, alive, range, generation, why] {
      if (alive) RetryFetch(range, generation, why);
    });
  };
  if (bytes->size() < 8) return bad(Status(Code::kProtocol, "shorter than its kv length"));
  const uint64_t kv_bytes = core::GetLe(bytes->data(), 8);
  if (kv_bytes > bytes->size() - 8) return bad(Status(Code::kProtocol, "kv length past its end"));
  Result<core::KvView> view = core::DecodeKvPairs(bytes->data() + 8, kv_bytes, /*expect_values=*/true);
  if (!view.ok()) return bad(view.status());
  int n;
  {
    std::lock_guard<std::mutex> lock(resync_mu_);
    n = resync_.n;
  }
  for (size_t i = 0; i < view->num_keys; ++i) {
    if (core::ServerForKey(view->keys[i], n) != range) {
      return bad(Status(Code::kProtocol, "key " + std::to_string(view->keys[i]) + " is not of the range"));
    }
  }
  Status st = params_->InsertEntries(std::string_view(bytes->data() + 8, kv_bytes), *view);
  if (st.ok()) st = params_->dedup().Merge(std::string_view(bytes->data() + 8 + kv_bytes, bytes->size() - 8 - kv_bytes));
  if (!st.ok()) return bad(st);
  std::vector<std::pair<DataRequest, Responder>> release;
  bool done;
  {
    std::lock_guard<std::mutex> lock(resync_mu_);
    if (!resync_.active || resync_.generation != generation) return;
    resync_.pending.erase(range);
    std::vector<std::pair<DataRequest, Responder>> keep;
    for (auto& held : resync_.held) {
      (HeldRangesPending(held.first) ? keep : release).push_back(std::move(held));
    }
    resync_.held = std::move(keep);
    resync_.held_bytes = 0;
    for (const auto& held : resync_.held) resync_.held_bytes += held.first.payload ? held.first.payload->size() : 0;
    done = resync_.pending.empty();
  }
  LOG(INFO) << "server " << options_.node_id << ": range " << range << " resynced (" << view->num_keys
            << " keys), " << release.size() << " held pushes released";
  // Through the replica path: a push the snapshot holds is in the window now.
  for (auto& [req, r] : release) params_->HandlePush(req, r, /*replica=*/true);
  if (done) {
    comm::AliveToken::Watch alive = alive_;
    loop_->Run([this, alive, generation] {
      if (alive) ReportResynced(generation);
    });
  }
}

bool ReplicaResync::HeldRangesPending(const DataRequest& req) const {
  Result<core::KvView> view =
      core::DecodeKvPairs(req.payload ? req.payload->data() : "", req.payload ? req.payload->size() : 0, true);
  if (!view.ok()) return false;  // refused by the replica path
  for (size_t i = 0; i < view->num_keys; ++i) {
    if (resync_.pending.count(core::ServerForKey(view->keys[i], resync_.n))) return true;
  }
  return false;
}

std::optional<Status> ReplicaResync::HoldForResync(const DataRequest& req, const Responder& r) {
  std::lock_guard<std::mutex> lock(resync_mu_);
  if (!resync_.active || !HeldRangesPending(req)) return std::nullopt;
  if (!req.push_id) {
    return Status(Code::kFailedPrecondition, "server " + options_.node_id +
                                                 ": a push without an id cannot reach a resyncing replica");
  }
  const uint64_t size = req.payload ? req.payload->size() : 0;
  if (resync_.held_bytes + size > kMaxHeldBytes) {
    return Status(Code::kUnavailable, "server " + options_.node_id + ": resyncing, " +
                                          std::to_string(resync_.held_bytes) + " bytes of pushes held; send it again");
  }
  resync_.held_bytes += size;
  resync_.held.emplace_back(req, r);
  return Status::Ok();
}

void ReplicaResync::ReportResynced(uint64_t generation) {
  DCHECK(loop_->InLoopThread());
  if (!ResyncCurrent(generation)) return;
  report_done_([this, generation](const Status& st) {
    if (st.ok()) return;  // the next epoch marks this server alive (UpdateLocked ends it)
    LOG(WARNING) << "server " << options_.node_id << ": resync done not taken by the scheduler: " << st;
    comm::AliveToken::Watch alive = alive_;
    (void)loop_->AddTimer(kRetryDelay, Duration::zero(), [this, alive, generation] {
      if (alive && !stopped_) ReportResynced(generation);
    });
  });
}

}  // namespace pscore::node
