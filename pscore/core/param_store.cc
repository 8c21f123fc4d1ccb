#include "pscore/core/param_store.h"

#include <cstring>

#include <algorithm>
#include <string>
#include <utility>

#include "pscore/core/key_range.h"

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

namespace {

// Fresh memory for n values, zero-filled, or a copy of `from`: advised into huge pages
// before its first write (AdviseHugePages, pscore/core/buffer.h), so a large key's block is
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

// ---- runs ----

namespace {

size_t StripeIndex(uint64_t key, int bits) { return KeyPosition(key) >> (64 - bits); }

Status LengthRefused(const char* what, uint64_t key, uint32_t len, size_t stored) {
  return Status(Code::kInvalidArgument, std::string(what) + " of key " + std::to_string(key) + ": length " +
                                            std::to_string(len) + " != stored length " + std::to_string(stored));
}

}  // namespace

void ParamStore::GroupByStripe(const uint64_t* keys, size_t begin, size_t end, Groups* g) {
  g->order.resize(end - begin);
  g->starts.fill(0);
  for (size_t i = begin; i < end; ++i) ++g->starts[StripeIndex(keys[i], kStripeBits) + 1];
  for (size_t s = 0; s < kStripes; ++s) g->starts[s + 1] += g->starts[s];
  std::array<size_t, kStripes> fill;
  std::copy(g->starts.begin(), g->starts.begin() + kStripes, fill.begin());
  for (size_t i = begin; i < end; ++i) g->order[fill[StripeIndex(keys[i], kStripeBits)]++] = static_cast<uint32_t>(i);
}

bool ParamStore::FindInRuns(const Stripe& stripe, uint64_t key, Cursor* c) {
  const std::vector<Run>& runs = stripe.runs;
  if (runs.empty() || key < runs.front().keys.front()) {
    *c = Cursor{};
    return false;
  }
  // The run whose range [first key, next run's first key) holds the key: the cursor's, the
  // one after it (a sorted batch walking on), or found by binary search.
  auto holds = [&](size_t r) {
    return r < runs.size() && key >= runs[r].keys.front() && (r + 1 == runs.size() || key < runs[r + 1].keys.front());
  };
  if (!holds(c->run)) {
    if (holds(c->run + 1)) {
      ++c->run;
    } else {
      auto it = std::upper_bound(runs.begin(), runs.end(), key,
                                 [](uint64_t k, const Run& run) { return k < run.keys.front(); });
      c->run = static_cast<size_t>(it - runs.begin()) - 1;
    }
    c->pos = 0;
  }
  const std::vector<uint64_t>& ks = runs[c->run].keys;
  size_t i = c->pos;
  if (i > ks.size() || (i > 0 && ks[i - 1] >= key)) i = 0;  // the batch went back
  for (int step = 0; step < 4 && i < ks.size() && ks[i] < key; ++step) ++i;
  if (i < ks.size() && ks[i] < key) {
    i = static_cast<size_t>(std::lower_bound(ks.begin() + i, ks.end(), key) - ks.begin());
  }
  c->pos = i;
  return i < ks.size() && ks[i] == key;
}

void ParamStore::AddToRuns(Stripe& stripe, const std::vector<std::pair<uint64_t, uint32_t>>& fresh) {
  if (fresh.empty()) return;
  std::vector<Run>& runs = stripe.runs;
  // Every fresh key after every stored one (new keys of a sorted batch): the last run is
  // filled up and new runs follow it, in place. Otherwise the runs are rebuilt into `out`,
  // each run that takes fresh keys merged anew.
  const bool append = runs.empty() || fresh.front().first > runs.back().keys.back();
  std::vector<Run> out;
  std::vector<Run>* dest = append ? &runs : &out;
  if (!append) out.reserve(runs.size() + fresh.size() / kRunMaxKeys + 2);
  Run cur;
  auto close = [&] {
    if (cur.keys.empty()) return;
    dest->push_back(std::move(cur));
    cur = Run{};
  };
  size_t left = 0;  // keys still to add in the current range: a new run reserves room for them
  // Run::offs stays empty while every key of the run has cur.len floats.
  auto add = [&](uint64_t key, uint32_t len, const float* src) {
    if (!cur.keys.empty() && (cur.keys.size() >= kRunMaxKeys || cur.values.size() + len > kRunMaxFloats)) close();
    if (cur.keys.empty()) {
      const size_t keys = std::min(left, kRunMaxKeys);
      cur.keys.reserve(keys);
      cur.values.reserve(std::min<size_t>(uint64_t{keys} * len, kRunMaxFloats));
      cur.len = len;
    } else if (cur.offs.empty() && len != cur.len) {
      cur.offs.reserve(cur.keys.size() + std::min(left, kRunMaxKeys) + 1);
      for (size_t i = 0; i <= cur.keys.size(); ++i) cur.offs.push_back(uint64_t{i} * cur.len);
    }
    cur.keys.push_back(key);
    if (src != nullptr) {
      cur.values.insert(cur.values.end(), src, src + len);
    } else {
      cur.values.resize(cur.values.size() + len);
    }
    if (!cur.offs.empty()) cur.offs.push_back(cur.values.size());
    if (left > 0) --left;
  };
  size_t f = 0;
  if (append) {
    if (!runs.empty()) {
      cur = std::move(runs.back());
      runs.pop_back();
    }
    left = fresh.size();
    for (; f < fresh.size(); ++f) add(fresh[f].first, fresh[f].second, nullptr);
    close();
  } else {
    for (size_t r = 0; r < runs.size(); ++r) {
      // Fresh keys below the next run's first key go into this run (into the first one also
      // those below its own first key, into the last one all that are left).
      size_t f_end = f;
      if (r + 1 == runs.size()) {
        f_end = fresh.size();
      } else {
        while (f_end < fresh.size() && fresh[f_end].first < runs[r + 1].keys.front()) ++f_end;
      }
      if (f_end == f) {
        close();
        out.push_back(std::move(runs[r]));
        continue;
      }
      if (fresh[f].first > runs[r].keys.back()) {  // all after the run's keys: appended to it
        close();
        cur = std::move(runs[r]);
        left = f_end - f;
        for (; f < f_end; ++f) add(fresh[f].first, fresh[f].second, nullptr);
        close();
        continue;
      }
      const Run& old = runs[r];
      left = old.keys.size() + (f_end - f);
      size_t i = 0;
      while (i < old.keys.size() || f < f_end) {
        if (f == f_end || (i < old.keys.size() && old.keys[i] < fresh[f].first)) {
          add(old.keys[i], old.LenAt(i), old.At(i));
          ++i;
        } else {
          add(fresh[f].first, fresh[f].second, nullptr);
          ++f;
        }
      }
      close();
    }
    left = fresh.size() - f;
    for (; f < fresh.size(); ++f) add(fresh[f].first, fresh[f].second, nullptr);  // no runs before
    close();
    runs = std::move(out);
  }
  stripe.run_keys += fresh.size();
  for (const auto& k : fresh) stripe.run_floats += k.second;
}

void ParamStore::RemoveFromRun(Stripe& stripe, const Cursor& c) {
  Run& run = stripe.runs[c.run];
  const uint32_t len = run.LenAt(c.pos);
  const uint64_t off = run.Off(c.pos);
  run.values.erase(run.values.begin() + off, run.values.begin() + off + len);
  run.keys.erase(run.keys.begin() + c.pos);
  if (!run.offs.empty()) {
    run.offs.erase(run.offs.begin() + c.pos + 1);
    for (size_t j = c.pos + 1; j < run.offs.size(); ++j) run.offs[j] -= len;
  }
  if (run.keys.empty()) stripe.runs.erase(stripe.runs.begin() + c.run);
  --stripe.run_keys;
  stripe.run_floats -= len;
}

ParamStore::Entries::iterator ParamStore::MoveToBlock(Stripe& stripe, const Cursor& c) {
  const Run& run = stripe.runs[c.run];
  const uint64_t key = run.keys[c.pos];
  std::vector<float> values = FreshValues(run.LenAt(c.pos));
  std::copy(run.At(c.pos), run.At(c.pos) + values.size(), values.begin());
  RemoveFromRun(stripe, c);
  return stripe.entries.emplace(key, std::make_shared<Block>(std::move(values))).first;
}

bool ParamStore::ApplyKey(std::unique_lock<std::mutex>& lock, Stripe& stripe, Mode mode, const Updater* updater,
                          uint64_t key, const float* incoming, uint32_t len, bool create, Cursor* c,
                          Status* refused, bool* wants_spare) {
  const bool push = mode == Mode::kPush;
  auto apply = [&](float* stored) {
    if (!push) {
      std::copy(incoming, incoming + len, stored);
    } else if (updater != nullptr) {
      (*updater)(key, stored, incoming, len);
    } else {
      ApplyBuiltIn(stored, incoming, len);
    }
  };
  if (FindInRuns(stripe, key, c)) {
    Run& run = stripe.runs[c->run];
    const uint32_t stored = run.LenAt(c->pos);
    if (stored == len) {
      apply(run.At(c->pos));
      return true;
    }
    if (push) {
      *refused = LengthRefused("push", key, len, stored);
      return true;
    }
    RemoveFromRun(stripe, *c);  // inserted anew with its new length
    *c = Cursor{};
  } else if (!stripe.entries.empty()) {
    Entries::iterator it;
    if (push) {
      ++stripe.waiters;  // no new stream starts in this stripe meanwhile
      it = FindUnheld(lock, stripe, key, len);
      --stripe.waiters;
      *c = Cursor{};  // the lock may have been let go: the walk starts over
    } else {
      it = stripe.entries.find(key);
    }
    if (it != stripe.entries.end()) {
      if (!push) {
        if (len > kRunFloats) {
          it->second = std::make_shared<Block>(std::vector<float>(incoming, incoming + len));
          return true;
        }
        stripe.entries.erase(it);  // back into a run
        return false;
      }
      if (it->second->values.size() != len) {
        *refused = LengthRefused("push", key, len, it->second->values.size());
        return true;
      }
      *wants_spare = std::exchange(it->second->wants_spare, false) && !it->second->spare.block();
      apply(Writable(it->second).data());
      return true;
    }
  }
  if (!create || len <= kRunFloats) return false;  // created by the caller (small keys in bulk)
  if (push) {
    auto it = stripe.entries.emplace(key, std::make_shared<Block>(FreshValues(len))).first;
    apply(it->second->values.data());
  } else {
    stripe.entries.emplace(key, std::make_shared<Block>(std::vector<float>(incoming, incoming + len)));
  }
  return true;
}

Status ParamStore::Apply(Mode mode, const uint64_t* keys, const uint32_t* lens, const float* values,
                         size_t num_keys) {
  if (num_keys == 0) return Status::Ok();
  const char* what = mode == Mode::kPush ? "push" : "insert";
  if (keys == nullptr || lens == nullptr) {
    return Status(Code::kInvalidArgument,
                  std::string(what) + " of " + std::to_string(num_keys) + " keys without keys or lens");
  }
  if (num_keys > UINT32_MAX) {
    return Status(Code::kInvalidArgument, std::string(what) + " of " + std::to_string(num_keys) + " keys: over 2^32");
  }
  // Where each key's values start: i * len when all have one length.
  bool uniform = true;
  uint64_t total = 0;
  for (size_t i = 0; i < num_keys; ++i) {
    total += lens[i];  // <= 2^32 * 2^32: cannot wrap.
    uniform = uniform && lens[i] == lens[0];
  }
  if (total > 0 && values == nullptr) {
    return Status(Code::kInvalidArgument,
                  std::string(what) + " of " + std::to_string(total) + " floats without values");
  }
  std::vector<uint64_t> offs;
  if (!uniform) {
    offs.resize(num_keys);
    uint64_t off = 0;
    for (size_t i = 0; i < num_keys; ++i) {
      offs[i] = off;
      off += lens[i];
    }
  }
  auto at = [&](size_t i) { return values + (uniform ? uint64_t{i} * lens[0] : offs[i]); };
  // One snapshot of the user rule for the whole batch; keeps it alive meanwhile.
  const std::shared_ptr<const Updater> updater = mode == Mode::kPush ? std::atomic_load(&updater_) : nullptr;
  Groups g;
  std::array<Cursor, kStripes> cursors{};  // hints only: FindInRuns checks them
  Status first_error;
  size_t first_refused = SIZE_MAX;
  size_t refused = 0;
  std::vector<std::pair<uint64_t, uint32_t>> spares;  // keys that asked for a spare block
  std::vector<uint32_t> missing;
  std::vector<std::pair<uint64_t, uint32_t>> fresh;
  for (size_t begin = 0; begin < num_keys; begin += kWindowKeys) {
    GroupByStripe(keys, begin, std::min(num_keys, begin + kWindowKeys), &g);
    for (size_t s = 0; s < kStripes; ++s) {
      if (g.starts[s] == g.starts[s + 1]) continue;
      Stripe& stripe = stripes_[s];
      std::unique_lock<std::mutex> lock(stripe.mu);
      Cursor& c = cursors[s];
      // ApplyKey lets go of the lock only while it waits for a stream, which needs a key
      // held as a block: with none in the stripe, nothing can change under this pass.
      bool may_wait = false;
      auto one = [&](uint32_t i, bool create) {
        may_wait = may_wait || !stripe.entries.empty();
        Status why;
        bool wants_spare = false;
        const bool done =
            ApplyKey(lock, stripe, mode, updater.get(), keys[i], at(i), lens[i], create, &c, &why, &wants_spare);
        if (wants_spare) spares.emplace_back(keys[i], lens[i]);
        if (!why.ok()) {
          ++refused;
          if (i < first_refused) {
            first_refused = i;
            first_error = std::move(why);
          }
        }
        return done;
      };
      // A key in a run with the pushed length, the common case, is applied here; every
      // other case goes through ApplyKey.
      auto in_run = [&](uint32_t i) {
        if (!FindInRuns(stripe, keys[i], &c)) return false;
        Run& run = stripe.runs[c.run];
        if (run.LenAt(c.pos) != lens[i]) return false;
        float* stored = run.At(c.pos);
        if (mode == Mode::kInsert) {
          std::copy(at(i), at(i) + lens[i], stored);
        } else if (updater != nullptr) {
          (*updater)(keys[i], stored, at(i), lens[i]);
        } else {
          ApplyBuiltIn(stored, at(i), lens[i]);
        }
        return true;
      };
      missing.clear();
      for (size_t j = g.starts[s]; j < g.starts[s + 1]; ++j) {
        const uint32_t i = g.order[j];
        if (!in_run(i) && !one(i, false)) missing.push_back(i);
      }
      if (missing.empty()) continue;
      // The keys new to the store, created with the length of their first push in the batch
      // (the small ones in bulk, into runs; the large ones at their turn), then pushed in
      // batch order.
      fresh.clear();
      for (uint32_t i : missing) fresh.emplace_back(keys[i], lens[i]);
      auto by_key = [](const auto& a, const auto& b) { return a.first < b.first; };
      if (!std::is_sorted(fresh.begin(), fresh.end(), by_key)) std::stable_sort(fresh.begin(), fresh.end(), by_key);
      auto same_key = [](const auto& a, const auto& b) { return a.first == b.first; };
      fresh.erase(std::unique(fresh.begin(), fresh.end(), same_key), fresh.end());
      fresh.erase(std::remove_if(fresh.begin(), fresh.end(), [](const auto& k) { return k.second > kRunFloats; }),
                  fresh.end());
      // A key created meanwhile (while a wait for a stream let go of the lock) stays as it is.
      c = Cursor{};
      if (may_wait) {
        fresh.erase(std::remove_if(fresh.begin(), fresh.end(),
                                   [&](const auto& k) {
                                     return FindInRuns(stripe, k.first, &c) || stripe.entries.count(k.first) != 0;
                                   }),
                    fresh.end());
      }
      AddToRuns(stripe, fresh);
      c = Cursor{};
      for (uint32_t i : missing) {
        if (in_run(i) || one(i, true)) continue;
        AddToRuns(stripe, {{keys[i], lens[i]}});  // erased meanwhile, or re-inserted with another length
        c = Cursor{};
        one(i, true);
      }
    }
  }
  for (const auto& k : spares) PrepareSpare(k.first, k.second);
  if (refused == 0) return Status::Ok();
  return Status(first_error.code(), first_error.message() + " (" + std::to_string(refused) + " of " +
                                        std::to_string(num_keys) + " keys refused)");
}

Status ParamStore::Push(const uint64_t* keys, const uint32_t* lens, const float* values, size_t num_keys) {
  return Apply(Mode::kPush, keys, lens, values, num_keys);
}

void ParamStore::Insert(const uint64_t* keys, const uint32_t* lens, const float* values, size_t num_keys) {
  Apply(Mode::kInsert, keys, lens, values, num_keys).IgnoreError();
}

void ParamStore::Insert(uint64_t key, std::vector<float> value) {
  if (value.size() <= kRunFloats) {
    const uint32_t len = static_cast<uint32_t>(value.size());
    return Insert(&key, &len, value.data(), 1);
  }
  Stripe& stripe = StripeFor(key);
  std::lock_guard<std::mutex> lock(stripe.mu);
  Cursor c;
  if (FindInRuns(stripe, key, &c)) RemoveFromRun(stripe, c);
  stripe.entries[key] = std::make_shared<Block>(std::move(value));
}

template <typename Fn>
Status ParamStore::ForEachStored(const uint64_t* keys, size_t num_keys, bool share, Fn fn) const {
  if (num_keys == 0) return Status::Ok();
  if (keys == nullptr) return Status(Code::kInvalidArgument, "pull of " + std::to_string(num_keys) + " null keys");
  if (num_keys > UINT32_MAX) {
    return Status(Code::kInvalidArgument, "pull of " + std::to_string(num_keys) + " keys: over 2^32");
  }
  Groups g;
  std::array<Cursor, kStripes> cursors{};  // hints only: FindInRuns checks them
  size_t missing = SIZE_MAX;  // the first missing key, in batch order
  for (size_t begin = 0; begin < num_keys; begin += kWindowKeys) {
    GroupByStripe(keys, begin, std::min(num_keys, begin + kWindowKeys), &g);
    for (size_t s = 0; s < kStripes; ++s) {
      if (g.starts[s] == g.starts[s + 1]) continue;
      Stripe& stripe = stripes_[s];
      std::lock_guard<std::mutex> lock(stripe.mu);
      Cursor& c = cursors[s];
      for (size_t j = g.starts[s]; j < g.starts[s + 1]; ++j) {
        const uint32_t i = g.order[j];
        if (FindInRuns(stripe, keys[i], &c)) {
          if (missing != SIZE_MAX) continue;
          if (!share) {
            const Run& run = stripe.runs[c.run];
            fn(i, run.At(c.pos), run.LenAt(c.pos), nullptr);
            continue;
          }
          auto it = MoveToBlock(stripe, c);
          c = Cursor{};
          fn(i, it->second->values.data(), static_cast<uint32_t>(it->second->values.size()), &it->second);
          continue;
        }
        auto it = stripe.entries.find(keys[i]);
        if (it == stripe.entries.end()) {
          missing = std::min<size_t>(missing, i);
        } else if (missing == SIZE_MAX) {
          fn(i, it->second->values.data(), static_cast<uint32_t>(it->second->values.size()), &it->second);
        }
      }
    }
  }
  if (missing == SIZE_MAX) return Status::Ok();
  return Status(Code::kNotFound, "pull of unknown key " + std::to_string(keys[missing]));
}

Status ParamStore::Pull(const uint64_t* keys, size_t num_keys, std::vector<uint32_t>* lens,
                        std::vector<float>* values) const {
  lens->clear();
  values->clear();
  if (num_keys > 0 && keys == nullptr) {
    return Status(Code::kInvalidArgument, "pull of " + std::to_string(num_keys) + " null keys");
  }
  lens->resize(num_keys);
  for (;;) {
    Status st = Lens(keys, num_keys, lens->data());
    if (st.ok()) {
      uint64_t total = 0;
      for (uint32_t l : *lens) total += l;
      values->resize(total);
      st = CopyValues(keys, num_keys, lens->data(), values->data());
      if (st.ok()) return st;
    }
    if (st.code() != Code::kAborted) {  // kAborted: a key replaced between the steps, read again
      lens->clear();
      values->clear();
      return st;
    }
  }
}

Status ParamStore::Lens(const uint64_t* keys, size_t num_keys, uint32_t* lens) const {
  return ForEachStored(keys, num_keys, false,
                       [&](size_t i, const float*, uint32_t len, const BlockPtr*) { lens[i] = len; });
}

Status ParamStore::CopyValues(const uint64_t* keys, size_t num_keys, const uint32_t* lens, float* out) const {
  bool uniform = true;
  for (size_t i = 0; i < num_keys && uniform; ++i) uniform = lens[i] == lens[0];
  std::vector<uint64_t> offs;
  if (!uniform) {
    offs.resize(num_keys);
    uint64_t off = 0;
    for (size_t i = 0; i < num_keys; ++i) {
      offs[i] = off;
      off += lens[i];
    }
  }
  Status changed = Status::Ok();
  size_t changed_at = SIZE_MAX;
  Status st = ForEachStored(keys, num_keys, false, [&](size_t i, const float* v, uint32_t len, const BlockPtr*) {
    if (len != lens[i]) {  // replaced by Insert since Lens: out has no room for it
      if (i < changed_at) {
        changed_at = i;
        changed = Status(Code::kAborted, "key " + std::to_string(keys[i]) + " changed from " +
                                             std::to_string(lens[i]) + " to " + std::to_string(len) +
                                             " floats while being read");
      }
      return;
    }
    if (len == 0) return;  // memcpy from an empty vector's null data is undefined
    float* dst = out + (uniform ? uint64_t{i} * lens[0] : offs[i]);
    if (len == 1) {
      *dst = *v;  // one float a key (a sparse model's rows): no call per key
    } else {
      std::memcpy(dst, v, len * sizeof(float));
    }
  });
  return st.ok() ? changed : st;
}

namespace {
// A slice reading a block's values, pinning the block (readers) until let go.
template <typename BlockPtrT>
Slice PinnedSlice(const BlockPtrT& b) {
  b->readers.fetch_add(1, std::memory_order_relaxed);  // under the stripe lock: no writer can miss it
  Slice s;
  s.data = reinterpret_cast<const char*>(b->values.data());
  s.size = b->values.size() * sizeof(float);
  s.owner = std::shared_ptr<const void>(b->values.data(), [block = b](const void*) {
    block->readers.fetch_sub(1, std::memory_order_release);
  });
  return s;
}
}  // namespace

Status ParamStore::ShareValues(const uint64_t* keys, size_t num_keys, Slice* out) const {
  return ForEachStored(keys, num_keys, true,
                       [&](size_t i, const float*, uint32_t, const BlockPtr* b) { out[i] = PinnedSlice(*b); });
}

Status ParamStore::ShareOrCopyValues(const uint64_t* keys, size_t num_keys, Slice* out) const {
  auto copies = std::make_shared<std::vector<float>>();
  std::vector<uint64_t> copied_at;  // per key: its place in copies, or UINT64_MAX
  Status st = ForEachStored(keys, num_keys, false, [&](size_t i, const float* v, uint32_t len, const BlockPtr* b) {
    if (b != nullptr) {
      out[i] = PinnedSlice(*b);
      return;
    }
    if (copied_at.empty()) copied_at.assign(num_keys, UINT64_MAX);
    copied_at[i] = copies->size();
    copies->insert(copies->end(), v, v + len);
    out[i].size = uint64_t{len} * sizeof(float);
  });
  if (!st.ok() || copied_at.empty()) return st;
  std::shared_ptr<const void> owner(copies, copies->data());
  for (size_t i = 0; i < num_keys; ++i) {
    if (copied_at[i] == UINT64_MAX) continue;
    out[i].data = reinterpret_cast<const char*>(copies->data() + copied_at[i]);
    out[i].owner = owner;
  }
  return st;
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
    std::vector<Run> kept;
    for (Run& run : stripe.runs) {
      Run left;
      left.len = run.len;
      if (!run.offs.empty()) left.offs.assign(1, 0);
      bool moved = false;
      for (size_t i = 0; i < run.keys.size(); ++i) {
        const uint32_t len = run.LenAt(i);
        if (ServerForKey(run.keys[i], num_servers) != rank) {
          out.emplace_back(run.keys[i], std::vector<float>(run.At(i), run.At(i) + len));
          moved = true;
          if (erase) {
            --stripe.run_keys;
            stripe.run_floats -= len;
            continue;
          }
        }
        if (!erase) continue;
        left.keys.push_back(run.keys[i]);
        left.values.insert(left.values.end(), run.At(i), run.At(i) + len);
        if (!left.offs.empty()) left.offs.push_back(left.values.size());
      }
      if (!erase || !moved) {
        kept.push_back(std::move(run));
      } else if (!left.keys.empty()) {
        kept.push_back(std::move(left));
      }
    }
    stripe.runs = std::move(kept);
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
    for (const Run& run : stripe.runs) {
      for (uint64_t key : run.keys) {
        if (ServerForKey(key, num_servers) != rank) return true;
      }
    }
  }
  return false;
}

