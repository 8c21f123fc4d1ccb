// ParamStore's two layouts (runs of small keys, blocks of large or shared ones) against a
// reference model, a std::map of key to values, on random batches: dense and sparse key
// sets, mixed lengths, large values, length refusals, inserts, erases, shared slices,
// moves of key ranges between servers (scale-out and back), and journal replay.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "pscore/core/key_range.h"
#include "pscore/core/kv_codec.h"
#include "pscore/core/param_journal.h"
#include "pscore/core/param_store.h"

// Catch2 last: glog (via pscore/core/status.h) also defines CHECK, and the last
// definition wins. We want Catch's.
#include <catch2/catch.hpp>

#include "core/param_store_util.h"

namespace pscore::core {
namespace {

using testing::Rule;
using Model = std::map<uint64_t, std::vector<float>>;

struct Batch {
  std::vector<uint64_t> keys;
  std::vector<uint32_t> lens;
  std::vector<float> values;
};

// The store's documented behaviour, one key at a time.
struct Reference {
  UpdateRule rule;
  float lr;
  Model m;

  size_t Push(const Batch& b) {
    size_t refused = 0;
    size_t off = 0;
    for (size_t i = 0; i < b.keys.size(); ++i) {
      auto it = m.find(b.keys[i]);
      if (it == m.end()) it = m.emplace(b.keys[i], std::vector<float>(b.lens[i], 0.0f)).first;
      if (it->second.size() != b.lens[i]) {
        ++refused;
      } else {
        for (uint32_t j = 0; j < b.lens[i]; ++j) {
          const float in = b.values[off + j];
          float& v = it->second[j];
          v = rule == UpdateRule::kAssign ? in : rule == UpdateRule::kSum ? v + in : v - lr * in;
        }
      }
      off += b.lens[i];
    }
    return refused;
  }
  void Insert(const Batch& b) {
    size_t off = 0;
    for (size_t i = 0; i < b.keys.size(); ++i) {
      m[b.keys[i]].assign(b.values.begin() + off, b.values.begin() + off + b.lens[i]);
      off += b.lens[i];
    }
  }
};

// The first place two sorted key lists differ, for a failure message.
std::string FirstKeyDifference(const std::vector<uint64_t>& got, const std::vector<uint64_t>& want) {
  const auto at = std::mismatch(got.begin(), got.end(), want.begin(), want.end());
  const auto name = [](auto it, auto end) { return it == end ? std::string("(none)") : std::to_string(*it); };
  return "store has " + std::to_string(got.size()) + " keys, model " + std::to_string(want.size()) +
         "; first difference at index " + std::to_string(at.first - got.begin()) + ": store " +
         name(at.first, got.end()) + ", model " + name(at.second, want.end());
}

// Every key, length and value of the store equals the model's. A difference fails with
// the first differing key, not with the whole store printed.
void RequireEqual(const ParamStore& store, const Model& m) {
  std::vector<uint64_t> keys = store.Keys();
  std::sort(keys.begin(), keys.end());
  std::vector<uint64_t> want;
  size_t floats = 0;
  for (const auto& e : m) {
    want.push_back(e.first);
    floats += e.second.size();
  }
  if (keys != want) FAIL(FirstKeyDifference(keys, want));
  REQUIRE(store.num_keys() == m.size());
  REQUIRE(store.num_floats() == floats);
  std::vector<uint32_t> lens;
  std::vector<float> values;
  REQUIRE(store.Pull(want.data(), want.size(), &lens, &values).ok());
  REQUIRE(lens.size() == want.size());
  REQUIRE(values.size() == floats);
  size_t off = 0;
  size_t i = 0;
  for (const auto& e : m) {
    const std::vector<float>& w = e.second;
    if (lens[i] != w.size()) FAIL("key " << e.first << ": store length " << lens[i] << ", model " << w.size());
    const auto at = std::mismatch(w.begin(), w.end(), values.begin() + off);
    if (at.first != w.end()) {
      FAIL("key " << e.first << ", value " << at.first - w.begin() << " of " << w.size() << ": store "
                  << *at.second << ", model " << *at.first);
    }
    off += w.size();
    ++i;
  }
}

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  uint64_t Key() {
    switch (Pick(4)) {
      case 0:
      case 1: return Pick(4000);                    // dense
      case 2: return rng_() | (uint64_t{1} << 40);  // sparse over the id space
      default: return sparse_[Pick(sparse_.size())];
    }
  }
  // A key's length: fixed per key mostly (so most pushes apply), now and then another
  // one (refused), and some keys larger than a run holds.
  uint32_t Len(uint64_t key) {
    if (Pick(50) == 0) return 1 + static_cast<uint32_t>(Pick(8));
    switch (key % 7) {
      case 0: return 4;
      case 1: return static_cast<uint32_t>(1 + key % 13);
      case 2: return key % 3 == 0 ? ParamStore::kRunFloats + 16 : 8;
      case 3: return ParamStore::kRunFloats;
      default: return 1;
    }
  }
  Batch Make(size_t n, bool sorted) {
    Batch b;
    for (size_t i = 0; i < n; ++i) b.keys.push_back(Key());
    if (sorted) std::sort(b.keys.begin(), b.keys.end());
    for (uint64_t k : b.keys) {
      b.lens.push_back(Len(k));
      for (uint32_t j = 0; j < b.lens.back(); ++j) b.values.push_back(static_cast<float>(Pick(17)) - 8.0f);
    }
    return b;
  }
  size_t Pick(size_t n) { return static_cast<size_t>(rng_() % n); }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  std::vector<uint64_t> sparse_ = {7ull << 50, (7ull << 50) + 1, (7ull << 50) + 2, ~0ull, ~0ull - 1, 1ull << 63};
};

void RandomRounds(UpdateRule rule, uint64_t seed) {
  ParamStore store(Rule(rule, 0.5f));
  Reference ref{rule, 0.5f, {}};
  Gen gen(seed);
  std::vector<Slice> held;  // slices kept across pushes (keys moved to blocks)
  for (int round = 0; round < 120; ++round) {
    const size_t n = gen.Pick(4) == 0 ? 1 + gen.Pick(4) : 50 + gen.Pick(1500);
    Batch b = gen.Make(n, gen.Pick(3) != 0);
    switch (gen.Pick(10)) {
      case 0: {
        store.Insert(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size());
        ref.Insert(b);
        break;
      }
      case 1: {
        std::vector<uint64_t> gone(b.keys.begin(), b.keys.begin() + std::min<size_t>(b.keys.size(), 40));
        size_t want = 0;
        for (uint64_t k : gone) want += ref.m.erase(k);
        CHECK(store.Erase(gone.data(), gone.size()) == want);
        break;
      }
      case 2: {
        // Some stored keys are shared (moved out of their runs) and held for a while.
        std::vector<uint64_t> keys;
        for (const auto& e : ref.m) {
          if (gen.Pick(20) == 0) keys.push_back(e.first);
        }
        std::vector<Slice> s(keys.size());
        REQUIRE(store.ShareValues(keys.data(), keys.size(), s.data()).ok());
        for (size_t i = 0; i < keys.size(); ++i) {
          const std::vector<float>& v = ref.m.at(keys[i]);
          REQUIRE(s[i].size == v.size() * sizeof(float));
          if (!v.empty()) REQUIRE(std::equal(v.begin(), v.end(), reinterpret_cast<const float*>(s[i].data)));
        }
        held = std::move(s);
        break;
      }
      default: {
        const size_t refused = ref.Push(b);
        Status st = store.Push(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size());
        CHECK(st.ok() == (refused == 0));
        if (refused > 0) {
          CHECK(st.code() == Code::kInvalidArgument);
          CHECK(st.message().find("(" + std::to_string(refused) + " of ") != std::string::npos);
        }
      }
    }
    if (round % 10 == 9) RequireEqual(store, ref.m);
  }
  RequireEqual(store, ref.m);
  // A pull of a batch with a missing key names the first one in batch order.
  std::vector<uint64_t> ask;
  for (const auto& e : ref.m) ask.push_back(e.first);
  std::shuffle(ask.begin(), ask.end(), gen.rng());
  ask.insert(ask.begin() + ask.size() / 2, {(3ull << 40) + 5, (3ull << 40) + 6});
  std::vector<uint32_t> lens;
  std::vector<float> values;
  Status st = store.Pull(ask.data(), ask.size(), &lens, &values);
  CHECK(st.code() == Code::kNotFound);
  CHECK(st.message().find(std::to_string((3ull << 40) + 5)) != std::string::npos);
  CHECK(lens.empty());
}

}  // namespace

