// ParamStore::BeginStream: a push folded in piece by piece, applied at Commit.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <thread>
#include <vector>

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

std::vector<float> Ramp(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i % 97);
  return v;
}

// Streams `values` (keys back to back) in pieces of `piece` floats, then commits.
Status Stream(ParamStore& store, const std::vector<uint64_t>& keys, const std::vector<uint32_t>& lens,
              const std::vector<float>& values, size_t piece) {
  std::unique_ptr<ParamStore::PushStream> s = store.BeginStream(keys.data(), lens.data(), keys.size());
  if (!s) return Status(Code::kUnavailable, "not streamed");
  for (size_t off = 0; off < values.size(); off += piece) {
    s->Apply(values.data() + off, std::min(piece, values.size() - off));
  }
  return s->Commit();
}

// A sum store holding one key of 4096 ones. A push waiting for a stream gives up on it
// only after 60 s (stream_stall, stream_hold), past any deadline of these tests.
struct OneKeyStore {
  static ParamStore::Options Options() {
    ParamStore::Options o = Rule(UpdateRule::kSum);
    o.stream_stall = std::chrono::seconds(60);
    o.stream_hold = std::chrono::seconds(60);
    return o;
  }
  OneKeyStore() : store(Options()) { REQUIRE(store.Push(&key, &len, ones.data(), 1).ok()); }
  ParamStore store;
  const uint64_t key = 9;
  const uint32_t len = 4096;
  const std::vector<float> ones = std::vector<float>(4096, 1.0f);
};

TEST_CASE("a streamed push gives what Push gives, for every rule and every piece size", "[core][pushstream]") {
  const std::vector<uint64_t> keys = {3, 70, 1000};
  const std::vector<uint32_t> lens = {5, 1024, 333};
  const std::vector<float> start = Ramp(5 + 1024 + 333, 1.0f);
  const std::vector<float> push = Ramp(5 + 1024 + 333, 0.5f);
  for (UpdateRule rule : {UpdateRule::kAssign, UpdateRule::kSum, UpdateRule::kSgd}) {
    for (size_t piece : {size_t{1}, size_t{3}, size_t{5}, size_t{64}, size_t{1029}, size_t{100000}}) {
      ParamStore plain(Rule(rule, 0.25f));
      ParamStore streamed(Rule(rule, 0.25f));
      for (ParamStore* s : {&plain, &streamed}) REQUIRE(s->Push(keys.data(), lens.data(), start.data(), 3).ok());
      REQUIRE(plain.Push(keys.data(), lens.data(), push.data(), 3).ok());
      // Twice: the second stream writes into the spare the first one left.
      REQUIRE(plain.Push(keys.data(), lens.data(), push.data(), 3).ok());
      REQUIRE(Stream(streamed, keys, lens, push, piece).ok());
      REQUIRE(Stream(streamed, keys, lens, push, piece).ok());
      for (uint64_t k : keys) CHECK(PullOne(streamed, k) == PullOne(plain, k));
    }
  }
}

TEST_CASE_METHOD(OneKeyStore, "an uncommitted stream changes nothing and lets go of its keys", "[core][pushstream]") {
  {
    auto s = store.BeginStream(&key, &len, 1);
    REQUIRE(s != nullptr);
    CHECK(store.keys_held_by_streams() == 1);
    s->Apply(ones.data(), len / 2);  // the sender went away half-way
  }
  CHECK(store.keys_held_by_streams() == 0);
  CHECK(PullOne(store, key) == ones);
  auto s = store.BeginStream(&key, &len, 1);  // the key is free again
  REQUIRE(s != nullptr);
  s->Apply(ones.data(), len / 2);
  CHECK(!s->Commit().ok());  // short: refused, nothing applied
  CHECK(PullOne(store, key) == ones);
  CHECK(Stream(store, {key}, {len}, ones, 100).ok());
  CHECK(PullOne(store, key) == std::vector<float>(len, 2.0f));
}

