#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "pscore/core/key_range.h"
#include "pscore/core/param_store.h"

// Catch2 last: glog (via pscore/core/status.h) also defines CHECK, and the last
// definition wins. We want Catch's.
#include <catch2/catch.hpp>

#include "core/param_store_util.h"

namespace pscore {
namespace core {
namespace {

using testing::PullOne;
using testing::Rule;

TEST_CASE("concurrent sum pushes on overlapping keys give exact sums", "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  constexpr int kThreads = 8;
  constexpr int kPushes = 1000;
  constexpr uint64_t kKeys = 16;
  constexpr uint32_t kLen = 3;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPushes; ++i) {
        // Four keys per push, overlapping across threads; thread t adds t+1.
        uint64_t keys[4];
        uint32_t lens[4] = {kLen, kLen, kLen, kLen};
        std::vector<float> values(4 * kLen, static_cast<float>(t + 1));
        for (int j = 0; j < 4; ++j) keys[j] = (static_cast<uint64_t>(t + i + j * 5)) % kKeys;
        if (!store.Push(keys, lens, values.data(), 4).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);

  std::map<uint64_t, double> expected;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPushes; ++i) {
      for (int j = 0; j < 4; ++j) expected[(static_cast<uint64_t>(t + i + j * 5)) % kKeys] += t + 1;
    }
  }
  CHECK(store.num_keys() == kKeys);
  CHECK(store.num_floats() == kKeys * kLen);
  for (const auto& [key, sum] : expected) {
    INFO("key " << key);
    const std::vector<float> got = PullOne(store, key);
    for (float v : got) CHECK(v == static_cast<float>(sum));  // Integers < 2^24: exact.
  }
}

TEST_CASE("assign copies and sgd applies w -= lr * g", "[core][paramstore]") {
  const uint64_t key = 7;
  const uint32_t len = 2;
  {
    ParamStore store(Rule(UpdateRule::kAssign));
    const float a[] = {1.5f, -2.0f};
    const float b[] = {4.0f, 8.0f};
    REQUIRE(store.Push(&key, &len, a, 1).ok());
    REQUIRE(store.Push(&key, &len, b, 1).ok());
    CHECK(PullOne(store, key) == std::vector<float>{4.0f, 8.0f});
  }
  {
    ParamStore store(Rule(UpdateRule::kSgd, 0.5f));
    const float g1[] = {2.0f, -4.0f};
    REQUIRE(store.Push(&key, &len, g1, 1).ok());  // From zero: 0 - 0.5 * g.
    CHECK(PullOne(store, key) == std::vector<float>{-1.0f, 2.0f});
    store.Insert(key, {10.0f, 10.0f});
    const float g2[] = {1.0f, 3.0f};
    REQUIRE(store.Push(&key, &len, g2, 1).ok());
    CHECK(PullOne(store, key) == std::vector<float>{9.5f, 8.5f});
  }
}

TEST_CASE("a user updater overrides the built-in rule", "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  store.SetUpdater([](uint64_t key, float* stored, const float* in, size_t n) {
    for (size_t i = 0; i < n; ++i) stored[i] = stored[i] * 2 + in[i] + static_cast<float>(key);
  });
  const uint64_t key = 1;
  const uint32_t len = 1;
  const float v = 3.0f;
  REQUIRE(store.Push(&key, &len, &v, 1).ok());  // 0*2 + 3 + 1
  REQUIRE(store.Push(&key, &len, &v, 1).ok());  // 4*2 + 3 + 1
  CHECK(PullOne(store, key) == std::vector<float>{12.0f});
  store.SetUpdater(nullptr);
  REQUIRE(store.Push(&key, &len, &v, 1).ok());  // Back to sum.
  CHECK(PullOne(store, key) == std::vector<float>{15.0f});
}