TEST_CASE("runs: random batches give the reference model's store under every rule", "[core][paramstore]") {
  RandomRounds(UpdateRule::kSum, 1);
  RandomRounds(UpdateRule::kAssign, 2);
  RandomRounds(UpdateRule::kSgd, 3);
}

TEST_CASE("runs: a user rule sees each key's stored and incoming values, in batch order", "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  std::vector<uint64_t> seen;
  store.SetUpdater([&](uint64_t key, float* stored, const float* in, size_t n) {
    seen.push_back(key);
    for (size_t i = 0; i < n; ++i) stored[i] = stored[i] * 2 + in[i];
  });
  // Unsorted, a key twice, new keys: created zero-filled, then folded in order.
  std::vector<uint64_t> keys = {9, 3, 9, 1ull << 60};
  std::vector<uint32_t> lens = {1, 2, 1, 1};
  std::vector<float> values = {1, 2, 3, 4, 5};
  REQUIRE(store.Push(keys.data(), lens.data(), values.data(), keys.size()).ok());
  CHECK(testing::PullOne(store, 9) == std::vector<float>{2 * 1 + 4});
  CHECK(testing::PullOne(store, 3) == std::vector<float>{2, 3});
  CHECK(testing::PullOne(store, 1ull << 60) == std::vector<float>{5});
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<uint64_t>{3, 9, 9, 1ull << 60});
}