TEST_CASE("a push cannot stream when it must take the plain path", "[core][pushstream]") {
  ParamStore::Options o = Rule(UpdateRule::kSum);
  o.stream_spare_bytes = 4096;
  ParamStore store(o);
  const uint64_t key = 1, big = 2;
  const uint32_t len = 16, big_len = 2048;  // 8 KiB: over the spare budget
  REQUIRE(store.Push(&key, &len, std::vector<float>(len, 1.0f).data(), 1).ok());
  REQUIRE(store.Push(&big, &big_len, std::vector<float>(big_len, 1.0f).data(), 1).ok());
  const uint64_t missing = 3;
  const uint32_t wrong = 17;
  CHECK(!store.BeginStream(&missing, &len, 1));
  CHECK(!store.BeginStream(&key, &wrong, 1));
  CHECK(!store.BeginStream(&big, &big_len, 1));
  const uint64_t twice[] = {key, key};
  const uint32_t twice_lens[] = {len, len};
  CHECK(!store.BeginStream(twice, twice_lens, 2));  // one stream holds a key once
  {
    auto first = store.BeginStream(&key, &len, 1);
    REQUIRE(first != nullptr);
    CHECK(!store.BeginStream(&key, &len, 1));  // held by the first
  }
  store.SetUpdater([](uint64_t, float* s, const float* in, size_t n) {
    for (size_t i = 0; i < n; ++i) s[i] = in[i];
  });
  CHECK(!store.BeginStream(&key, &len, 1));  // a user rule sees whole pushes only
  store.SetUpdater(nullptr);
  CHECK(store.BeginStream(&key, &len, 1) != nullptr);
  CHECK(PullOne(store, key) == std::vector<float>(len, 1.0f));  // declined streams left no trace
}

TEST_CASE_METHOD(OneKeyStore, "pulls see a streamed key before or after the push, never half of it", "[core][pushstream]") {
  constexpr int kStreams = 300;
  std::atomic<bool> done{false};
  std::atomic<int> pulls{0}, streams{0}, failed{0};
  std::thread streamer([&] {
    // At least kStreams, and on until the pulls below overlapped them (30 s at most).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (streams.load() < kStreams || (pulls.load() < 100 && std::chrono::steady_clock::now() < deadline)) {
      if (Stream(store, {key}, {len}, ones, 1000).ok()) {
        ++streams;
      } else {
        ++failed;
      }
    }
    done = true;
  });
  int torn = 0;
  std::vector<Slice> held;
  while (!done.load()) {
    std::vector<float> v = PullOne(store, key);
    if (std::any_of(v.begin(), v.end(), [&](float x) { return x != v[0]; })) ++torn;
    Slice s;
    REQUIRE(store.ShareValues(&key, 1, &s).ok());  // pins the block: the next stream must not reuse it
    held.push_back(s);
    if (held.size() > 4) held.erase(held.begin());
    for (const Slice& h : held) {
      const float* f = reinterpret_cast<const float*>(h.data);
      if (std::any_of(f, f + len, [&](float x) { return x != f[0]; })) ++torn;
    }
    ++pulls;
  }
  streamer.join();
  CHECK(torn == 0);
  CHECK(failed.load() == 0);  // no other writer: every stream begins and commits
  CHECK(pulls.load() >= 100);
  held.clear();
  CHECK(PullOne(store, key) == std::vector<float>(len, 1.0f + streams.load()));
}

TEST_CASE_METHOD(OneKeyStore, "a push waits for the stream holding its key: no update is lost", "[core][pushstream]") {
  constexpr int kEach = 400;
  std::atomic<int> streamed{0}, failed{0};
  std::thread streamer([&] {
    for (int i = 0; i < kEach; ++i) {
      Status st = Stream(store, {key}, {len}, ones, 512);
      if (st.ok()) {
        ++streamed;
      } else if (st.code() != Code::kUnavailable || !store.Push(&key, &len, ones.data(), 1).ok()) {
        ++failed;  // declined streams take the plain path; nothing else may fail
      }
    }
  });
  std::thread pusher([&] {
    for (int i = 0; i < kEach; ++i) {
      if (!store.Push(&key, &len, ones.data(), 1).ok()) ++failed;
    }
  });
  streamer.join();
  pusher.join();
  CHECK(failed.load() == 0);
  CHECK(streamed.load() > 0);
  CHECK(PullOne(store, key) == std::vector<float>(len, 1.0f + 2 * kEach));
}