TEST_CASE("length mismatch is refused for that key only", "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  const uint64_t keys[] = {1, 2};
  const uint32_t first_lens[] = {2, 1};
  const float first_values[] = {1, 1, 5};
  REQUIRE(store.Push(keys, first_lens, first_values, 2).ok());

  const uint32_t bad_lens[] = {3, 1};  // Key 1 is stored with 2 floats.
  const float bad_values[] = {9, 9, 9, 5};
  Status st = store.Push(keys, bad_lens, bad_values, 2);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("key 1") && Catch::Contains("length 3") &&
                               Catch::Contains("stored length 2"));
  CHECK(PullOne(store, 1) == std::vector<float>{1.0f, 1.0f});  // Untouched.
  CHECK(PullOne(store, 2) == std::vector<float>{10.0f});       // Still applied.

  CHECK(store.Push(keys, nullptr, bad_values, 2).code() == Code::kInvalidArgument);
  CHECK(store.Push(keys, bad_lens, nullptr, 2).code() == Code::kInvalidArgument);
}

TEST_CASE("a push of rows of one length (RowLens::All) applies as one with a lens array", "[core][paramstore]") {
  // Rows small (in runs) and larger than a run holds (blocks); batches small and large
  // enough for several lanes (kLaneKeys, kLaneFloats); keys new, then present, then of
  // another length.
  const std::pair<uint32_t, size_t> large[] = {{1u, 200007}, {3u, 140001}, {5000u, 447}};
  for (const auto& [row, many] : large) {
    for (size_t n : {size_t{5}, many}) {
      INFO(n << " keys of " << row << " floats");
      ParamStore rows(Rule(UpdateRule::kSum));
      ParamStore listed(Rule(UpdateRule::kSum));
      std::vector<uint64_t> keys(n);
      for (size_t i = 0; i < n; ++i) keys[i] = i * 7919;
      const std::vector<uint32_t> lens(n, row);
      std::vector<float> values(n * row);
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97);
      for (int round = 0; round < 2; ++round) {
        REQUIRE(rows.Push(keys.data(), RowLens::All(row), values.data(), n).ok());
        REQUIRE(listed.Push(keys.data(), lens.data(), values.data(), n).ok());
      }
      std::vector<uint32_t> got_lens;
      std::vector<float> got;
      std::vector<uint32_t> want_lens;
      std::vector<float> want;
      REQUIRE(rows.Pull(keys.data(), n, &got_lens, &got).ok());
      REQUIRE(listed.Pull(keys.data(), n, &want_lens, &want).ok());
      CHECK(got_lens == want_lens);
      CHECK(got == want);
      CHECK(got[row] == 2 * values[row]);  // key 1, pushed twice
      // Another length for every key: refused, naming the first, nothing applied.
      const std::vector<float> longer(n * (row + 1), 1.0f);
      Status st = rows.Push(keys.data(), RowLens::All(row + 1), longer.data(), n);
      CHECK(st.code() == Code::kInvalidArgument);
      CHECK_THAT(st.message(), Catch::Contains("key " + std::to_string(keys[0])));
      REQUIRE(rows.Pull(keys.data(), n, &got_lens, &got).ok());
      CHECK(got == want);
    }
  }
  ParamStore store(Rule(UpdateRule::kSum));
  const uint64_t key = 1;
  const float value = 1;
  CHECK(store.Push(&key, RowLens(), &value, 1).code() == Code::kInvalidArgument);  // absent
}

TEST_CASE("pull of a missing key is NotFound naming the key", "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  store.Insert(3, {1.0f});
  const uint64_t keys[] = {3, 424242};
  std::vector<uint32_t> lens = {99};
  std::vector<float> values = {99.0f};
  Status st = store.Pull(keys, 2, &lens, &values);
  CHECK(st.code() == Code::kNotFound);
  CHECK_THAT(st.message(), Catch::Contains("424242"));
  CHECK(lens.empty());
  CHECK(values.empty());
}