TEST_CASE("runs: a user rule folds new keys of a sorted batch after the stored ones, in batch order",
          "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  std::vector<uint64_t> seen;
  store.SetUpdater([&](uint64_t key, float* stored, const float* in, size_t n) {
    seen.push_back(key);
    for (size_t i = 0; i < n; ++i) stored[i] = stored[i] * 2 + in[i] + 1;
  });
  // Enough keys that every stripe's runs fill up and new ones open, in two pushes: the
  // second's keys all above the first's.
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 200000; ++k) keys.push_back(k * 3);
  std::vector<uint32_t> lens(keys.size(), 2);
  std::vector<float> values(keys.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  const size_t half = keys.size() / 2;
  REQUIRE(store.Push(keys.data(), lens.data(), values.data(), half).ok());
  REQUIRE(store.Push(keys.data() + half, lens.data(), values.data() + half * 2, keys.size() - half).ok());
  std::vector<uint32_t> got_lens;
  std::vector<float> got;
  REQUIRE(store.Pull(keys.data(), keys.size(), &got_lens, &got).ok());
  REQUIRE(got.size() == values.size());
  for (size_t i = 0; i < values.size(); ++i) REQUIRE(got[i] == values[i] + 1);  // 0 * 2 + in + 1
  std::sort(seen.begin(), seen.end());
  CHECK(seen == keys);
}

TEST_CASE("runs: a dense key set in many pushes, then pulled whole and in slices", "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  constexpr uint64_t kKeys = 20000;
  for (uint64_t start = 0; start < kKeys; start += 2500) {  // each push appends keys
    std::vector<uint64_t> keys;
    for (uint64_t k = start; k < start + 2500; ++k) keys.push_back(k);
    std::vector<uint32_t> lens(keys.size(), 3);
    std::vector<float> values(keys.size() * 3);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(start * 3 + i);
    REQUIRE(store.Push(keys.data(), lens.data(), values.data(), keys.size()).ok());
    REQUIRE(store.Push(keys.data(), lens.data(), values.data(), keys.size()).ok());  // present now
  }
  // Every other key again, from the top down (a batch walking backwards).
  std::vector<uint64_t> keys;
  for (uint64_t k = kKeys; k-- > 0;) {
    if (k % 2 == 0) keys.push_back(k);
  }
  std::vector<uint32_t> lens;
  std::vector<float> values;
  REQUIRE(store.Pull(keys.data(), keys.size(), &lens, &values).ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(lens[i] == 3);
    for (uint32_t j = 0; j < 3; ++j) REQUIRE(values[i * 3 + j] == 2.0f * static_cast<float>(keys[i] * 3 + j));
  }
  CHECK(store.num_keys() == kKeys);
  CHECK(store.num_floats() == kKeys * 3);
}

TEST_CASE("runs: sorted batches asking every k-th stored key, or keys between stored ones, find exactly those",
          "[core][paramstore]") {
  // Each stripe holds about 3,000 keys in three runs; a batch of every k-th stored key
  // walks each stripe's runs in steps of about k (near steps inline, far ones bracketed),
  // across run ends. Every pull gets each key's own values; every push changes only its keys.
  ParamStore store(Rule(UpdateRule::kSum));
  constexpr size_t kKeys = 64 * 3000;
  std::vector<uint64_t> stored(kKeys);
  std::vector<float> want(kKeys * 2);
  for (size_t i = 0; i < kKeys; ++i) {
    stored[i] = i * 7919 + 3;  // spread: neighbours fall in different stripes
    want[i * 2] = static_cast<float>(i);
    want[i * 2 + 1] = -static_cast<float>(i);
  }
  REQUIRE(store.Push(stored.data(), RowLens::All(2), want.data(), kKeys).ok());
  std::mt19937_64 gen(11);
  std::vector<std::vector<size_t>> picks;  // indices into stored, ascending
  for (size_t k : {1, 2, 3, 4, 5, 6, 7, 9, 16, 33, 200, 5000}) {
    picks.emplace_back();
    for (size_t i = k / 2; i < kKeys; i += k) picks.back().push_back(i);
  }
  for (unsigned shift : {1u, 3u}) {  // each key with chance 1/2, then 1/8
    picks.emplace_back();
    for (size_t i = 0; i < kKeys; ++i) {
      if (gen() % (1u << shift) == 0) picks.back().push_back(i);
    }
  }
  for (const std::vector<size_t>& pick : picks) {
    INFO("a batch of " << pick.size() << " keys");
    std::vector<uint64_t> keys;
    std::vector<float> ones;
    for (size_t i : pick) keys.push_back(stored[i]);
    std::vector<float> got(keys.size() * 2);
    REQUIRE(store.CopyUniform(keys.data(), keys.size(), 2, got.data()).ok());
    for (size_t j = 0; j < pick.size(); ++j) {
      REQUIRE(got[j * 2] == want[pick[j] * 2]);
      REQUIRE(got[j * 2 + 1] == want[pick[j] * 2 + 1]);
    }
    ones.assign(keys.size() * 2, 1.0f);
    REQUIRE(store.Push(keys.data(), RowLens::All(2), ones.data(), keys.size()).ok());
    for (size_t i : pick) {
      want[i * 2] += 1.0f;
      want[i * 2 + 1] += 1.0f;
    }
    got.resize(kKeys * 2);
    REQUIRE(store.CopyUniform(stored.data(), kKeys, 2, got.data()).ok());
    REQUIRE(got == want);
    // A key between two stored ones, in the batch's middle (still sorted), is in no run.
    const size_t mid = pick.size() / 2;
    const uint64_t absent = stored[pick[mid]] + 1;
    keys.insert(keys.begin() + static_cast<std::ptrdiff_t>(mid + 1), absent);
    std::vector<uint32_t> lens(keys.size());
    Status st = store.Lens(keys.data(), keys.size(), lens.data());
    REQUIRE(st.code() == Code::kNotFound);
    REQUIRE(st.message().find(std::to_string(absent)) != std::string::npos);
  }
  CHECK(store.num_keys() == kKeys);
}