// A sum store holding keys 1 and 2 of 64 ones each; streams stall after 100 ms.
struct TwoKeyStore {
  static ParamStore::Options Options() {
    ParamStore::Options o = Rule(UpdateRule::kSum);
    o.stream_stall = std::chrono::milliseconds(100);
    return o;
  }
  TwoKeyStore() : store(Options()) { REQUIRE(store.Push(keys, lens, ones.data(), 2).ok()); }
  ParamStore store;
  const uint64_t keys[2] = {1, 2};
  const uint32_t lens[2] = {64, 64};
  const std::vector<float> ones = std::vector<float>(128, 1.0f);
};

TEST_CASE_METHOD(TwoKeyStore, "a stalled stream is revoked for a waiting push and its commit applies none of its keys",
                 "[core][pushstream]") {
  auto s = store.BeginStream(keys, lens, 2);
  REQUIRE(s != nullptr);
  s->Apply(ones.data(), 100);  // then the sender stops
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(store.Push(&keys[0], &lens[0], ones.data(), 1).ok());  // waits for the stall, then goes
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(90));
  CHECK(PullOne(store, keys[0]) == std::vector<float>(64, 2.0f));
  s->Apply(ones.data(), 28);  // the sender comes back
  CHECK(store.keys_held_by_streams() == 1);  // key 1 was revoked, key 2 is still held
  Status st = s->Commit();
  CHECK(store.keys_held_by_streams() == 0);
  CHECK(st.code() == Code::kAborted);
  CHECK(st.message().find("key 1 ") != std::string::npos);
  // Nothing of it is applied, not even the key it still held: a worker sends a push that
  // got kAborted again whole, so a key applied here would be applied twice.
  CHECK(PullOne(store, keys[0]) == std::vector<float>(64, 2.0f));
  CHECK(PullOne(store, keys[1]) == std::vector<float>(64, 1.0f));
  REQUIRE(store.Push(keys, lens, ones.data(), 2).ok());  // sent again
  CHECK(PullOne(store, keys[0]) == std::vector<float>(64, 3.0f));
  CHECK(PullOne(store, keys[1]) == std::vector<float>(64, 2.0f));
}