TEST_CASE("every read of one key: in a run, in a block, shared out, and missing", "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  // Keys 10 and 11 of 3 floats go into a run; key 12 of kRunFloats + 1 floats is a block.
  const uint64_t small[] = {10, 11};
  const uint32_t small_lens[] = {3, 3};
  const float small_values[] = {1, 2, 3, 4, 5, 6};
  store.Insert(small, small_lens, small_values, 2);
  std::vector<float> big(ParamStore::kRunFloats + 1);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i);
  store.Insert(12, big);
  const std::map<uint64_t, std::vector<float>> want = {{10, {1, 2, 3}}, {11, {4, 5, 6}}, {12, big}};
  // Key 11 is read in a run first, then shared out (which makes it a block), then again.
  for (uint64_t key : {10, 11, 12, 11}) {
    INFO("key " << key);
    const std::vector<float>& w = want.at(key);
    CHECK(PullOne(store, key) == w);
    uint32_t len = 0;
    REQUIRE(store.Lens(&key, 1, &len).ok());
    CHECK(len == w.size());
    std::vector<float> out(len, -1.0f);
    REQUIRE(store.CopyValues(&key, 1, &len, out.data()).ok());
    CHECK(out == w);
    std::fill(out.begin(), out.end(), -1.0f);
    REQUIRE(store.CopyUniform(&key, 1, len, out.data()).ok());
    CHECK(out == w);
    Slice slice;
    REQUIRE(store.ShareValues(&key, 1, &slice).ok());
    REQUIRE(slice.size == w.size() * sizeof(float));
    CHECK(std::equal(w.begin(), w.end(), reinterpret_cast<const float*>(slice.data)));
  }
  // A missing key: every read names it.
  const uint64_t gone = 13;
  uint32_t len = 7;
  float out[3] = {};
  Slice slice;
  std::vector<uint32_t> lens;
  std::vector<float> values;
  for (Status st : {store.Lens(&gone, 1, &len), store.CopyValues(&gone, 1, small_lens, out),
                    store.CopyUniform(&gone, 1, 3, out), store.ShareValues(&gone, 1, &slice),
                    store.Pull(&gone, 1, &lens, &values)}) {
    CHECK(st.code() == Code::kNotFound);
    CHECK(st.message() == "pull of unknown key 13");
  }
  // A key stored with another length than asked for.
  const uint64_t ten = 10;
  const uint32_t wrong = 4;
  float four[4] = {};
  CHECK(store.CopyValues(&ten, 1, &wrong, four).code() == Code::kAborted);
  CHECK(store.CopyUniform(&ten, 1, wrong, four).code() == Code::kFailedPrecondition);
}

TEST_CASE("ExtractNotOwned moves exactly the keys another server owns", "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  for (uint64_t k = 0; k < 100; ++k) store.Insert(k, {static_cast<float>(k), 1.0f});
  const int n = 3;
  const int rank = 1;
  auto copy = store.ExtractNotOwned(rank, n, /*erase=*/false);
  CHECK(store.num_keys() == 100);
  auto moved = store.ExtractNotOwned(rank, n, /*erase=*/true);
  CHECK(moved == copy);
  for (size_t i = 1; i < moved.size(); ++i) CHECK(moved[i - 1].first < moved[i].first);
  for (const auto& [key, value] : moved) {
    CHECK(ServerForKey(key, n) != rank);
    CHECK(value == std::vector<float>{static_cast<float>(key), 1.0f});
  }
  CHECK(store.num_keys() + moved.size() == 100);
  CHECK(store.num_floats() == 2 * store.num_keys());
  CHECK(store.ExtractNotOwned(rank, n, false).empty());  // Only owned keys remain.
  CHECK(store.ExtractNotOwned(5, n, false).size() == store.num_keys());  // Leaving rank.
  CHECK(store.ExtractNotOwned(0, 0, true).empty());
  store.Clear();
  CHECK(store.num_keys() == 0);
  CHECK(store.num_floats() == 0);
}

}  // namespace
}  // namespace core
}  // namespace pscore