TEST_CASE("runs: sorted batches of new keys after all stored ones, lengths changing inside a run, equal the model",
          "[core][paramstore]") {
  // New keys above every stored one fill the last run in place and open runs after it; a
  // key of another length in the middle of a run gives that run offsets from there on.
  // Every other batch brings more than kBulkAppendKeys keys to each stripe (runs then take
  // a whole run's room at once). Then keys between the stored ones (merged into runs) and
  // present keys again.
  for (UpdateRule rule : {UpdateRule::kSum, UpdateRule::kAssign, UpdateRule::kSgd}) {
    ParamStore store(Rule(rule));
    Reference ref{rule, 0.01f, {}};
    uint64_t next = 1000;
    float v = 1;
    auto batch = [&](const std::vector<uint64_t>& keys, size_t odd_every) {
      Batch b;
      b.keys = keys;
      for (size_t i = 0; i < keys.size(); ++i) {
        // A key's length follows from the key, so pushes of present keys keep it.
        const uint32_t len = odd_every != 0 && keys[i] % odd_every == 0 ? static_cast<uint32_t>(keys[i] % 5) : 1;
        b.lens.push_back(len);
        for (uint32_t j = 0; j < len; ++j) b.values.push_back(v++);
      }
      return b;
    };
    std::vector<uint64_t> all;
    for (int round = 0; round < 12; ++round) {
      std::vector<uint64_t> keys;
      const int count = round % 2 == 0 ? 3000 : 12000;
      for (int i = 0; i < count; ++i) keys.push_back(next += 2);  // sorted, above every stored key
      all.insert(all.end(), keys.begin(), keys.end());
      Batch b = batch(keys, round % 3 == 0 ? 0 : 97);
      if (round % 4 == 3) {  // an insert creates its new keys the same way
        store.Insert(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size());
        ref.Insert(b);
      } else {
        REQUIRE(store.Push(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size()).ok() == (ref.Push(b) == 0));
      }
      RequireEqual(store, ref.m);
    }
    std::vector<uint64_t> between;  // the odd keys between the stored even ones
    for (size_t i = 0; i < all.size(); i += 7) between.push_back(all[i] + 1);
    Batch b = batch(between, 97);
    REQUIRE(store.Push(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size()).ok() == (ref.Push(b) == 0));
    RequireEqual(store, ref.m);
    std::vector<uint64_t> present(all.begin(), all.begin() + 5000);
    b = batch(present, 97);
    REQUIRE(store.Push(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size()).ok() == (ref.Push(b) == 0));
    RequireEqual(store, ref.m);
  }
}

TEST_CASE("runs: sorted batches of new keys below, between and above stored ones, mixed with present ones, equal the model",
          "[core][paramstore]") {
  // Each batch is strictly increasing: its new keys are folded in as the runs take them
  // (merged between stored keys, appended after them, put before the first), lengths
  // changing inside a run, some present keys pushed with another length (refused).
  for (UpdateRule rule : {UpdateRule::kSum, UpdateRule::kAssign, UpdateRule::kSgd}) {
    ParamStore store(Rule(rule));
    Reference ref{rule, 0.01f, {}};
    std::mt19937_64 gen(static_cast<uint64_t>(rule) + 5);
    float v = 1;
    for (int round = 0; round < 10; ++round) {
      Batch b;
      for (uint64_t k = 1u << 20; b.keys.size() < 40000; k += 1 + gen() % (round + 3)) {
        if (gen() % 3 == 0) b.keys.push_back(k);  // present or new, spread over every stripe
      }
      for (uint64_t& k : b.keys) k = k * 0x9E3779B97F4A7C15ULL >> 8 << 8 | (k & 0xff);
      std::sort(b.keys.begin(), b.keys.end());
      b.keys.erase(std::unique(b.keys.begin(), b.keys.end()), b.keys.end());
      for (uint64_t k : b.keys) {
        auto it = ref.m.find(k);
        // Mostly a key's own length; now and then another one (refused when present).
        uint32_t len = k % 11 == 0 ? static_cast<uint32_t>(k % 6) : 2;
        if (it != ref.m.end() && gen() % 40 == 0) len = static_cast<uint32_t>(it->second.size()) + 1;
        b.lens.push_back(len);
        for (uint32_t j = 0; j < len; ++j) b.values.push_back(v++);
      }
      if (round % 4 == 3) {
        store.Insert(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size());
        ref.Insert(b);
      } else {
        const size_t refused = ref.Push(b);
        REQUIRE(store.Push(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size()).ok() == (refused == 0));
      }
      RequireEqual(store, ref.m);
    }
  }
}

// n keys spread over the id space (so over every stripe), sorted (all), dealt into the ones a
// test stores first and the fresh ones it pushes after: every other key (fresh keys fall
// between stored ones) or the upper half (fresh keys go after them).
struct DealtKeys {
  std::vector<uint64_t> all;
  std::vector<uint64_t> stored;
  std::vector<uint64_t> fresh;
};
DealtKeys DealKeys(uint64_t n, bool between) {
  DealtKeys d;
  for (uint64_t k = 0; k < n; ++k) d.all.push_back(k * 0x9E3779B97F4A7C15ULL);
  std::sort(d.all.begin(), d.all.end());
  for (size_t i = 0; i < d.all.size(); ++i) {
    const bool is_fresh = between ? i % 2 == 1 : i >= d.all.size() / 2;
    (is_fresh ? d.fresh : d.stored).push_back(d.all[i]);
  }
  return d;
}

