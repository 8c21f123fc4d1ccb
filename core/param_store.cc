#include "core/param_store.h"

#include <cstring>

#include <algorithm>
#include <string>
#include <utility>

#include "core/key_range.h"

namespace pscore {
namespace core {

ParamStore::ParamStore(Options opts) : opts_(opts) {}

void ParamStore::SetUpdater(Updater u) {
  std::shared_ptr<const Updater> next;
  if (u) next = std::make_shared<const Updater>(std::move(u));
  std::atomic_store(&updater_, std::move(next));
}

// The top bits of the mixed key pick the stripe, so dense keys spread evenly.
ParamStore::Stripe& ParamStore::StripeFor(uint64_t key) {
  return stripes_[KeyPosition(key) >> (64 - kStripeBits)];
}

const ParamStore::Stripe& ParamStore::StripeFor(uint64_t key) const {
  return stripes_[KeyPosition(key) >> (64 - kStripeBits)];
}

void ParamStore::ApplyBuiltIn(float* stored, const float* incoming, size_t n) const {
  switch (opts_.rule) {
    case UpdateRule::kAssign:
      std::copy(incoming, incoming + n, stored);
      break;
    case UpdateRule::kSum:
      for (size_t i = 0; i < n; ++i) stored[i] += incoming[i];
      break;
    case UpdateRule::kSgd:
      for (size_t i = 0; i < n; ++i) stored[i] -= opts_.learning_rate * incoming[i];
      break;
  }
}

namespace {

// Fresh memory for n values, zero-filled, or a copy of `from`: advised into huge pages
// before its first write (AdviseHugePages, core/buffer.h), so a large key's block is
// faulted in about 3x faster.
std::vector<float> FreshValues(size_t n, const std::vector<float>* from = nullptr) {
  std::vector<float> v;
  v.reserve(n);
  AdviseHugePages(v.data(), n * sizeof(float));
  if (from != nullptr) {
    v.insert(v.end(), from->begin(), from->end());
  } else {
    v.resize(n);
  }
  return v;
}

}  // namespace

std::vector<float>& ParamStore::Writable(BlockPtr& block) {
  // Acquire: pairs with the release of the last slice let go, so its reads (a socket
  // write on another thread) happen before this thread writes the memory.
  if (block->readers.load(std::memory_order_acquire) != 0) {
    block = std::make_shared<Block>(FreshValues(block->values.size(), &block->values));
  }
  return block->values;
}

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

Status ParamStore::PushOne(const Updater* updater, uint64_t key, const float* incoming, uint32_t len,
                           bool* wants_spare) {
  Stripe& stripe = StripeFor(key);
  std::unique_lock<std::mutex> lock(stripe.mu);
  ++stripe.waiters;  // no new stream starts in this stripe meanwhile
  auto it = FindUnheld(lock, stripe, key, len);
  --stripe.waiters;
  if (it == stripe.entries.end()) {
    it = stripe.entries.emplace(key, std::make_shared<Block>(FreshValues(len))).first;
  } else if (it->second->values.size() != len) {
    return Status(Code::kInvalidArgument, "push of key " + std::to_string(key) + ": length " +
                                              std::to_string(len) + " != stored length " +
                                              std::to_string(it->second->values.size()));
  }
  *wants_spare = std::exchange(it->second->wants_spare, false) && !it->second->spare.block();
  float* stored = Writable(it->second).data();
  if (updater != nullptr) {
    (*updater)(key, stored, incoming, len);
  } else {
    ApplyBuiltIn(stored, incoming, len);
  }
  return Status::Ok();
}

// ---- streamed pushes ----

ParamStore::StreamHold ParamStore::HoldStreamsOff(const uint64_t* keys, const uint32_t* lens, size_t num_keys) {
  StreamHold hold;
  if (keys == nullptr || lens == nullptr) return hold;
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

std::unique_ptr<ParamStore::PushStream> ParamStore::BeginStream(const uint64_t* keys, const uint32_t* lens,
                                                                size_t num_keys, Targets targets) {
  if (num_keys == 0 || keys == nullptr || lens == nullptr || std::atomic_load(&updater_) != nullptr) return nullptr;
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
    if (it == stripe.entries.end() || it->second->values.size() != lens[i] || it->second->writer != nullptr) {
      return nullptr;
    }
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
    const float* src = k.source->values.data() + key_off_;
    float* dst = k.target->values.data() + key_off_;
    switch (o.rule) {
      case UpdateRule::kAssign: std::copy(values, values + take, dst); break;
      case UpdateRule::kSum:
        for (size_t i = 0; i < take; ++i) dst[i] = src[i] + values[i];
        break;
      case UpdateRule::kSgd:
        for (size_t i = 0; i < take; ++i) dst[i] = src[i] - o.learning_rate * values[i];
        break;
    }
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

Status ParamStore::Push(const uint64_t* keys, const uint32_t* lens, const float* values,
                        size_t num_keys) {
  if (num_keys == 0) return Status::Ok();
  if (keys == nullptr || lens == nullptr) {
    return Status(Code::kInvalidArgument, "push of " + std::to_string(num_keys) +
                                              " keys without keys or lens");
  }
  uint64_t total = 0;
  for (size_t i = 0; i < num_keys; ++i) total += lens[i];  // <= 2^32 * size_t: cannot wrap.
  if (total > 0 && values == nullptr) {
    return Status(Code::kInvalidArgument,
                  "push of " + std::to_string(total) + " floats without values");
  }
  // One snapshot of the user rule for the whole batch; keeps it alive meanwhile.
  const std::shared_ptr<const Updater> updater = std::atomic_load(&updater_);
  Status first_error;
  size_t refused = 0;
  size_t offset = 0;
  for (size_t i = 0; i < num_keys; ++i) {
    bool wants_spare = false;
    Status st = PushOne(updater.get(), keys[i], values + offset, lens[i], &wants_spare);
    if (wants_spare) PrepareSpare(keys[i], lens[i]);
    offset += lens[i];
    if (!st.ok()) {
      if (refused++ == 0) first_error = std::move(st);
    }
  }
  if (refused == 0) return Status::Ok();
  return Status(first_error.code(), first_error.message() + " (" + std::to_string(refused) +
                                        " of " + std::to_string(num_keys) + " keys refused)");
}

Status ParamStore::Pull(const uint64_t* keys, size_t num_keys, std::vector<uint32_t>* lens,
                        std::vector<float>* values) const {
  lens->clear();
  values->clear();
  if (num_keys > 0 && keys == nullptr) {
    return Status(Code::kInvalidArgument, "pull of " + std::to_string(num_keys) + " null keys");
  }
  lens->reserve(num_keys);
  for (size_t i = 0; i < num_keys; ++i) {
    const Stripe& stripe = StripeFor(keys[i]);
    std::lock_guard<std::mutex> lock(stripe.mu);
    auto it = stripe.entries.find(keys[i]);
    if (it == stripe.entries.end()) {
      lens->clear();
      values->clear();
      return Status(Code::kNotFound, "pull of unknown key " + std::to_string(keys[i]));
    }
    const std::vector<float>& v = it->second->values;
    lens->push_back(static_cast<uint32_t>(v.size()));
    values->insert(values->end(), v.begin(), v.end());
  }
  return Status::Ok();
}

template <typename Fn>
Status ParamStore::ForEachStored(const uint64_t* keys, size_t num_keys, Fn fn) const {
  for (size_t i = 0; i < num_keys; ++i) {
    const Stripe& stripe = StripeFor(keys[i]);
    std::lock_guard<std::mutex> lock(stripe.mu);
    auto it = stripe.entries.find(keys[i]);
    if (it == stripe.entries.end()) return Status(Code::kNotFound, "pull of unknown key " + std::to_string(keys[i]));
    fn(i, it->second);
  }
  return Status::Ok();
}

Status ParamStore::Lens(const uint64_t* keys, size_t num_keys, uint32_t* lens) const {
  return ForEachStored(keys, num_keys, [&](size_t i, const BlockPtr& b) {
    lens[i] = static_cast<uint32_t>(b->values.size());
  });
}

Status ParamStore::CopyValues(const uint64_t* keys, size_t num_keys, const uint32_t* lens, float* out) const {
  Status changed = Status::Ok();
  Status st = ForEachStored(keys, num_keys, [&](size_t i, const BlockPtr& b) {
    if (!changed.ok()) return;
    if (b->values.size() != lens[i]) {  // replaced by Insert since Lens: out has no room for it
      changed = Status(Code::kAborted, "key " + std::to_string(keys[i]) + " changed from " + std::to_string(lens[i]) +
                                           " to " + std::to_string(b->values.size()) + " floats while being read");
      return;
    }
    if (b->values.empty()) return;  // memcpy from an empty vector's null data is undefined
    std::memcpy(out, b->values.data(), b->values.size() * sizeof(float));
    out += b->values.size();
  });
  return st.ok() ? changed : st;
}

Status ParamStore::ShareValues(const uint64_t* keys, size_t num_keys, Slice* out) const {
  return ForEachStored(keys, num_keys, [&](size_t i, const BlockPtr& b) {
    b->readers.fetch_add(1, std::memory_order_relaxed);  // under the stripe lock: no writer can miss it
    const std::vector<float>& v = b->values;
    out[i].data = reinterpret_cast<const char*>(v.data());
    out[i].size = v.size() * sizeof(float);
    out[i].owner = std::shared_ptr<const void>(v.data(), [block = b](const void*) {
      block->readers.fetch_sub(1, std::memory_order_release);
    });
  });
}

std::vector<std::pair<uint64_t, std::vector<float>>> ParamStore::ExtractNotOwned(
    int rank, int num_servers, bool erase) {
  std::vector<std::pair<uint64_t, std::vector<float>>> out;
  if (num_servers <= 0) return out;
  for (Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    for (auto it = stripe.entries.begin(); it != stripe.entries.end();) {
      if (ServerForKey(it->first, num_servers) == rank) {
        ++it;
      } else if (erase) {
        Block& b = *it->second;
        // Pinned values are read by a socket write: copied, not moved away under it.
        if (b.readers.load(std::memory_order_acquire) == 0) {
          out.emplace_back(it->first, std::move(b.values));
        } else {
          out.emplace_back(it->first, b.values);
        }
        it = stripe.entries.erase(it);
      } else {
        out.emplace_back(it->first, it->second->values);
        ++it;
      }
    }
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

bool ParamStore::HasNotOwned(int rank, int num_servers) const {
  if (num_servers <= 0) return false;
  for (const Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    for (const auto& entry : stripe.entries) {
      if (ServerForKey(entry.first, num_servers) != rank) return true;
    }
  }
  return false;
}

size_t ParamStore::Erase(const uint64_t* keys, size_t num_keys) {
  size_t erased = 0;
  for (size_t i = 0; i < num_keys; ++i) {
    Stripe& stripe = StripeFor(keys[i]);
    std::lock_guard<std::mutex> lock(stripe.mu);
    erased += stripe.entries.erase(keys[i]);
  }
  return erased;
}

void ParamStore::Insert(uint64_t key, std::vector<float> value) {
  Stripe& stripe = StripeFor(key);
  std::lock_guard<std::mutex> lock(stripe.mu);
  stripe.entries[key] = std::make_shared<Block>(std::move(value));
}

void ParamStore::Clear() {
  for (Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    stripe.entries.clear();
  }
}

std::vector<uint64_t> ParamStore::Keys() const {
  std::vector<uint64_t> out;
  for (const Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    for (const auto& entry : stripe.entries) out.push_back(entry.first);
  }
  return out;
}

size_t ParamStore::num_keys() const {
  size_t n = 0;
  for (const Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    n += stripe.entries.size();
  }
  return n;
}

size_t ParamStore::num_floats() const {
  size_t n = 0;
  for (const Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    for (const auto& entry : stripe.entries) n += entry.second->values.size();
  }
  return n;
}

}  // namespace core
}  // namespace pscore