TEST_CASE_METHOD(OneKeyStore, "a push of the wrong length to a streamed key is refused at once - it never waits",
                 "[core][pushstream]") {
  const uint32_t wrong = 16;
  auto s = store.BeginStream(&key, &len, 1);
  REQUIRE(s != nullptr);
  const auto start = std::chrono::steady_clock::now();
  CHECK(store.Push(&key, &wrong, std::vector<float>(wrong, 1.0f).data(), 1).code() == Code::kInvalidArgument);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE_METHOD(OneKeyStore, "HoldStreamsOff waits for the stream holding a key and keeps new ones off until let go",
                 "[core][pushstream]") {
  {
    auto held = store.HoldStreamsOff(&key, &len, 1);  // nothing streams: no wait
    CHECK(store.BeginStream(&key, &len, 1) == nullptr);  // kept off while held
  }
  auto s = store.BeginStream(&key, &len, 1);
  REQUIRE(s != nullptr);
  const uint32_t wrong = 8;
  { auto other_length = store.HoldStreamsOff(&key, &wrong, 1); }  // refused anyway: not waited for
  std::atomic<bool> holding{false};
  std::thread waiter([&] {
    auto hold = store.HoldStreamsOff(&key, &len, 1);
    holding = true;
    if (!store.Push(&key, &len, ones.data(), 1).ok()) holding = false;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(holding.load());  // still waiting for the stream
  s->Apply(ones.data(), len);
  CHECK(s->Commit().ok());
  waiter.join();
  CHECK(holding.load());
  CHECK(PullOne(store, key) == std::vector<float>(len, 3.0f));
  CHECK(store.BeginStream(&key, &len, 1) != nullptr);  // the hold is gone
}

TEST_CASE_METHOD(OneKeyStore, "a key replaced or erased during its stream keeps the new state", "[core][pushstream]") {
  auto s = store.BeginStream(&key, &len, 1);
  REQUIRE(s != nullptr);
  store.Insert(key, std::vector<float>(len, 7.0f));  // a migration overwrote it
  s->Apply(ones.data(), len);
  CHECK(s->Commit().code() == Code::kAborted);
  CHECK(PullOne(store, key) == std::vector<float>(len, 7.0f));
  auto t = store.BeginStream(&key, &len, 1);
  REQUIRE(t != nullptr);
  CHECK(store.Erase(&key, 1) == 1);
  t->Apply(ones.data(), len);
  CHECK(t->Commit().code() == Code::kAborted);
  CHECK(store.num_keys() == 0);
}


TEST_CASE("a push waiting for a stream that trickles its bytes revokes it after stream_hold", "[core][pushstream]") {
  ParamStore::Options o = Rule(UpdateRule::kSum);
  o.stream_stall = std::chrono::seconds(60);  // the stream never stalls
  o.stream_hold = std::chrono::milliseconds(200);
  ParamStore store(o);
  const uint64_t key = 3;
  const uint32_t len = 1000;
  const std::vector<float> ones(len, 1.0f);
  REQUIRE(store.Push(&key, &len, ones.data(), 1).ok());
  auto s = store.BeginStream(&key, &len, 1);
  REQUIRE(s != nullptr);
  const auto start = std::chrono::steady_clock::now();
  std::future<Status> waiting =
      std::async(std::launch::async, [&] { return store.Push(&key, &len, ones.data(), 1); });
  // One float every 10 ms: progress all the time, far too slow to finish meanwhile.
  size_t sent = 0;
  while (waiting.wait_for(std::chrono::milliseconds(10)) == std::future_status::timeout) {
    REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
    REQUIRE(sent < len - 1);
    s->Apply(ones.data(), 1);
    ++sent;
  }
  CHECK(waiting.get().ok());
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(190));
  s->Apply(ones.data(), len - sent);
  CHECK(s->Commit().code() == Code::kAborted);  // the sender pushes again
  CHECK(PullOne(store, key) == std::vector<float>(len, 2.0f));
}

TEST_CASE_METHOD(TwoKeyStore, "a key replaced during a stream of two keys leaves both as they were",
                 "[core][pushstream]") {
  auto s = store.BeginStream(keys, lens, 2);
  REQUIRE(s != nullptr);
  s->Apply(ones.data(), 128);
  store.Insert(keys[1], std::vector<float>(64, 7.0f));  // a migration overwrote key 2
  Status st = s->Commit();
  CHECK(st.code() == Code::kAborted);
  CHECK(st.message().find("key 2 ") != std::string::npos);
  CHECK(PullOne(store, keys[0]) == std::vector<float>(64, 1.0f));
  CHECK(PullOne(store, keys[1]) == std::vector<float>(64, 7.0f));
  CHECK(store.keys_held_by_streams() == 0);
}

// kSparesOnly (a server's loop thread): no block is allocated by BeginStream.
TEST_CASE("kSparesOnly declines keys without a spare - the next Push prepares them all", "[core][pushstream]") {
  const std::vector<uint64_t> keys = {3, 70, 1000};
  const std::vector<uint32_t> lens = {5, 1024, 333};
  const uint64_t bytes = (5 + 1024 + 333) * sizeof(float);
  const std::vector<float> start = Ramp(5 + 1024 + 333, 1.0f);
  const std::vector<float> push = Ramp(5 + 1024 + 333, 0.5f);
  ParamStore plain(Rule(UpdateRule::kSum));
  ParamStore store(Rule(UpdateRule::kSum));
  for (ParamStore* s : {&plain, &store}) REQUIRE(s->Push(keys.data(), lens.data(), start.data(), 3).ok());
  CHECK(store.spare_bytes() == 0);  // a Push alone prepares nothing
  const auto only = ParamStore::Targets::kSparesOnly;
  CHECK(store.BeginStream(keys.data(), lens.data(), 3, only) == nullptr);
  CHECK(store.keys_held_by_streams() == 0);
  CHECK(store.spare_bytes() == 0);
  // The push goes whole and makes every key's spare, all three marked by one decline.
  REQUIRE(store.Push(keys.data(), lens.data(), push.data(), 3).ok());
  REQUIRE(plain.Push(keys.data(), lens.data(), push.data(), 3).ok());
  CHECK(store.spare_bytes() == bytes);
  for (int round = 0; round < 2; ++round) {
    auto s = store.BeginStream(keys.data(), lens.data(), 3, only);
    REQUIRE(s != nullptr);
    CHECK(store.spare_bytes() == 0);  // taken as targets
    s->Apply(push.data(), push.size());
    REQUIRE(s->Commit().ok());
    REQUIRE(plain.Push(keys.data(), lens.data(), push.data(), 3).ok());
    CHECK(store.spare_bytes() == bytes);  // the replaced blocks
  }
  for (uint64_t k : keys) CHECK(PullOne(store, k) == PullOne(plain, k));
}

TEST_CASE("kSparesOnly prepares spares within stream_spare_bytes only", "[core][pushstream]") {
  const std::vector<uint64_t> keys = {1, 2};
  const std::vector<uint32_t> lens = {1000, 1000};
  ParamStore::Options o = Rule(UpdateRule::kSum);
  o.stream_spare_bytes = 1000 * sizeof(float);  // one key's worth
  ParamStore store(o);
  const std::vector<float> ones(2000, 1.0f);
  REQUIRE(store.Push(keys.data(), lens.data(), ones.data(), 2).ok());
  const auto only = ParamStore::Targets::kSparesOnly;
  CHECK(store.BeginStream(keys.data(), lens.data(), 2, only) == nullptr);
  REQUIRE(store.Push(keys.data(), lens.data(), ones.data(), 2).ok());
  CHECK(store.spare_bytes() == 1000 * sizeof(float));
  CHECK(store.BeginStream(keys.data(), lens.data(), 2, only) == nullptr);  // one key still lacks one
  CHECK(store.spare_bytes() == 1000 * sizeof(float));                      // the other kept its spare
  // Whichever key got the spare streams on its own.
  int streamed = 0;
  for (size_t i = 0; i < 2; ++i) {
    auto s = store.BeginStream(&keys[i], &lens[i], 1, only);
    if (s == nullptr) continue;
    ++streamed;
    s->Apply(ones.data(), 1000);
    CHECK(s->Commit().ok());
    CHECK(PullOne(store, keys[i]) == std::vector<float>(1000, 3.0f));
  }
  CHECK(streamed == 1);
  CHECK(store.spare_bytes() <= o.stream_spare_bytes);
}

TEST_CASE_METHOD(OneKeyStore, "a stream let go or aborted leaves its block as the key's spare", "[core][pushstream]") {
  const auto only = ParamStore::Targets::kSparesOnly;
  { auto s = store.BeginStream(&key, &len, 1); }  // allocated, never committed
  CHECK(store.spare_bytes() == len * sizeof(float));
  {
    auto s = store.BeginStream(&key, &len, 1, only);
    REQUIRE(s != nullptr);
    store.Insert(key, std::vector<float>(len, 7.0f));  // replaced meanwhile: aborted
    s->Apply(ones.data(), len);
    CHECK(s->Commit().code() == Code::kAborted);
  }
  CHECK(store.spare_bytes() == len * sizeof(float));  // now the new block's spare
  auto s = store.BeginStream(&key, &len, 1, only);
  REQUIRE(s != nullptr);
  s->Apply(ones.data(), len);
  CHECK(s->Commit().ok());
  CHECK(PullOne(store, key) == std::vector<float>(len, 8.0f));
}

TEST_CASE_METHOD(OneKeyStore, "kSparesOnly lets go of a spare a slice still reads and prepares a new one",
                 "[core][pushstream]") {
  const auto only = ParamStore::Targets::kSparesOnly;
  { auto s = store.BeginStream(&key, &len, 1); }  // a spare for the first stream
  Slice slice;
  REQUIRE(store.ShareValues(&key, 1, &slice).ok());  // pins the stored block of ones
  auto s = store.BeginStream(&key, &len, 1, only);
  REQUIRE(s != nullptr);
  s->Apply(ones.data(), len);
  REQUIRE(s->Commit().ok());  // the pinned block of ones is now the spare
  CHECK(store.BeginStream(&key, &len, 1, only) == nullptr);
  CHECK(store.spare_bytes() == 0);
  const float* pinned = reinterpret_cast<const float*>(slice.data);
  CHECK(std::all_of(pinned, pinned + len, [](float x) { return x == 1.0f; }));
  REQUIRE(store.Push(&key, &len, ones.data(), 1).ok());  // prepares a fresh spare
  CHECK(store.spare_bytes() == len * sizeof(float));
  CHECK(std::all_of(pinned, pinned + len, [](float x) { return x == 1.0f; }));  // never written
  CHECK(store.BeginStream(&key, &len, 1, only) != nullptr);
}

}  // namespace
}  // namespace core
}  // namespace pscore
