// ParamStore, Push and Insert of a batch: the batch is taken in windows, each grouped by
// stripe, each stripe locked once per window; a key found in a run with its length is
// folded in on the spot, other keys go through ApplyKey, and the keys new to the store are
// created in bulk (param_store.h).
#include "pscore/core/param_store.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <utility>

namespace pscore {
namespace core {

namespace {

Status LengthRefused(const char* what, uint64_t key, uint32_t len, size_t stored) {
  return Status(Code::kInvalidArgument, std::string(what) + " of key " + std::to_string(key) + ": length " +
                                            std::to_string(len) + " != stored length " + std::to_string(stored));
}

}  // namespace

// One lane of a batch of Push or Insert on its way through its stripes: what it reads is
// the whole batch's, what it writes its own.
struct ParamStore::Batch {
  Batch(Mode m, const uint64_t* k, RowLens l, const float* v, size_t n, const Offsets& o,
        std::shared_ptr<const Updater> u)
      : mode(m), keys(k), lens(l), values(v), num_keys(n), offsets(o), updater(std::move(u)) {}
  const float* At(size_t i) const { return values + offsets[i]; }
  // Key i was refused (a length other than the stored one): counted, and named when it is
  // the first in batch order.
  void Refuse(size_t i, Status why) {
    ++refused;
    if (i < first_refused) {
      first_refused = i;
      first_error = std::move(why);
    }
  }

