// ParamStore, the runs: keys of up to kRunFloats floats held sorted with their values back
// to back (param_store.h). Finding a key by walking on from the previous one, adding the
// keys a batch creates in bulk, and moving a key out of its run.
#include "pscore/core/param_store.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "pscore/core/key_range.h"

namespace pscore {
namespace core {

namespace {
size_t StripeIndex(uint64_t key, int bits) { return KeyPosition(key) >> (64 - bits); }
}  // namespace

void ParamStore::GroupByStripe(const uint64_t* keys, size_t begin, size_t end, size_t first, size_t last,
                               Groups* g) {
  g->starts.fill(0);
  for (size_t i = begin; i < end; ++i) ++g->starts[StripeIndex(keys[i], kStripeBits) + 1];
  for (size_t s = 0; s < kStripes; ++s) {
    if (s < first || s >= last) g->starts[s + 1] = 0;
    g->starts[s + 1] += g->starts[s];
  }
  g->order.resize(g->starts[kStripes]);
  std::array<size_t, kStripes> fill;
  std::copy(g->starts.begin(), g->starts.begin() + kStripes, fill.begin());
  for (size_t i = begin; i < end; ++i) {
    const size_t s = StripeIndex(keys[i], kStripeBits);
    if (s >= first && s < last) g->order[fill[s]++] = static_cast<uint32_t>(i);
  }
}

// Writes keys in key order into runs of at most kRunMaxKeys keys and kRunMaxFloats floats,
// appending each run it closes to *dest. Run::offs stays empty while every key of the run
// has the run's one length.
class ParamStore::RunWriter {
 public:
  // Each fresh key's values, zero-filled, go through *fill (when given) as they are written.
  RunWriter(std::vector<Run>* dest, const FreshFill* fill) : dest_(dest), fill_(fill) {}
  // Every run this writer starts or continues gets the room of a whole run at once: for
  // the appends of a sorted batch, whose next window adds more keys to the same run (with
  // room for only the keys at hand, a run would be moved twice on its way to full).
  void ReserveWholeRuns() { whole_ = true; }
  // The next keys go after `run`'s own (they are all larger), into it while it has room.
  void Continue(Run run) {
    Close();
    cur_ = std::move(run);
    if (whole_ && !cur_.keys.empty()) Reserve(kRunMaxKeys);
  }
  // `keys` keys are still to come in the current range: a new run reserves room for them.
  void Expect(size_t keys) { left_ = keys; }
  // Adds key with len floats, copied from src, or zero-filled when src is null.
  void Add(uint64_t key, uint32_t len, const float* src) {
    if (!cur_.keys.empty() && (cur_.keys.size() >= kRunMaxKeys || cur_.values.size() + len > kRunMaxFloats)) {
      Close();
    }
    if (cur_.keys.empty()) {
      cur_.len = len;
      Reserve(whole_ ? kRunMaxKeys : std::min(left_, kRunMaxKeys));
    } else if (cur_.offs.empty() && len != cur_.len) {
      cur_.offs.reserve(cur_.keys.size() + std::min(left_, kRunMaxKeys) + 1);
      for (size_t i = 0; i <= cur_.keys.size(); ++i) cur_.offs.push_back(uint64_t{i} * cur_.len);
    }
    cur_.keys.push_back(key);
    if (src != nullptr) {
      cur_.values.insert(cur_.values.end(), src, src + len);
    } else {
      cur_.values.resize(cur_.values.size() + len);
    }
    if (!cur_.offs.empty()) cur_.offs.push_back(cur_.values.size());
    if (left_ > 0) --left_;
  }
  // Adds fresh key f, zero-filled, then filled.
  void AddFreshKey(const KeyLens& fresh, size_t f) {
    const uint32_t len = fresh[f].second;
    Add(fresh[f].first, len, nullptr);
    if (fill_ != nullptr) (*fill_)(f, cur_.values.data() + cur_.values.size() - len);
  }
  // Adds fresh[*f, end) zero-filled, then filled; *f ends at end.
  void AddFresh(const KeyLens& fresh, size_t* f, size_t end) {
    Expect(end - *f);
    while (*f < end) {
      AddFreshKey(fresh, *f);
      ++*f;
      if (!cur_.offs.empty()) continue;
      // The keys after it of the run's one length, as many as the run has room for: their
      // values zero-filled at once.
      const uint32_t len = cur_.len;
      size_t room = kRunMaxKeys - cur_.keys.size();
      if (len > 0) room = std::min(room, (kRunMaxFloats - cur_.values.size()) / len);
      const size_t from = *f;
      const size_t base = cur_.values.size();
      for (; *f < end && *f - from < room && fresh[*f].second == len; ++*f) cur_.keys.push_back(fresh[*f].first);
      cur_.values.resize(base + (*f - from) * len);
      if (fill_ != nullptr) {
        for (size_t j = from; j < *f; ++j) (*fill_)(j, cur_.values.data() + base + (j - from) * len);
      }
      left_ -= std::min(left_, *f - from);
    }
  }
  // Adds keys [i, end) of `run` (stored ones, all below the keys still to come) with their
  // values: a stretch of keys of one length that fits in the run being written in one go.
  void AddStored(const Run& run, size_t i, size_t end) {
    while (i < end) {
      Add(run.keys[i], run.LenAt(i), run.At(i));
      ++i;
      if (!cur_.offs.empty() || !run.offs.empty()) continue;  // lengths differ: key by key
      const uint32_t len = cur_.len;  // == run.len: the key just added has it
      size_t room = kRunMaxKeys - cur_.keys.size();
      if (len > 0) room = std::min(room, (kRunMaxFloats - cur_.values.size()) / len);
      const size_t n = std::min(room, end - i);
      cur_.keys.insert(cur_.keys.end(), run.keys.begin() + i, run.keys.begin() + i + n);
      cur_.values.insert(cur_.values.end(), run.At(i), run.At(i) + n * len);
      left_ -= std::min(left_, n);
      i += n;
    }
  }
  // Ends the run being written (if any).
  void Close() {
    if (cur_.keys.empty()) return;
    dest_->push_back(std::move(cur_));
    cur_ = Run{};
  }