TEST_CASE("runs: a user rule folds each new key between stored ones once, from zero", "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  const DealtKeys dealt = DealKeys(100000, true);
  const std::vector<uint64_t>& even = dealt.stored;
  const std::vector<uint64_t>& odd = dealt.fresh;
  const std::vector<float> ones(even.size() * 3, 1.0f);
  REQUIRE(store.Push(even.data(), RowLens::All(3), ones.data(), even.size()).ok());
  std::map<uint64_t, int> calls;
  store.SetUpdater([&](uint64_t key, float* stored, const float* in, size_t n) {
    ++calls[key];
    for (size_t i = 0; i < n; ++i) stored[i] = stored[i] * 2 + in[i] + 1;
  });
  std::vector<float> values(odd.size() * 3);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000);
  REQUIRE(store.Push(odd.data(), RowLens::All(3), values.data(), odd.size()).ok());
  REQUIRE(calls.size() == odd.size());
  for (const auto& c : calls) REQUIRE(c.second == 1);
  std::vector<float> got(odd.size() * 3);
  REQUIRE(store.CopyUniform(odd.data(), odd.size(), 3, got.data()).ok());
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == values[i] + 1);  // 0 * 2 + in + 1
  got.resize(even.size() * 3);
  REQUIRE(store.CopyUniform(even.data(), even.size(), 3, got.data()).ok());
  for (float g : got) REQUIRE(g == 1.0f);
}

TEST_CASE("runs: a user rule throwing on a new key of a sorted batch leaves whole runs and a usable store",
          "[core][paramstore]") {
  // The new keys go after the stored ones (appended) or between them (merged); the rule
  // throws for one of them while the runs take them.
  for (bool between : {false, true}) {
    INFO((between ? "between stored keys" : "after stored keys"));
    ParamStore store(Rule(UpdateRule::kSum));
    const DealtKeys dealt = DealKeys(40000, between);
    const std::vector<uint64_t>& stored = dealt.stored;
    const std::vector<uint64_t>& fresh = dealt.fresh;
    const std::vector<uint64_t>& all = dealt.all;
    const std::vector<float> ones(all.size(), 1.0f);
    REQUIRE(store.Push(stored.data(), RowLens::All(1), ones.data(), stored.size()).ok());
    const uint64_t bad = fresh[fresh.size() / 2];
    store.SetUpdater([bad](uint64_t key, float* s, const float* in, size_t n) {
      if (key == bad) throw std::runtime_error("rule refused key " + std::to_string(key));
      for (size_t j = 0; j < n; ++j) s[j] += in[j];
    });
    const std::vector<float> twos(fresh.size(), 2.0f);
    REQUIRE_THROWS_WITH(store.Push(fresh.data(), RowLens::All(1), twos.data(), fresh.size()),
                        "rule refused key " + std::to_string(bad));
    store.SetUpdater(nullptr);
    // The stored keys as they were. The new keys of the stripes and windows taken before the
    // throw are stored, pushed (2) or not yet (0, the key the rule refused among them); the
    // others are missing.
    std::vector<float> got(stored.size());
    REQUIRE(store.CopyUniform(stored.data(), stored.size(), 1, got.data()).ok());
    for (float v : got) REQUIRE(v == 1.0f);
    size_t created = 0;
    for (uint64_t k : fresh) {
      float v = -1;
      const Status st = store.CopyUniform(&k, 1, 1, &v);
      if (!st.ok()) {
        REQUIRE(st.code() == Code::kNotFound);
        continue;
      }
      ++created;
      REQUIRE((v == 0.0f || v == 2.0f));
      if (k == bad) REQUIRE(v == 0.0f);
    }
    REQUIRE(created > 0);
    REQUIRE(store.num_keys() == stored.size() + created);
    // The next push of every key is whole.
    REQUIRE(store.Push(all.data(), RowLens::All(1), ones.data(), all.size()).ok());
    got.resize(all.size());
    REQUIRE(store.CopyUniform(all.data(), all.size(), 1, got.data()).ok());
    for (float v : got) REQUIRE((v == 1.0f || v == 2.0f || v == 3.0f));
    REQUIRE(store.num_keys() == all.size());
  }
}