  const Mode mode;
  const uint64_t* const keys;
  const RowLens lens;
  const float* const values;
  const size_t num_keys;
  const Offsets& offsets;
  // One snapshot of the user rule for the whole batch (a push); keeps it alive meanwhile.
  const std::shared_ptr<const Updater> updater;
  std::array<Cursor, kStripes> cursors{};  // hints only: FindInRuns checks them
  Status first_error;
  size_t first_refused = SIZE_MAX;
  size_t refused = 0;
  KeyLens spares;                 // keys that asked for a spare block
  std::vector<uint32_t> missing;  // of the stripe being applied: keys in neither layout
  KeyLens fresh;                  // of those, the ones created in bulk
};

inline bool ParamStore::FoldAt(Batch& b, Stripe& stripe, const Cursor& c, uint32_t i) {
  Run& run = stripe.runs[c.run];
  if (run.LenAt(c.pos) != b.lens[i]) return false;
  Fold(b.mode, b.updater.get(), b.keys[i], run.At(c.pos), b.At(i), b.lens[i]);
  return true;
}

bool ParamStore::ApplyToBlock(std::unique_lock<std::mutex>& lock, Stripe& stripe, Mode mode, const Updater* updater,
                              uint64_t key, const float* incoming, uint32_t len, Cursor* c, Status* refused,
                              bool* wants_spare) {
  const bool push = mode == Mode::kPush;
  Entries::iterator it;
  if (push) {
    ++stripe.waiters;  // no new stream starts in this stripe meanwhile
    it = FindUnheld(lock, stripe, key, len);
    --stripe.waiters;
    *c = Cursor{};  // the lock may have been let go: the walk starts over
  } else {
    it = stripe.entries.find(key);
  }
  if (it == stripe.entries.end()) return false;
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
  Fold(mode, updater, key, Writable(it->second).data(), incoming, len);
  return true;
}

bool ParamStore::ApplyKey(std::unique_lock<std::mutex>& lock, Stripe& stripe, Mode mode, const Updater* updater,
                          uint64_t key, const float* incoming, uint32_t len, bool create, Cursor* c,
                          Status* refused, bool* wants_spare) {
  const bool push = mode == Mode::kPush;
  if (FindInRuns(stripe, key, c)) {
    Run& run = stripe.runs[c->run];
    const uint32_t stored = run.LenAt(c->pos);
    if (stored == len) {
      Fold(mode, updater, key, run.At(c->pos), incoming, len);
      return true;
    }
    if (push) {
      *refused = LengthRefused("push", key, len, stored);
      return true;
    }
    RemoveFromRun(stripe, *c);  // inserted anew with its new length
    *c = Cursor{};
  } else if (!stripe.entries.empty() &&
             ApplyToBlock(lock, stripe, mode, updater, key, incoming, len, c, refused, wants_spare)) {
    return true;
  }
  // Not stored (an insert of a small key stored as a block took it out just above).
  if (!create || len <= kRunFloats) return false;  // created by the caller (small keys in bulk)
  if (push) {
    auto it = stripe.entries.emplace(key, std::make_shared<Block>(FreshValues(len))).first;
    Fold(mode, updater, key, it->second->values.data(), incoming, len);
  } else {
    stripe.entries.emplace(key, std::make_shared<Block>(std::vector<float>(incoming, incoming + len)));
  }
  return true;
}

bool ParamStore::ApplyOne(Batch& b, std::unique_lock<std::mutex>& lock, Stripe& stripe, Cursor* c, uint32_t i,
                          bool create) {
  Status why;
  bool wants_spare = false;
  const bool done =
      ApplyKey(lock, stripe, b.mode, b.updater.get(), b.keys[i], b.At(i), b.lens[i], create, c, &why, &wants_spare);
  if (wants_spare) b.spares.emplace_back(b.keys[i], b.lens[i]);
  if (!why.ok()) b.Refuse(i, std::move(why));
  return done;
}

void ParamStore::ApplyToStripe(Batch& b, Stripe& stripe, Cursor* c, const uint32_t* begin, const uint32_t* end) {
  std::unique_lock<std::mutex> lock(stripe.mu);
  // ApplyKey lets go of the lock only while it waits for a stream, which needs a key
  // held as a block: with none in the stripe, nothing can change under this pass.
  bool may_wait = false;
  b.missing.clear();
  for (const uint32_t* it = begin; it != end; ++it) {
    const uint32_t i = *it;
    if (FindInRuns(stripe, b.keys[i], c)) {
      if (FoldAt(b, stripe, *c, i)) continue;
    } else if (stripe.entries.empty()) {
      b.missing.push_back(i);  // in neither layout
      continue;
    }
    may_wait = may_wait || !stripe.entries.empty();
    if (!ApplyOne(b, lock, stripe, c, i, false)) b.missing.push_back(i);
  }
  if (!b.missing.empty()) CreateMissing(b, lock, stripe, c, may_wait);
}

// The keys new to the store are created with the length of their first push in the batch
// (the small ones in bulk, into runs; the large ones at their turn), then pushed in batch
// order; those of a sorted batch are pushed as the runs take them.
void ParamStore::CreateMissing(Batch& b, std::unique_lock<std::mutex>& lock, Stripe& stripe, Cursor* c,
                               bool may_wait) {
  KeyLens& fresh = b.fresh;
  fresh.clear();
  // The new keys of a sorted batch: increasing, none larger than a run holds, and the lock
  // kept since they were found missing.
  bool sorted = !may_wait;
  for (uint32_t i : b.missing) {
    const uint64_t key = b.keys[i];
    sorted = sorted && b.lens[i] <= kRunFloats && (fresh.empty() || key > fresh.back().first);
    fresh.emplace_back(key, b.lens[i]);
  }
  if (sorted) {
    // Each folded in as the runs take it, where it was written. A user rule that throws
    // ends the folds there (the keys after it stay zero-filled, as keys created but not yet
    // pushed); its exception goes on once the runs are whole again.
    std::exception_ptr thrown;
    const FreshFill fold = [&b, &thrown, this](size_t f, float* values) {
      if (thrown) return;
      const uint32_t i = b.missing[f];
      try {
        Fold(b.mode, b.updater.get(), b.keys[i], values, b.At(i), b.lens[i]);
      } catch (...) {
        thrown = std::current_exception();
      }
    };
    AddToRuns(stripe, fresh, &fold);
    *c = Cursor{};
    if (thrown) std::rethrow_exception(thrown);
    return;
  }
  auto by_key = [](const auto& x, const auto& y) { return x.first < y.first; };
  if (!std::is_sorted(fresh.begin(), fresh.end(), by_key)) std::stable_sort(fresh.begin(), fresh.end(), by_key);
  auto same_key = [](const auto& x, const auto& y) { return x.first == y.first; };
  fresh.erase(std::unique(fresh.begin(), fresh.end(), same_key), fresh.end());
  fresh.erase(std::remove_if(fresh.begin(), fresh.end(), [](const auto& k) { return k.second > kRunFloats; }),
              fresh.end());
  // A key created meanwhile (while a wait for a stream let go of the lock) stays as it is.
  *c = Cursor{};
  if (may_wait) {
    fresh.erase(std::remove_if(fresh.begin(), fresh.end(),
                               [&](const auto& k) {
                                 return FindInRuns(stripe, k.first, c) || stripe.entries.count(k.first) != 0;
                               }),
                fresh.end());
  }
  AddToRuns(stripe, fresh);
  *c = Cursor{};
  for (uint32_t i : b.missing) {
    if ((FindInRuns(stripe, b.keys[i], c) && FoldAt(b, stripe, *c, i)) || ApplyOne(b, lock, stripe, c, i, true)) {
      continue;
    }
    AddToRuns(stripe, {{b.keys[i], b.lens[i]}});  // erased meanwhile, or re-inserted with another length
    *c = Cursor{};
    ApplyOne(b, lock, stripe, c, i, true);
  }
}

Status ParamStore::Apply(Mode mode, const uint64_t* keys, RowLens lens, const float* values,
                         size_t num_keys) {
  if (num_keys == 0) return Status::Ok();
  const char* what = mode == Mode::kPush ? "push" : "insert";
  if (keys == nullptr || !lens.present()) {
    return Status(Code::kInvalidArgument,
                  std::string(what) + " of " + std::to_string(num_keys) + " keys without keys or lens");
  }
  if (num_keys > UINT32_MAX) {
    return Status(Code::kInvalidArgument, std::string(what) + " of " + std::to_string(num_keys) + " keys: over 2^32");
  }
  const Offsets offsets(lens, num_keys);
  if (offsets.total > 0 && values == nullptr) {
    return Status(Code::kInvalidArgument,
                  std::string(what) + " of " + std::to_string(offsets.total) + " floats without values");
  }
  std::shared_ptr<const Updater> updater;
  if (mode == Mode::kPush) updater = std::atomic_load(&updater_);
  // Lane 0's Batch lives here; the others' only when a batch has more than one (a small
  // push allocates none).
  Batch lane0(mode, keys, lens, values, num_keys, offsets, updater);
  std::vector<std::unique_ptr<Batch>> more;
  for (size_t l = LanesFor(num_keys, offsets.total); l > 1; --l) {
    more.push_back(std::make_unique<Batch>(mode, keys, lens, values, num_keys, offsets, updater));
  }
  auto lane = [&lane0, &more](size_t l) -> Batch& { return l == 0 ? lane0 : *more[l - 1]; };
  // Each lane its share of the stripes: a key's every occurrence in the batch is applied by
  // one lane, in batch order.
  RunLanes(1 + more.size(), [&](size_t l, size_t lanes) {
    size_t first = 0;
    size_t end = 0;
    ShareOf(l, lanes, kStripes, &first, &end);
    ApplyLane(lane(l), first, end);
  });
  const Batch* first = nullptr;  // the lane with the first refused key in batch order
  size_t refused = 0;
  for (size_t l = 0; l <= more.size(); ++l) {
    const Batch& b = lane(l);
    for (const auto& k : b.spares) PrepareSpare(k.first, k.second);
    refused += b.refused;
    if (b.refused > 0 && (first == nullptr || b.first_refused < first->first_refused)) first = &b;
  }
  if (refused == 0) return Status::Ok();
  return Status(first->first_error.code(), first->first_error.message() + " (" + std::to_string(refused) + " of " +
                                               std::to_string(num_keys) + " keys refused)");
}

void ParamStore::ApplyLane(Batch& b, size_t first, size_t end) {
  Groups g;
  for (size_t begin = 0; begin < b.num_keys; begin += kWindowKeys) {
    GroupByStripe(b.keys, begin, std::min(b.num_keys, begin + kWindowKeys), first, end, &g);
    for (size_t s = first; s < end; ++s) {
      if (g.starts[s] == g.starts[s + 1]) continue;
      ApplyToStripe(b, stripes_[s], &b.cursors[s], g.order.data() + g.starts[s], g.order.data() + g.starts[s + 1]);
    }
  }
}

Status ParamStore::Push(const uint64_t* keys, RowLens lens, const float* values, size_t num_keys) {
  return Apply(Mode::kPush, keys, lens, values, num_keys);
}

void ParamStore::Insert(const uint64_t* keys, RowLens lens, const float* values, size_t num_keys) {
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

}  // namespace core
}  // namespace pscore
