// ParamService: pulls, the journal, and the entries a migration or a resync brings.
#include "pscore/node/server/param_service.h"

#include <glog/logging.h>

#include "pscore/node/common/wire.h"

#define PSCORE_RETURN_IF_ERROR_RESPOND(expr, responder) \
  do {                                                  \
    ::pscore::Status _st = (expr);                      \
    if (!_st.ok()) return (responder).Fail(_st);        \
  } while (0)

namespace pscore::node {

ParamService::ParamService(Options options, core::ParamStore::Options store, comm::EventLoop* loop,
                           KeyOwnership* ownership, ServerLinks* links, std::shared_ptr<std::atomic<uint64_t>> copied)
    : options_(std::move(options)),
      loop_(loop),
      ownership_(ownership),
      links_(links),
      copied_(std::move(copied)),
      store_(store) {}

Status ParamService::Open() {
  if (options_.data_dir.empty()) return Status::Ok();
  ServerJournalOptions journal_options;
  journal_options.compact_floor = options_.journal_compact_bytes;
  journal_ = std::make_unique<ServerJournal>(options_.data_dir, journal_options);
  PSCORE_RETURN_IF_ERROR(journal_->Open(&store_, &dedup_));
  LOG(INFO) << "server " << options_.node_id << ": parameters journaled in " << journal_->path() << " ("
            << journal_->restored_keys() << " keys restored)";
  std::vector<uint64_t> keys = store_.Keys();
  std::lock_guard<std::mutex> lock(journal_mu_);
  restored_unconfirmed_.insert(keys.begin(), keys.end());
  return Status::Ok();
}

void ParamService::Stop() {
  if (!journal_) return;
  // No handler appends any more; a compaction still being written ends here, so nothing
  // of this node touches data_dir once Stop has returned (the directory may be removed or
  // opened by a new server at once).
  std::lock_guard<std::mutex> lock(journal_mu_);
  Status st = journal_->FinishCompaction();
  if (!st.ok()) LOG(WARNING) << "server " << options_.node_id << ": journal compaction failed: " << st;
}

bool ParamService::journal_compacting() {
  std::lock_guard<std::mutex> lock(journal_mu_);
  return journal_ && journal_->compacting();
}

void ParamService::HandlePull(const DataRequest& req, Responder r) {
  const char* data = req.payload ? req.payload->data() : "";
  size_t size = req.payload ? req.payload->size() : 0;
  Result<core::KvView> view = core::DecodeKvPairs(data, size, /*expect_values=*/false);
  if (!view.ok()) return r.Fail(view.status());
  auto lock = ownership_->Share();
  PSCORE_RETURN_IF_ERROR_RESPOND(ownership_->CheckOwned(view->keys, view->num_keys), r);
  Result<BufferPtr> uniform = PullUniform(*view);
  if (!uniform.ok()) return r.Fail(uniform.status());
  if (*uniform) {
    lock.unlock();
    return r.Reply(std::move(*uniform));
  }
  std::vector<uint32_t> lens(view->num_keys);
  PSCORE_RETURN_IF_ERROR_RESPOND(store_.Lens(view->keys, view->num_keys, lens.data()), r);
  uint64_t total = 0;
  for (uint32_t l : lens) total += l;
  // An answer over the frame limit would be refused by the worker (its link closed), and
  // one of 2 GiB or more cannot be encoded at all: refused here, whole. Keys may repeat
  // in a request, so a small request can ask for a huge answer.
  const bool shared = total * sizeof(float) >= core::kSharedAnswerBytes * view->num_keys;
  const uint64_t answer_bytes =
      AnswerBytes(view->num_keys, total, shared ? core::Keys::kWritten : AnswerKeys(*view), /*uniform=*/false);
  if (answer_bytes > options_.max_message_bytes) {
    return r.Fail(Status(Code::kResourceExhausted, "pull: the answer would hold " + std::to_string(answer_bytes) +
                                                       " bytes, over max_message_bytes (" +
                                                       std::to_string(options_.max_message_bytes) + ")"));
  }
  if (shared) {
    // Values of a few KiB a key and more are not copied: the answer's tail is the stored
    // memory itself, pinned until the answer is written (a push meanwhile writes a fresh
    // copy of the key).
    std::vector<Slice> values(view->num_keys);
    PSCORE_RETURN_IF_ERROR_RESPOND(store_.ShareValues(view->keys, view->num_keys, values.data()), r);
    lock.unlock();
    for (size_t i = 0; i < values.size(); ++i) lens[i] = static_cast<uint32_t>(values[i].size / sizeof(float));
    Result<Payload> answer = core::EncodeKvPairsShared(view->keys, view->num_keys, lens.data(), std::move(values));
    if (!answer.ok()) return r.Fail(answer.status());
    return r.Reply(std::move(*answer));
  }
  // Smaller ones are copied once: from the store straight into the answer.
  Result<BufferPtr> answer = core::EncodeKvPairsFilled(
      view->keys, view->num_keys, lens.data(), total,
      [&](float* dst) { return store_.CopyValues(view->keys, view->num_keys, lens.data(), dst); },
      AnswerKeys(*view));
  lock.unlock();
  if (!answer.ok()) return r.Fail(answer.status());
  copied_->fetch_add(total * sizeof(float), std::memory_order_relaxed);
  r.Reply(*answer);
}

// A worker that asked for answers without keys (it knows them: they are its request's)
// gets its copied answers without them: 8 bytes a key fewer to write, send and read.
core::Keys ParamService::AnswerKeys(const core::KvView& request) {
  return request.keyless_answer ? core::Keys::kLeftOut : core::Keys::kWritten;
}

uint64_t ParamService::AnswerBytes(size_t num_keys, uint64_t floats, core::Keys keys, bool uniform) {
  const bool keys_written = keys == core::Keys::kWritten;
  const uint64_t per_key = (keys_written ? sizeof(uint64_t) : 0) + (keys_written || !uniform ? sizeof(uint32_t) : 0);
  return floats * sizeof(float) + uint64_t{num_keys} * per_key;
}

// Rows of one length (an embedding table's, a sparse model's floats) are copied in one walk
// of the keys: the first key's length is looked up alone and taken for every key. Null
// when that does not serve: a key of another length (found on the way), rows large enough
// for the answer to share the store's memory, an answer over the limit (HandlePull's two
// steps then answer, or refuse naming the size), keys of no floats (there would be no
// values to fill, so no walk to check the other keys).
Result<BufferPtr> ParamService::PullUniform(const core::KvView& view) const {
  if (view.num_keys < 2) return BufferPtr();
  uint32_t len = 0;
  PSCORE_RETURN_IF_ERROR(store_.Lens(view.keys, 1, &len));
  const uint64_t total = uint64_t{len} * view.num_keys;
  if (len == 0 || len * sizeof(float) >= core::kSharedAnswerBytes ||
      AnswerBytes(view.num_keys, total, AnswerKeys(view), /*uniform=*/true) > options_.max_message_bytes) {
    return BufferPtr();
  }
  bool other_len = false;
  Result<BufferPtr> answer = core::EncodeKvPairsUniform(
      view.keys, view.num_keys, len,
      [&](float* dst) {
        Status st = store_.CopyUniform(view.keys, view.num_keys, len, dst);
        other_len = st.code() == Code::kFailedPrecondition;
        return other_len ? Status::Ok() : st;
      },
      AnswerKeys(view));
  if (other_len) return BufferPtr();
  if (answer.ok()) copied_->fetch_add(total * sizeof(float), std::memory_order_relaxed);
  return answer;
}

bool ParamService::SmallBuiltin(const pb::MessageMeta& meta, const BufferPtr& payload) const {
  constexpr size_t kSmallBytes = 16 * 1024;
  const bool push = meta.handler() == kPushHandler || meta.handler() == kReplicateHandler;
  if (!push && meta.handler() != kPullHandler) return false;
  const size_t size = payload ? payload->size() : 0;
  if (size > kSmallBytes) return false;
  // A journaled push writes to disk, and now and then compacts the journal (the whole
  // store, then fsync): never on the loop thread.
  if (push) return !journal_;
  // A pull's answer is what counts: the lengths of the keys it asks for. A small one is
  // copied in microseconds; a large one of a few keys is not copied at all (written from
  // the store: HandlePull), so it costs a few lookups whatever its size.
  constexpr size_t kFewKeys = 16;
  Result<core::KvView> view = core::DecodeKvPairs(payload ? payload->data() : "", size, /*expect_values=*/false);
  if (!view.ok()) return true;  // refused at once by the handler
  std::vector<uint32_t> lens(view->num_keys);
  if (!store_.Lens(view->keys, view->num_keys, lens.data()).ok()) return true;  // kNotFound at once
  uint64_t floats = 0;
  for (uint32_t l : lens) floats += l;
  const uint64_t bytes = floats * sizeof(float);
  return bytes <= kSmallBytes || (view->num_keys <= kFewKeys && bytes >= core::kZeroCopyBytes * view->num_keys);
}

Status ParamService::Journaled(core::JournalOp op, std::string_view body, const std::function<Status()>& apply) {
  if (!journal_) return apply();
  // The checksum first, outside the lock: another handler thread writes meanwhile.
  return JournaledRecord(core::JournalRecordHeader(op, body), body, apply);
}

Status ParamService::JournaledRecord(const std::string& header, std::string_view body,
                                   const std::function<Status()>& apply) {
  std::lock_guard<std::mutex> lock(journal_mu_);
  Status logged = AppendPendingDropLocked();
  if (logged.ok()) logged = journal_->AppendRecord(header, body);
  if (!logged.ok()) {
    // A worker sends a refused push again every 50 ms: one line a second says it.
    const uint64_t errors = journal_errors_.fetch_add(1, std::memory_order_relaxed) + 1;
    LOG_EVERY_T(ERROR, 1.0) << "server " << options_.node_id << ": " << logged << " (" << errors
                            << " changes refused so far)";
    if (on_journal_error_) on_journal_error_(logged);
    return Status(Code::kUnavailable, "server " + options_.node_id + " cannot journal the change: " + logged.message());
  }
  Status st = apply();
  // The loop thread (a view change's drop, inline handlers) must not wait for the disk:
  // a stalled loop misses its heartbeats.
  journal_->MaybeCompact(/*may_wait=*/!loop_->InLoopThread());
  return st;
}

Status ParamService::InsertEntries(std::string_view body, const core::KvView& view) {
  return Journaled(core::JournalOp::kInsert, body, [&] {
    store_.Insert(view.keys, view.Lengths(), view.values, view.num_keys);
    if (journal_) {
      for (size_t i = 0; i < view.num_keys; ++i) restored_unconfirmed_.erase(view.keys[i]);  // journal_mu_ is held
    }
    return Status::Ok();
  });
}

void ParamService::ConfirmRestored() {
  if (!journal_) return;
  std::lock_guard<std::mutex> lock(journal_mu_);
  restored_unconfirmed_.clear();
}

// The entries leave the store whether or not the journal takes their drop now: they are
// stale, and must not be served. A drop the journal refused is written before the next
// record it takes (AppendPendingDropLocked), so a later insert of one of these keys follows
// it on disk; a restart before then restores them as unconfirmed again.
size_t ParamService::DropUnconfirmedRestored() {
  if (!journal_) return 0;
  std::lock_guard<std::mutex> lock(journal_mu_);
  if (restored_unconfirmed_.empty()) return 0;
  std::vector<uint64_t> keys(restored_unconfirmed_.begin(), restored_unconfirmed_.end());
  restored_unconfirmed_.clear();
  const size_t dropped = store_.Erase(keys.data(), keys.size());
  pending_drop_.insert(pending_drop_.end(), keys.begin(), keys.end());
  Status logged = AppendPendingDropLocked();
  if (!logged.ok()) {
    journal_errors_.fetch_add(1, std::memory_order_relaxed);
    LOG(ERROR) << "server " << options_.node_id << ": the drop of " << keys.size()
               << " stale restored entries is not journaled yet (" << logged << "); it goes before the next change";
    if (on_journal_error_) on_journal_error_(logged);
    return dropped;
  }
  journal_->MaybeCompact(/*may_wait=*/!loop_->InLoopThread());
  return dropped;
}

Status ParamService::AppendPendingDropLocked() {
  if (pending_drop_.empty()) return Status::Ok();
  PSCORE_RETURN_IF_ERROR(journal_->Append(core::JournalOp::kDropKeys, core::EncodeJournalDropKeys(pending_drop_)));
  std::vector<uint64_t>().swap(pending_drop_);
  return Status::Ok();
}

}  // namespace pscore::node