size_t ParamStore::Erase(const uint64_t* keys, size_t num_keys) {
  size_t erased = 0;
  for (size_t i = 0; i < num_keys; ++i) {
    Stripe& stripe = StripeFor(keys[i]);
    std::lock_guard<std::mutex> lock(stripe.mu);
    Cursor c;
    if (FindInRuns(stripe, keys[i], &c)) {
      RemoveFromRun(stripe, c);
      ++erased;
    } else {
      erased += stripe.entries.erase(keys[i]);
    }
  }
  return erased;
}

void ParamStore::Clear() {
  for (Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    stripe.entries.clear();
    stripe.runs.clear();
    stripe.run_keys = 0;
    stripe.run_floats = 0;
  }
}

std::vector<uint64_t> ParamStore::Keys() const {
  std::vector<uint64_t> out;
  for (const Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    for (const auto& entry : stripe.entries) out.push_back(entry.first);
    for (const Run& run : stripe.runs) out.insert(out.end(), run.keys.begin(), run.keys.end());
  }
  return out;
}

size_t ParamStore::num_keys() const {
  size_t n = 0;
  for (const Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    n += stripe.entries.size() + stripe.run_keys;
  }
  return n;
}

size_t ParamStore::num_floats() const {
  size_t n = 0;
  for (const Stripe& stripe : stripes_) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    n += stripe.run_floats;
    for (const auto& entry : stripe.entries) n += entry.second->values.size();
  }
  return n;
}

}  // namespace core
}  // namespace pscore