namespace pscore::core {

TEST_CASE("two-step pull gives lengths then the values back to back", "[core][paramstore]") {
  ParamStore store(ParamStore::Options{UpdateRule::kAssign, 0.1f});
  std::vector<uint64_t> keys = {7, 9};
  std::vector<uint32_t> lens = {2, 3};
  std::vector<float> vals = {1, 2, 3, 4, 5};
  REQUIRE(store.Push(keys.data(), lens.data(), vals.data(), 2).ok());
  std::vector<uint32_t> got(2);
  REQUIRE(store.Lens(keys.data(), 2, got.data()).ok());
  CHECK(got == lens);
  std::vector<float> out(5);
  REQUIRE(store.CopyValues(keys.data(), 2, got.data(), out.data()).ok());
  CHECK(out == vals);
  uint64_t missing = 8;
  CHECK(store.Lens(&missing, 1, got.data()).code() == Code::kNotFound);
  CHECK(store.CopyValues(&missing, 1, got.data(), out.data()).code() == Code::kNotFound);
  // Key 7 replaced by a longer value between Lens and CopyValues (Insert: a migration, or
  // the embedding program): refused, and nothing written past the room the lens gave.
  store.Insert(7, std::vector<float>(100, 9.0f));
  std::vector<float> room(5 + 8, -1.0f);  // 8 guard floats after the 5 the lens ask for
  Status changed = store.CopyValues(keys.data(), 2, got.data(), room.data());
  CHECK(changed.code() == Code::kAborted);
  CHECK_THAT(changed.message(), Catch::Contains("key 7 changed from 2 to 100 floats"));
  CHECK(std::all_of(room.begin() + 5, room.end(), [](float f) { return f == -1.0f; }));
}

TEST_CASE("one-step pull of rows of one length equals the two steps, and names a key of another length",
          "[core][paramstore]") {
  ParamStore store(ParamStore::Options{UpdateRule::kAssign, 0.1f});
  // Dense keys (runs) and a sparse spread, three floats each, pushed out of order.
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 5000; ++k) keys.push_back(k % 2 == 0 ? k : k * 0x9E3779B97F4A7C15ULL);
  std::vector<uint32_t> lens(keys.size(), 3);
  std::vector<float> vals(keys.size() * 3);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = static_cast<float>(i);
  REQUIRE(store.Push(keys.data(), lens.data(), vals.data(), keys.size()).ok());
  // Asked in another order, some twice.
  std::vector<uint64_t> ask(keys.rbegin(), keys.rend());
  ask.push_back(keys[10]);
  std::vector<uint32_t> two_lens;
  std::vector<float> two_vals;
  REQUIRE(store.Pull(ask.data(), ask.size(), &two_lens, &two_vals).ok());
  std::vector<float> one(ask.size() * 3, -1.0f);
  REQUIRE(store.CopyUniform(ask.data(), ask.size(), 3, one.data()).ok());
  CHECK(one == two_vals);
  // A key held as a block of its own (it was shared once) reads the same.
  Slice pinned;
  REQUIRE(store.ShareValues(&keys[7], 1, &pinned).ok());
  pinned = Slice{};
  std::fill(one.begin(), one.end(), -1.0f);
  REQUIRE(store.CopyUniform(ask.data(), ask.size(), 3, one.data()).ok());
  CHECK(one == two_vals);
  // A key of another length is named; a missing key is kNotFound.
  store.Insert(keys[30], std::vector<float>(1, 1.0f));
  std::vector<uint64_t> mixed = {keys[1], keys[30], keys[20]};
  std::vector<float> room(9);
  Status other = store.CopyUniform(mixed.data(), mixed.size(), 3, room.data());
  CHECK(other.code() == Code::kFailedPrecondition);
  CHECK_THAT(other.message(), Catch::Contains("key " + std::to_string(keys[30]) + " holds 1 floats, not 3"));
  uint64_t missing = 1;
  CHECK(store.CopyUniform(&missing, 1, 3, room.data()).code() == Code::kNotFound);
}