TEST_CASE("runs: key ranges move out and back (scale-out, scale-in) with equal values", "[core][paramstore]") {
  Gen gen(7);
  ParamStore a(Rule(UpdateRule::kSum));
  Reference ref{UpdateRule::kSum, 0, {}};
  for (int i = 0; i < 6; ++i) {
    Batch b = gen.Make(2000, true);
    ref.Push(b);
    a.Push(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size()).IgnoreError();
  }
  RequireEqual(a, ref.m);
  // Scale-out to 3 servers: rank 0 keeps its share, the others get theirs.
  ParamStore b(Rule(UpdateRule::kSum));
  ParamStore c(Rule(UpdateRule::kSum));
  CHECK(a.ExtractNotOwned(0, 3, /*erase=*/false).size() > 0);
  RequireEqual(a, ref.m);  // a copy only
  auto moved = a.ExtractNotOwned(0, 3, /*erase=*/true);
  CHECK_FALSE(a.HasNotOwned(0, 3));
  Model m0, m1, m2;
  for (const auto& e : ref.m) {
    const int owner = ServerForKey(e.first, 3);
    (owner == 0 ? m0 : owner == 1 ? m1 : m2)[e.first] = e.second;
  }
  RequireEqual(a, m0);
  REQUIRE(std::is_sorted(moved.begin(), moved.end(), [](const auto& x, const auto& y) { return x.first < y.first; }));
  for (const auto& e : moved) {
    Batch one{{e.first}, {static_cast<uint32_t>(e.second.size())}, e.second};
    ParamStore& to = ServerForKey(e.first, 3) == 1 ? b : c;
    to.Insert(one.keys.data(), one.lens.data(), one.values.data(), 1);
  }
  RequireEqual(b, m1);
  RequireEqual(c, m2);
  // Scale-in back to one server: b and c hand everything to a, as a batch each.
  for (ParamStore* from : {&b, &c}) {
    Batch all;
    for (auto& e : from->ExtractNotOwned(-1, 1, /*erase=*/true)) {
      all.keys.push_back(e.first);
      all.lens.push_back(static_cast<uint32_t>(e.second.size()));
      all.values.insert(all.values.end(), e.second.begin(), e.second.end());
    }
    a.Insert(all.keys.data(), all.lens.data(), all.values.data(), all.keys.size());
    CHECK(from->num_keys() == 0);
  }
  RequireEqual(a, ref.m);
  // And it keeps taking pushes.
  Batch more = gen.Make(3000, true);
  ref.Push(more);
  a.Push(more.keys.data(), more.lens.data(), more.values.data(), more.keys.size()).IgnoreError();
  RequireEqual(a, ref.m);
}

TEST_CASE("runs: journal replay of random pushes and inserts gives the reference model's store",
          "[core][paramstore][journal]") {
  Gen gen(11);
  Reference ref{UpdateRule::kSum, 0, {}};
  ParamStore live(Rule(UpdateRule::kSum));
  std::string file = JournalFileHeader();
  for (int i = 0; i < 30; ++i) {
    Batch b = gen.Make(200 + gen.Pick(800), gen.Pick(2) == 0);
    const bool insert = gen.Pick(5) == 0;
    BufferPtr body = EncodeKvPairs(b.keys.data(), b.keys.size(), b.lens.data(), b.values.data(), b.values.size());
    const std::string_view kv(body->data(), body->size());
    file += JournalRecordHeader(insert ? JournalOp::kInsert : JournalOp::kPush, kv);
    file += kv;
    if (insert) {
      ref.Insert(b);
      live.Insert(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size());
    } else {
      ref.Push(b);
      live.Push(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size()).IgnoreError();
    }
  }
  Result<ParsedJournal> parsed = ParseJournal(file);
  REQUIRE(parsed.ok());
  ParamStore replayed(Rule(UpdateRule::kSum));
  REQUIRE(ReplayJournal(parsed->records, &replayed).ok());
  RequireEqual(live, ref.m);
  RequireEqual(replayed, ref.m);
  // A compaction's snapshot: blocks pinned, keys in runs copied; all equal the model.
  std::vector<uint64_t> keys = live.Keys();
  std::vector<Slice> s(keys.size());
  REQUIRE(live.ShareOrCopyValues(keys.data(), keys.size(), s.data()).ok());
  Batch snap{keys, {}, {}};
  for (size_t i = 0; i < keys.size(); ++i) {
    snap.lens.push_back(static_cast<uint32_t>(s[i].size / sizeof(float)));
    const float* f = reinterpret_cast<const float*>(s[i].data);
    if (snap.lens.back() > 0) snap.values.insert(snap.values.end(), f, f + snap.lens.back());
  }
  ParamStore restored(Rule(UpdateRule::kSum));
  restored.Insert(snap.keys.data(), snap.lens.data(), snap.values.data(), snap.keys.size());
  RequireEqual(restored, ref.m);
}

}  // namespace pscore::core