 private:
  // Room in the current run for `keys` more keys of its length, or for as many as a run
  // holds (any length, when its lengths differ).
  void Reserve(size_t keys) {
    if (!cur_.offs.empty()) {
      cur_.keys.reserve(kRunMaxKeys);
      cur_.values.reserve(kRunMaxFloats);
      return;
    }
    size_t most = kRunMaxKeys;
    if (cur_.len > 0) most = std::min(most, kRunMaxFloats / cur_.len);
    const size_t total = std::min(most, cur_.keys.size() + keys);
    cur_.keys.reserve(total);
    cur_.values.reserve(uint64_t{total} * cur_.len);
  }

  std::vector<Run>* dest_;
  const FreshFill* fill_;
  Run cur_;
  size_t left_ = 0;
  bool whole_ = false;
};

bool ParamStore::SeekInRuns(const Stripe& stripe, uint64_t key, Cursor* c) {
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
  const RunVector<uint64_t>& ks = runs[c->run].keys;
  size_t i = c->pos;
  if (i > ks.size() || (i > 0 && ks[i - 1] >= key)) i = 0;  // the batch went back
  for (int step = 0; step < 4 && i < ks.size() && ks[i] < key; ++step) ++i;
  if (i < ks.size() && ks[i] < key) {
    // Further on: bracket the key in steps that double (ks[lo] < key <= ks[hi]), then
    // search the bracket, so a gap of g keys reads about 2 log g of them, near each other.
    size_t lo = i;
    size_t step = 8;
    while (lo + step < ks.size() && ks[lo + step] < key) {
      lo += step;
      step *= 2;
    }
    const size_t hi = std::min(ks.size(), lo + step);
    i = static_cast<size_t>(std::lower_bound(ks.begin() + lo + 1, ks.begin() + hi, key) - ks.begin());
  }
  c->pos = i;
  return i < ks.size() && ks[i] == key;
}

void ParamStore::AddToRuns(Stripe& stripe, const KeyLens& fresh, const FreshFill* fill) {
  if (fresh.empty()) return;
  std::vector<Run>& runs = stripe.runs;
  // Every fresh key after every stored one: the new keys of a sorted batch.
  if (runs.empty() || fresh.front().first > runs.back().keys.back()) {
    AppendToRuns(runs, fresh, fill);
  } else {
    MergeIntoRuns(runs, fresh, fill);
  }
  stripe.run_keys += fresh.size();
  for (const auto& k : fresh) stripe.run_floats += k.second;
}

void ParamStore::AppendToRuns(std::vector<Run>& runs, const KeyLens& fresh, const FreshFill* fill) {
  Run last;
  if (!runs.empty()) {
    last = std::move(runs.back());
    runs.pop_back();
  }
  RunWriter w(&runs, fill);
  if (fresh.size() >= kBulkAppendKeys) w.ReserveWholeRuns();
  w.Continue(std::move(last));
  size_t f = 0;
  w.AddFresh(fresh, &f, fresh.size());
  w.Close();
}

void ParamStore::MergeIntoRuns(std::vector<Run>& runs, const KeyLens& fresh, const FreshFill* fill) {
  // Only the runs from the one the first fresh key falls in to the one the last falls in
  // are written anew; a fresh key below every run goes into the first.
  auto run_of = [&runs](uint64_t key) {
    auto it = std::upper_bound(runs.begin(), runs.end(), key,
                               [](uint64_t k, const Run& run) { return k < run.keys.front(); });
    return it == runs.begin() ? size_t{0} : static_cast<size_t>(it - runs.begin()) - 1;
  };
  const size_t first = run_of(fresh.front().first);
  const size_t last = run_of(fresh.back().first);
  std::vector<Run> out;
  RunWriter w(&out, fill);
  size_t f = 0;
  for (size_t r = first; r <= last; ++r) {
    // Fresh keys below the next run's first key go into this run (into the last one all
    // that are left).
    size_t f_end = f;
    if (r == last) {
      f_end = fresh.size();
    } else {
      while (f_end < fresh.size() && fresh[f_end].first < runs[r + 1].keys.front()) ++f_end;
    }
    if (f_end == f) {
      w.Close();
      out.push_back(std::move(runs[r]));
      continue;
    }
    if (fresh[f].first > runs[r].keys.back()) {  // all after the run's keys: appended to it
      w.Continue(std::move(runs[r]));
      w.AddFresh(fresh, &f, f_end);
      w.Close();
      continue;
    }
    const Run& old = runs[r];
    w.Expect(old.keys.size() + (f_end - f));
    size_t i = 0;
    while (i < old.keys.size() || f < f_end) {
      if (f == f_end || (i < old.keys.size() && old.keys[i] < fresh[f].first)) {
        // The stored keys below the next fresh one.
        const size_t j = f == f_end ? old.keys.size()
                                    : static_cast<size_t>(std::lower_bound(old.keys.begin() + i, old.keys.end(),
                                                                           fresh[f].first) -
                                                          old.keys.begin());
        w.AddStored(old, i, j);
        i = j;
      } else {
        w.AddFreshKey(fresh, f);
        ++f;
      }
    }
    w.Close();
  }
  // The runs written take the place of runs [first, last].
  const size_t replaced = last + 1 - first;
  const size_t moved = std::min(out.size(), replaced);
  std::move(out.begin(), out.begin() + moved, runs.begin() + first);
  if (out.size() > replaced) {
    runs.insert(runs.begin() + last + 1, std::make_move_iterator(out.begin() + moved),
                std::make_move_iterator(out.end()));
  } else {
    runs.erase(runs.begin() + first + moved, runs.begin() + last + 1);
  }
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

}  // namespace core
}  // namespace pscore