TEST_CASE("shared values are the stored memory and keep their contents while a push writes a copy",
          "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  std::vector<uint64_t> keys = {3, 5};
  std::vector<uint32_t> lens = {4, 2};
  std::vector<float> ones(6, 1.0f);
  REQUIRE(store.Push(keys.data(), lens.data(), ones.data(), 2).ok());
  auto floats = [](const Slice& s) {
    const float* f = reinterpret_cast<const float*>(s.data);
    return std::vector<float>(f, f + s.size / sizeof(float));
  };
  std::vector<Slice> shared(2);
  REQUIRE(store.ShareValues(keys.data(), 2, shared.data()).ok());
  CHECK(floats(shared[0]) == std::vector<float>(4, 1.0f));
  CHECK(floats(shared[1]) == std::vector<float>(2, 1.0f));
  const char* pinned = shared[0].data;

  // Pinned: the push goes to a fresh copy; the slice still reads the old values.
  REQUIRE(store.Push(keys.data(), lens.data(), ones.data(), 2).ok());
  CHECK(floats(shared[0]) == std::vector<float>(4, 1.0f));
  CHECK(PullOne(store, 3) == std::vector<float>(4, 2.0f));
  CHECK(PullOne(store, 5) == std::vector<float>(2, 2.0f));
  // The old block lives as long as its slice does; letting go of it frees it.
  std::vector<Slice> again(1);
  REQUIRE(store.ShareValues(keys.data(), 1, again.data()).ok());
  CHECK(again[0].data != pinned);
  shared.clear();

  // Unpinned (the slice above released too): a push writes in place, no copy.
  const char* current = again[0].data;
  again.assign(1, Slice{});
  REQUIRE(store.Push(keys.data(), lens.data(), ones.data(), 2).ok());
  REQUIRE(store.ShareValues(keys.data(), 1, again.data()).ok());
  CHECK(again[0].data == current);
  CHECK(floats(again[0]) == std::vector<float>(4, 3.0f));

  // Moving a pinned key out (scaling) copies it: the slice stays readable.
  auto out = store.ExtractNotOwned(-1, 1, /*erase=*/true);
  CHECK(out.size() == 2);
  CHECK(store.num_keys() == 0);
  CHECK(floats(again[0]) == std::vector<float>(4, 3.0f));
  CHECK(out[0].second == std::vector<float>(4, 3.0f));
  // Insert over a pinned key replaces the block, not the memory the slice reads.
  store.Insert(3, std::vector<float>(4, 9.0f));
  shared.emplace_back();
  REQUIRE(store.ShareValues(keys.data(), 1, &shared.back()).ok());
  CHECK(floats(shared.back()) == std::vector<float>(4, 9.0f));
  uint64_t missing = 8;
  Slice none;
  CHECK(store.ShareValues(&missing, 1, &none).code() == Code::kNotFound);
}

TEST_CASE("concurrent pushes and shared pulls: every shared snapshot is one whole state of the key",
          "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  const uint64_t key = 11;
  const uint32_t len = 4096;
  std::vector<float> ones(len, 1.0f);
  REQUIRE(store.Push(&key, &len, ones.data(), 1).ok());
  constexpr int kPushes = 2000;
  std::thread pusher([&] {
    for (int i = 0; i < kPushes; ++i) store.Push(&key, &len, ones.data(), 1).IgnoreError();
  });
  // Snapshots taken while the pusher runs are held for a while (as a socket write would)
  // and must stay uniform: every float the same count of pushes.
  int torn = 0;
  float last = 0;
  bool monotonic = true;
  std::vector<Slice> held;
  for (int round = 0; round < 400; ++round) {
    Slice s;
    REQUIRE(store.ShareValues(&key, 1, &s).ok());
    held.push_back(s);
    if (held.size() > 8) held.erase(held.begin());
    for (const Slice& h : held) {
      const float* f = reinterpret_cast<const float*>(h.data);
      if (std::any_of(f, f + len, [&](float x) { return x != f[0]; })) ++torn;
    }
    const float first = reinterpret_cast<const float*>(s.data)[0];
    if (first < last) monotonic = false;
    last = first;
  }
  pusher.join();
  CHECK(torn == 0);
  CHECK(monotonic);
  held.clear();
  CHECK(PullOne(store, key) == std::vector<float>(len, 1.0f + kPushes));
}

TEST_CASE("Erase, Keys and HasNotOwned agree with ExtractNotOwned", "[core][paramstore]") {
  ParamStore store(Rule(UpdateRule::kSum));
  for (uint64_t k = 0; k < 32; ++k) store.Insert(k, {static_cast<float>(k)});
  CHECK(store.Keys().size() == 32);
  CHECK(store.HasNotOwned(0, 2));
  CHECK_FALSE(store.HasNotOwned(0, 1));
  CHECK(store.HasNotOwned(-1, 1));
  CHECK_FALSE(store.HasNotOwned(0, 0));
  std::vector<uint64_t> gone = {3, 5, 77};
  CHECK(store.Erase(gone.data(), gone.size()) == 2);
  CHECK(store.num_keys() == 30);
  std::vector<uint64_t> keys = store.Keys();
  std::sort(keys.begin(), keys.end());
  CHECK(std::find(keys.begin(), keys.end(), 3) == keys.end());
  CHECK(std::find(keys.begin(), keys.end(), 4) != keys.end());
  store.ExtractNotOwned(1, 2, /*erase=*/true);
  CHECK_FALSE(store.HasNotOwned(1, 2));
  CHECK(store.num_keys() > 0);
}

}  // namespace pscore::core