namespace pscore::core {
namespace {

size_t StripeOf(uint64_t key) { return KeyPosition(key) >> 58; }  // ParamStore's 64 stripes

// The first key of `keys` (from `from` on) whose stripe is in [lo, hi).
size_t FindInStripes(const std::vector<uint64_t>& keys, size_t from, size_t lo, size_t hi) {
  for (size_t i = from; i < keys.size(); ++i) {
    if (StripeOf(keys[i]) >= lo && StripeOf(keys[i]) < hi) return i;
  }
  FAIL("no key in stripes " << lo << ".." << hi);
  return 0;
}

}  // namespace

TEST_CASE("runs: a batch of few keys with many floats is split over threads and gives the one-thread store's results",
          "[core][paramstore]") {
  // Fewer than kLaneKeys keys, but more than 2 x kLaneFloats floats: two lanes by the
  // floats (a slice of a push of long rows).
  Gen gen(29);
  ParamStore::Options lanes = Rule(UpdateRule::kSum);
  lanes.batch_threads = 2;
  ParamStore::Options one = lanes;
  one.batch_threads = 1;
  ParamStore split(lanes);
  ParamStore single(one);
  Reference ref{UpdateRule::kSum, 0, {}};
  for (int round = 0; round < 4; ++round) {
    const Batch b = gen.Make(12000, round % 2 == 0);
    REQUIRE(b.keys.size() < ParamStore::kLaneKeys);
    REQUIRE(b.values.size() > 2 * ParamStore::kLaneFloats);
    const size_t refused = ref.Push(b);
    const Status a = split.Push(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size());
    const Status c = single.Push(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size());
    CHECK(a.message() == c.message());
    CHECK(a.ok() == (refused == 0));
  }
  RequireEqual(split, ref.m);
  RequireEqual(single, ref.m);
}

TEST_CASE("runs: batches split over threads give the one-thread store's results, errors naming the first key",
          "[core][paramstore]") {
  // Batches of many keys are taken by several threads (Options::batch_threads; two lanes
  // from 2 x kLaneKeys keys): a push or insert each a share of the stripes, a read each a
  // share of the keys. Dense and sparse keys,
  // repeats, large keys, refused lengths, unsorted batches: the same store, statuses and
  // errors as one thread.
  Gen gen(13);
  constexpr size_t kLanes = 2;
  // The stripes of the first lane and of the last (ParamStore's 64 stripes split evenly).
  constexpr size_t kFirstEnd = 64 / kLanes, kLastBegin = 64 - 64 / kLanes;
  ParamStore::Options lanes = Rule(UpdateRule::kSum);
  lanes.batch_threads = kLanes;
  ParamStore::Options one = lanes;
  one.batch_threads = 1;
  ParamStore split(lanes);
  ParamStore single(one);
  Reference ref{UpdateRule::kSum, 0, {}};
  const size_t n = kLanes * ParamStore::kLaneKeys + 1000;
  // Pushes b into both stores and the model; the same status from both.
  auto push = [&](const Batch& b) {
    const size_t refused = ref.Push(b);
    const Status a = split.Push(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size());
    const Status c = single.Push(b.keys.data(), b.lens.data(), b.values.data(), b.keys.size());
    CHECK(a.message() == c.message());
    CHECK(a.ok() == (refused == 0));
    if (refused > 0) {
      CHECK(a.code() == Code::kInvalidArgument);
      CHECK(a.message().find("(" + std::to_string(refused) + " of " + std::to_string(b.keys.size()) +
                             " keys refused)") != std::string::npos);
    }
    return a;
  };
  for (int round = 0; round < 3; ++round) push(gen.Make(n, round != 2)).IgnoreError();
  // Every stored key with its length, and repeats, sorted; two keys with another length:
  // the first in batch order in the last lane's stripes, the second in the first lane's.
  Batch b;
  for (const auto& e : ref.m) b.keys.push_back(e.first);
  while (b.keys.size() < n) b.keys.push_back(b.keys[gen.Pick(b.keys.size())]);
  std::sort(b.keys.begin(), b.keys.end());
  const size_t early = FindInStripes(b.keys, n / 4, kLastBegin, 64);
  const size_t late = FindInStripes(b.keys, n / 2, 0, kFirstEnd);
  for (size_t i = 0; i < b.keys.size(); ++i) {
    const size_t stored = ref.m.at(b.keys[i]).size();
    b.lens.push_back(static_cast<uint32_t>(i == early || i == late ? stored + 1 : stored));
    for (uint32_t j = 0; j < b.lens.back(); ++j) b.values.push_back(static_cast<float>(gen.Pick(9)));
  }
  const Status st2 = push(b);
  CHECK(st2.message().find("push of key " + std::to_string(b.keys[early]) + ": length ") == 0);
  CHECK(st2.message().find("(2 of ") != std::string::npos);
  RequireEqual(split, ref.m);
  RequireEqual(single, ref.m);
  Batch ins = gen.Make(n, true);
  split.Insert(ins.keys.data(), ins.lens.data(), ins.values.data(), n);
  ref.Insert(ins);
  RequireEqual(split, ref.m);

  std::vector<uint64_t> all;
  for (const auto& e : ref.m) all.push_back(e.first);
  std::shuffle(all.begin(), all.end(), gen.rng());
  REQUIRE(all.size() >= kLanes * ParamStore::kLaneKeys);
  // Two steps, and shared slices, of every key in a shuffled order.
  std::vector<uint32_t> want_lens;
  std::vector<float> want_values;
  for (uint64_t k : all) {
    const std::vector<float>& v = ref.m.at(k);
    want_lens.push_back(static_cast<uint32_t>(v.size()));
    want_values.insert(want_values.end(), v.begin(), v.end());
  }
  std::vector<uint32_t> lens(all.size());
  REQUIRE(split.Lens(all.data(), all.size(), lens.data()).ok());
  REQUIRE(lens == want_lens);
  std::vector<float> values(want_values.size());
  REQUIRE(split.CopyValues(all.data(), all.size(), lens.data(), values.data()).ok());
  REQUIRE(values == want_values);
  std::vector<Slice> slices(all.size());
  REQUIRE(split.ShareValues(all.data(), all.size(), slices.data()).ok());
  std::vector<float> shared;
  for (const Slice& sl : slices) {
    const float* f = reinterpret_cast<const float*>(sl.data);
    shared.insert(shared.end(), f, f + sl.size / sizeof(float));
  }
  REQUIRE(shared == want_values);
  slices.clear();
  // One step over the keys of one float; then with two of 4 floats among them; then two
  // steps with missing keys: kNotFound names the first in batch order.
  std::vector<uint64_t> ones;
  for (uint64_t k : all) {
    if (ref.m.at(k).size() == 1) ones.push_back(k);
  }
  for (size_t i = 0; ones.size() < kLanes * ParamStore::kLaneKeys; ++i) ones.push_back(ones[i]);  // keys asked twice
  std::vector<float> rows(ones.size());
  REQUIRE(split.CopyUniform(ones.data(), ones.size(), 1, rows.data()).ok());
  std::vector<float> want_rows;
  for (uint64_t k : ones) want_rows.push_back(ref.m.at(k)[0]);
  REQUIRE(rows == want_rows);
  std::vector<uint64_t> fours;
  for (const auto& e : ref.m) {
    if (e.second.size() == 4) fours.push_back(e.first);
  }
  const uint64_t four_early = fours[FindInStripes(fours, 0, kLastBegin, 64)];
  const uint64_t four_late = fours[FindInStripes(fours, 0, 0, kFirstEnd)];
  std::vector<uint64_t> mixed = ones;
  mixed.insert(mixed.begin() + mixed.size() / 3, four_early);
  mixed.insert(mixed.begin() + 2 * mixed.size() / 3, four_late);
  Status st = split.CopyUniform(mixed.data(), mixed.size(), 1, rows.data());
  CHECK(st.code() == Code::kFailedPrecondition);
  // The walk ends at the first such key a lane finds (the two steps serve such a batch).
  CHECK((st.message() == "key " + std::to_string(four_early) + " holds 4 floats, not 1" ||
         st.message() == "key " + std::to_string(four_late) + " holds 4 floats, not 1"));
  // A read's lane takes its keys a window of 16 Ki keys at a time, stripe by stripe from
  // its first stripe on (the first lane's: 0). So in one window of the first lane's share,
  // a missing key in a last-lane stripe, then shortly after it one in a first-lane stripe
  // (found first), and one more missing key in the last lane's share.
  std::vector<uint64_t> gone;
  for (uint64_t k = 1ull << 62; gone.size() < 3; ++k) {
    const bool late_stripe = gone.size() == 0;
    if (ref.m.count(k) == 0 && StripeOf(k) >= (late_stripe ? kLastBegin : 0) &&
        StripeOf(k) < (late_stripe ? 64 : kFirstEnd)) {
      gone.push_back(k);
    }
  }
  std::vector<uint64_t> ask = all;
  const size_t at = 16 * 1024 + 100;  // one window of the first lane's share
  REQUIRE(at + 10 < ask.size() / kLanes);
  ask.insert(ask.begin() + at, gone[0]);
  ask.insert(ask.begin() + at + 10, gone[1]);
  ask.insert(ask.begin() + 3 * ask.size() / 4, gone[2]);
  std::vector<float> pulled;
  st = split.Pull(ask.data(), ask.size(), &lens, &pulled);
  CHECK(st.code() == Code::kNotFound);
  CHECK(st.message() == "pull of unknown key " + std::to_string(gone[0]));
  CHECK(pulled.empty());
}

}  // namespace pscore::core

