// ParamStore, streamed pushes: BeginStream, PushStream, the spare blocks a stream writes
// into, and how a push waits for (or revokes) a stream holding its key. The store's layout
// and the rest of its contract are in param_store.h.
#include "pscore/core/param_store.h"

#include <algorithm>
#include <string>
#include <utility>

namespace pscore {
namespace core {

namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void ParamStore::WaitForWriter(std::unique_lock<std::mutex>& lock, Stripe& stripe, const BlockPtr& block) {
  const int64_t stall = std::chrono::duration_cast<std::chrono::nanoseconds>(opts_.stream_stall).count();
  const int64_t hold = std::chrono::duration_cast<std::chrono::nanoseconds>(opts_.stream_hold).count();
  const int64_t since = NowNs();
  while (block->writer != nullptr) {
    PushStream* w = block->writer;
    const int64_t progress = w->progress_ns_.load(std::memory_order_relaxed);
    if (progress == PushStream::kCommitting) {  // never revoked now: it lets go when done
      stripe.released.wait(lock);
      continue;
    }
    const int64_t now = NowNs();
    const int64_t idle = now - progress;
    const int64_t waited = now - since;
    if (idle >= stall || waited >= hold) {
      // The stream's sender stopped mid-push, or sends too slowly: its key goes to the
      // pushes waiting for it (its Commit applies nothing then; the sender pushes again).
      // Its reads of the block are safe: the block is pinned (readers), so it is copied.
      block->writer = nullptr;
      held_keys_.fetch_sub(1, std::memory_order_relaxed);
      stripe.released.notify_all();
      return;
    }
    stripe.released.wait_for(lock, std::chrono::nanoseconds(std::min(stall - idle, hold - waited)));
  }
}

ParamStore::Entries::iterator ParamStore::FindUnheld(std::unique_lock<std::mutex>& lock, Stripe& stripe, uint64_t key,
                                                     uint32_t len) {
  auto it = stripe.entries.find(key);
  // A push of the wrong length is refused at once, without waiting for a stream.
  while (it != stripe.entries.end() && it->second->writer != nullptr && it->second->values.size() == len) {
    BlockPtr held = it->second;
    WaitForWriter(lock, stripe, held);
    it = stripe.entries.find(key);  // the stream replaced the block, or the key is gone
  }
  return it;
}

ParamStore::StreamHold ParamStore::HoldStreamsOff(const uint64_t* keys, RowLens lens, size_t num_keys) {
  StreamHold hold;
  if (keys == nullptr || !lens.present()) return hold;
  hold.stripes_.reserve(num_keys);
  for (size_t i = 0; i < num_keys; ++i) {
    Stripe& stripe = StripeFor(keys[i]);
    std::unique_lock<std::mutex> lock(stripe.mu);
    ++stripe.waiters;  // from now on no stream starts in this stripe
    hold.stripes_.push_back(&stripe);
    FindUnheld(lock, stripe, keys[i], lens[i]);
  }
  return hold;
}

ParamStore::StreamHold::~StreamHold() {
  for (Stripe* s : stripes_) {
    std::lock_guard<std::mutex> lock(s->mu);
    --s->waiters;
  }
}

ParamStore::Spare::Spare(BlockPtr block, std::atomic<uint64_t>* counter)
    : block_(std::move(block)), counter_(counter) {
  counter_->fetch_add(block_->values.size() * sizeof(float), std::memory_order_relaxed);
}

ParamStore::Spare& ParamStore::Spare::operator=(Spare&& o) noexcept {
  if (this != &o) {
    Reset();
    block_ = std::move(o.block_);
    counter_ = o.counter_;
  }
  return *this;
}

ParamStore::BlockPtr ParamStore::Spare::Take() {
  if (block_) counter_->fetch_sub(block_->values.size() * sizeof(float), std::memory_order_relaxed);
  return std::move(block_);
}

void ParamStore::Spare::Reset() { Take().reset(); }

std::unique_ptr<ParamStore::PushStream> ParamStore::BeginStream(const uint64_t* keys, RowLens lens,
                                                                size_t num_keys, Targets targets) {
  if (num_keys == 0 || keys == nullptr || !lens.present() || std::atomic_load(&updater_) != nullptr) return nullptr;
  std::unique_ptr<PushStream> s(new PushStream(this));
  s->keys_.reserve(num_keys);
  s->progress_ns_.store(NowNs(), std::memory_order_relaxed);
  bool lacking = false;  // kSparesOnly: some key has no spare (all such keys are marked)
  for (size_t i = 0; i < num_keys; ++i) {
    const uint64_t bytes = uint64_t{lens[i]} * sizeof(float);
    if (bytes > opts_.stream_spare_bytes) return nullptr;  // the destructor lets go of the others
    Stripe& stripe = StripeFor(keys[i]);
    std::lock_guard<std::mutex> lock(stripe.mu);
    if (stripe.waiters > 0) return nullptr;  // pushes waiting for a stream go first
    auto it = stripe.entries.find(keys[i]);
    if (it == stripe.entries.end()) {
      Cursor c;
      if (!FindInRuns(stripe, keys[i], &c) || stripe.runs[c.run].LenAt(c.pos) != lens[i]) return nullptr;
      it = MoveToBlock(stripe, c);  // a stream writes a block of its own
    }
    if (it->second->values.size() != lens[i] || it->second->writer != nullptr) return nullptr;
    Block& b = *it->second;
    // Acquire: pairs with the release of the spare's last slice (as in Writable).
    if (b.spare.block() && b.spare.block()->readers.load(std::memory_order_acquire) != 0) {
      b.spare.Reset();  // still read by a slice: left to its readers
    }
    if (!b.spare.block() && targets == Targets::kSparesOnly) {
      b.wants_spare = true;
      lacking = true;
    }
    if (lacking) continue;
    BlockPtr target = b.spare.Take();  // null: allocated below
    b.writer = s.get();
    held_keys_.fetch_add(1, std::memory_order_relaxed);
    b.readers.fetch_add(1, std::memory_order_relaxed);  // read by Apply outside the lock
    s->keys_.push_back(PushStream::Key{keys[i], it->second, std::move(target)});
  }
  if (lacking) return nullptr;  // the keys taken before are let go, their spares kept
  // Fresh targets outside the locks (zero-filled once: later streams reuse the spare).
  for (PushStream::Key& k : s->keys_) {
    if (!k.target) k.target = std::make_shared<Block>(FreshValues(k.source->values.size()));
  }
  return s;
}

void ParamStore::KeepAsSpare(Block& stored, BlockPtr& target) {
  if (!target || stored.spare.block() || target->values.size() != stored.values.size()) return;
  if (spare_bytes_.load(std::memory_order_relaxed) + stored.values.size() * sizeof(float) > opts_.stream_spare_bytes) {
    return;
  }
  stored.spare = Spare(std::move(target), &spare_bytes_);
  stored.wants_spare = false;
}

void ParamStore::PrepareSpare(uint64_t key, uint32_t len) {
  const uint64_t bytes = uint64_t{len} * sizeof(float);
  if (spare_bytes_.load(std::memory_order_relaxed) + bytes > opts_.stream_spare_bytes) return;
  // Allocated and zero-filled before taking the lock; dropped after it if not needed.
  BlockPtr spare = std::make_shared<Block>(FreshValues(len));
  Stripe& stripe = StripeFor(key);
  std::lock_guard<std::mutex> lock(stripe.mu);
  auto it = stripe.entries.find(key);
  if (it != stripe.entries.end()) KeepAsSpare(*it->second, spare);
}

void ParamStore::PushStream::Apply(const float* values, size_t n) {
  progress_ns_.store(NowNs(), std::memory_order_relaxed);
  const Options& o = store_->opts_;
  while (n > 0 && key_ < keys_.size()) {
    Key& k = keys_[key_];
    const size_t len = k.source->values.size();
    const size_t take = std::min<uint64_t>(n, len - key_off_);
    ApplyRuleInto(o.rule, o.learning_rate, k.source->values.data() + key_off_, values, take,
                  k.target->values.data() + key_off_);
    values += take;
    n -= take;
    applied_ += take;
    key_off_ += take;
    if (key_off_ == len) {
      ++key_;
      key_off_ = 0;
    }
  }
}

Status ParamStore::PushStream::Commit() {
  if (done_) return Status(Code::kInternal, "streamed push committed twice");
  uint64_t expected = 0;
  for (const Key& k : keys_) expected += k.source->values.size();
  if (applied_ != expected) {
    Release();
    return Status(Code::kInternal, "streamed push committed with " + std::to_string(applied_) + " of " +
                                       std::to_string(expected) + " values");
  }
  // All keys or none, so that a refused push can be sent again whole. From here on no
  // waiting push revokes this stream (WaitForWriter); one that did before is seen below.
  // (The stripe locks order this store before any waiter's later look at it.)
  progress_ns_.store(kCommitting, std::memory_order_relaxed);
  const Key* lost = nullptr;
  for (const Key& k : keys_) {
    Stripe& stripe = store_->StripeFor(k.key);
    std::lock_guard<std::mutex> lock(stripe.mu);
    auto it = stripe.entries.find(k.key);
    if (k.source->writer != this || it == stripe.entries.end() || it->second != k.source) {
      lost = &k;
      break;
    }
  }
  if (lost != nullptr) {
    const std::string key = std::to_string(lost->key);
    Release();
    return Status(Code::kAborted, "streamed push not applied: its key " + key +
                                      " was handed to other pushes after the stream stalled, or replaced meanwhile");
  }
  done_ = true;
  for (Key& k : keys_) {
    Stripe& stripe = store_->StripeFor(k.key);
    std::lock_guard<std::mutex> lock(stripe.mu);
    k.source->writer = nullptr;
    store_->held_keys_.fetch_sub(1, std::memory_order_relaxed);
    k.source->readers.fetch_sub(1, std::memory_order_release);
    auto it = stripe.entries.find(k.key);
    // Replaced or erased since the check above (Insert and Erase do not wait for streams):
    // as if that happened just after this commit.
    if (it != stripe.entries.end() && it->second == k.source) {
      // The replaced block is the next stream's target (when the spares stay within
      // their budget; BeginStream lets it go if a slice still reads it then).
      store_->KeepAsSpare(*k.target, k.source);
      it->second = std::move(k.target);
    }
    stripe.released.notify_all();
  }
  keys_.clear();
  return Status::Ok();
}

void ParamStore::PushStream::Release() {
  if (done_) return;
  done_ = true;
  for (Key& k : keys_) {
    Stripe& stripe = store_->StripeFor(k.key);
    std::lock_guard<std::mutex> lock(stripe.mu);
    k.source->readers.fetch_sub(1, std::memory_order_release);
    if (k.source->writer == this) {
      k.source->writer = nullptr;
      store_->held_keys_.fetch_sub(1, std::memory_order_relaxed);
      stripe.released.notify_all();
    }
    // The unused target serves the key's next stream (it was never published).
    auto it = stripe.entries.find(k.key);
    if (it != stripe.entries.end()) store_->KeepAsSpare(*it->second, k.target);
  }
  keys_.clear();  // targets not kept are freed outside the locks
}

ParamStore::PushStream::~PushStream() { Release(); }

}  // namespace core
}  // namespace pscore