namespace pscore::core {

TEST_CASE("runs: an update rule's exception in any lane of a batch reaches the caller and the store stays usable",
          "[core][paramstore]") {
  // Two lanes (2 x kLaneKeys keys, two threads): lane 0 runs on the caller's thread and
  // takes the first half of the stripes, lane 1 its own thread and the second half. A rule
  // throwing for a key of either half is rethrown by Push once both lanes are done.
  constexpr size_t kFirstEnd = 32, kLastBegin = 32;  // ParamStore's 64 stripes in two
  ParamStore::Options o = Rule(UpdateRule::kSum);
  o.batch_threads = 2;
  ParamStore store(o);
  const size_t n = 2 * ParamStore::kLaneKeys + 1000;
  std::vector<uint64_t> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = i;
  const std::vector<uint32_t> lens(n, 1);
  const std::vector<float> ones(n, 1.0f);
  store.Insert(keys.data(), lens.data(), ones.data(), n);
  for (size_t at : {FindInStripes(keys, n / 2, 0, kFirstEnd), FindInStripes(keys, n / 2, kLastBegin, 64)}) {
    const uint64_t bad = keys[at];
    store.SetUpdater([bad](uint64_t key, float* stored, const float* incoming, size_t len) {
      if (key == bad) throw std::runtime_error("rule refused key " + std::to_string(key));
      for (size_t j = 0; j < len; ++j) stored[j] += incoming[j];
    });
    REQUIRE_THROWS_WITH(store.Push(keys.data(), lens.data(), ones.data(), n),
                        "rule refused key " + std::to_string(bad));
  }
  // The rule no longer throws: the next push is whole, and every key reads back.
  store.SetUpdater(nullptr);
  REQUIRE(store.Push(keys.data(), lens.data(), ones.data(), n).ok());
  std::vector<uint32_t> got_lens;
  std::vector<float> got;
  REQUIRE(store.Pull(keys.data(), n, &got_lens, &got).ok());
  REQUIRE(got.size() == n);
  // Each key: its insert, the last push, and the two throwing pushes' where they were applied.
  for (float v : got) {
    REQUIRE(v >= 2.0f);
    REQUIRE(v <= 4.0f);
  }
}

}  // namespace pscore::core
