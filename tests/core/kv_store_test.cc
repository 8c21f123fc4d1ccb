#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "pscore/core/clock.h"
#include "pscore/core/kv_store.h"
#include "pscore/core/state_file.h"

// Catch2 comes after core headers: glog (via status.h) also defines CHECK, and the last
// definition wins. Here CHECK must be Catch's non-aborting assertion.
#include <catch2/catch.hpp>

namespace pscore::core {
namespace {

// Records what a Get callback received and how often it was called.
struct GetProbe {
  int calls = 0;
  std::optional<Result<std::string>> result;
  KvStore::GetCallback Callback() {
    return [this](Result<std::string> r) {
      ++calls;
      result.emplace(std::move(r));
    };
  }
  std::string value() const { return result->value(); }
  Code code() const { return result->status().code(); }
};

std::vector<std::string> Keys(const KvStore::Entries& entries) {
  std::vector<std::string> keys;
  for (const auto& e : entries) keys.push_back(e.first);
  return keys;
}

}  // namespace

TEST_CASE("kv keys are normalised", "[core][kv]") {
  CHECK(*NormalizeKey("a/b") == "a/b");
  CHECK(*NormalizeKey("//a///b/") == "a/b");
  CHECK(*NormalizeKey("/a") == "a");
  CHECK(*NormalizeKey("a/./..") == "a/./..");
  CHECK(NormalizeKey("").status().code() == Code::kInvalidArgument);
  CHECK(NormalizeKey("///").status().code() == Code::kInvalidArgument);
  CHECK(NormalizeKey(std::string(kMaxKeyBytes + 1, 'k')).status().code() ==
        Code::kInvalidArgument);
  CHECK(NormalizeKey(std::string(kMaxKeyBytes, 'k')).ok());

  FakeClock clock;
  KvStore kv(&clock, 64);
  REQUIRE(kv.Set("/x//y/", "1", false).ok());
  CHECK(*kv.TryGet("x/y") == "1");
  CHECK(kv.Set("x/y", "2", false).code() == Code::kAlreadyExists);
  CHECK(kv.Set("//", "v", true).code() == Code::kInvalidArgument);
}

TEST_CASE("kv set respects overwrite and the value bound", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 8);
  REQUIRE(kv.Set("k", "old", false).ok());
  Status again = kv.Set("k", "new", false);
  CHECK(again.code() == Code::kAlreadyExists);
  CHECK(again.message().find("k") != std::string::npos);
  CHECK(*kv.TryGet("k") == "old");
  REQUIRE(kv.Set("k", "new", true).ok());
  CHECK(*kv.TryGet("k") == "new");

  CHECK(kv.Set("big", std::string(9, 'x'), true).code() == Code::kInvalidArgument);
  CHECK(kv.TryGet("big").status().code() == Code::kNotFound);
  CHECK(kv.Set("edge", std::string(8, 'x'), true).ok());
  std::string bytes("a\0b\xff", 4);  // Values are raw bytes.
  REQUIRE(kv.Set("bin", bytes, false).ok());
  CHECK(*kv.TryGet("bin") == bytes);
  CHECK(kv.size() == 3);
}

TEST_CASE("kv get answers at once, waits for set, or times out", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 64);
  REQUIRE(kv.Set("ready", "yes", false).ok());
  GetProbe now;
  CHECK(kv.Get("ready", Millis(100), now.Callback()) == 0);
  CHECK(now.calls == 1);
  CHECK(now.value() == "yes");

  GetProbe waits, expires;
  uint64_t w1 = kv.Get("/later/", Millis(1000), waits.Callback());
  uint64_t w2 = kv.Get("never", Millis(500), expires.Callback());
  CHECK(w1 != 0);
  CHECK(w2 != w1);
  CHECK(kv.waiting() == 2);
  CHECK(*kv.NextDeadline() == clock.Now() + Millis(500));

  clock.Advance(Millis(499));
  kv.Tick();
  CHECK(expires.calls == 0);
  REQUIRE(kv.Set("later", "v1", false).ok());
  CHECK(waits.calls == 1);
  CHECK(waits.value() == "v1");

  clock.Advance(Millis(1));
  kv.Tick();
  REQUIRE(expires.calls == 1);
  CHECK(expires.code() == Code::kTimeout);
  CHECK(expires.result->status().message().find("never") != std::string::npos);
  CHECK(kv.waiting() == 0);
  CHECK_FALSE(kv.NextDeadline().has_value());

  clock.Advance(Millis(5000));  // Nothing is answered twice.
  kv.Tick();
  CHECK(waits.calls == 1);
  CHECK(expires.calls == 1);
}

TEST_CASE("kv get with no timeout or a bad key answers at once", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 64);
  GetProbe zero, bad;
  CHECK(kv.Get("missing", Duration::zero(), zero.Callback()) == 0);
  CHECK(zero.code() == Code::kTimeout);
  CHECK(kv.Get("//", Millis(10), bad.Callback()) == 0);
  CHECK(bad.code() == Code::kInvalidArgument);
  CHECK(kv.waiting() == 0);

  GetProbe forever;  // A huge timeout must not overflow the deadline.
  CHECK(kv.Get("k", Duration::max(), forever.Callback()) != 0);
  clock.Advance(std::chrono::hours(24 * 365));
  kv.Tick();
  CHECK(forever.calls == 0);
}

TEST_CASE("kv several waiters on one key all get the value", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 64);
  std::vector<std::string> order;
  kv.Get("k", Millis(10), [&](Result<std::string> r) { order.push_back("a=" + *r); });
  kv.Get("k", Millis(10), [&](Result<std::string> r) { order.push_back("b=" + *r); });
  REQUIRE(kv.Set("k", "v", false).ok());
  CHECK(order == std::vector<std::string>{"a=v", "b=v"});
}

TEST_CASE("kv delete then a new set satisfies a waiting get", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 64);
  REQUIRE(kv.Set("k", "first", false).ok());
  kv.Delete("k");
  GetProbe probe;
  CHECK(kv.Get("k", Millis(100), probe.Callback()) != 0);
  CHECK(probe.calls == 0);
  REQUIRE(kv.Set("k", "second", false).ok());  // No overwrite needed after delete.
  REQUIRE(probe.calls == 1);
  CHECK(probe.value() == "second");
}

TEST_CASE("kv cancel answers a waiter once with kCancelled", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 64);
  GetProbe cancelled, other;
  uint64_t id = kv.Get("k", Millis(100), cancelled.Callback());
  kv.Get("k", Millis(100), other.Callback());
  kv.CancelGet(id);
  CHECK(cancelled.code() == Code::kCancelled);
  kv.CancelGet(id);      // Second cancel: no-op.
  kv.CancelGet(987654);  // Unknown id: no-op.
  REQUIRE(kv.Set("k", "v", false).ok());
  CHECK(cancelled.calls == 1);
  CHECK(other.value() == "v");

  GetProbe a, b;
  kv.Get("x", Millis(100), a.Callback());
  kv.Get("y", Millis(100), b.Callback());
  kv.CancelAllGets(Status(Code::kUnavailable, "scheduler stopping"));
  CHECK(a.code() == Code::kUnavailable);
  CHECK(b.code() == Code::kUnavailable);
  CHECK(kv.waiting() == 0);
}

TEST_CASE("kv callbacks may re-enter the store", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 64);
  GetProbe chained;
  kv.Get("a", Millis(100), [&](Result<std::string> r) {
    REQUIRE(kv.Set("b", *r + "!", false).ok());
  });
  kv.Get("b", Millis(100), chained.Callback());
  REQUIRE(kv.Set("a", "hi", false).ok());
  CHECK(chained.value() == "hi!");
}

TEST_CASE("kv list returns keys strictly under a directory, sorted", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 64);
  for (const char* k : {"a/b", "a/b/c", "a/b/d/e", "a/bc", "a/b!", "b", "a"}) {
    REQUIRE(kv.Set(k, k, false).ok());
  }
  CHECK(Keys(kv.List("a/b")) == std::vector<std::string>{"a/b/c", "a/b/d/e"});
  CHECK(Keys(kv.List("/a/b//")) == std::vector<std::string>{"a/b/c", "a/b/d/e"});
  CHECK(Keys(kv.List("a")) ==
        std::vector<std::string>{"a/b", "a/b!", "a/b/c", "a/b/d/e", "a/bc"});
  CHECK(kv.List("a/b")[0].second == "a/b/c");
  CHECK(kv.List("zzz").empty());
  CHECK(kv.List("").size() == 7);
  CHECK(Keys(kv.List("/")) == Keys(kv.Snapshot()));
}

TEST_CASE("kv delete removes a key and its subtree only", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 64);
  for (const char* k : {"a/b", "a/b/c", "a/b/d/e", "a/bc", "a/b!", "a"}) {
    REQUIRE(kv.Set(k, "v", false).ok());
  }
  kv.Delete("a/b/");
  CHECK(Keys(kv.List("")) == std::vector<std::string>{"a", "a/b!", "a/bc"});
  kv.Delete("missing/key");  // Fine.
  kv.Delete("");             // Invalid: no-op, does not wipe the store.
  CHECK(kv.size() == 3);
  kv.Delete("a");
  CHECK(kv.size() == 0);
}

TEST_CASE("kv total cap refuses growth past it - shrinking sets and deletes free room", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 64, /*max_total_bytes=*/20);
  REQUIRE(kv.Set("a", "123456789", false).ok());  // 1 + 9
  REQUIRE(kv.Set("b", "12345678", false).ok());   // 1 + 8: 19 of 20
  CHECK(kv.total_bytes() == 19);
  Status full = kv.Set("c", "1", false);  // 21
  CHECK(full.code() == Code::kResourceExhausted);
  CHECK(full.message().find("20-byte cap") != std::string::npos);
  CHECK(kv.TryGet("c").status().code() == Code::kNotFound);
  CHECK(kv.Set("b", "1234567890", true).code() == Code::kResourceExhausted);  // grows the total to 21
  CHECK(*kv.TryGet("b") == "12345678");                                      // kept
  REQUIRE(kv.Set("b", "1", true).ok());                                      // shrinks: 12
  CHECK(kv.total_bytes() == 12);
  REQUIRE(kv.Set("c/d", "12345", false).ok());  // 3 + 5: 20, exactly the cap
  CHECK(kv.total_bytes() == 20);
  kv.Delete("c");  // the subtree goes, its bytes with it
  CHECK(kv.total_bytes() == 12);
  kv.Delete("a");
  CHECK(kv.total_bytes() == 2);
  REQUIRE(kv.Set("e", "12345678", false).ok());
  CHECK(kv.total_bytes() == 11);

  // Restore keeps everything it is given, even over the cap; only shrinking Sets pass then.
  KvStore small(&clock, 64, /*max_total_bytes=*/5);
  small.Restore({{"x", "1234"}, {"y", "1234"}, {"x", "12"}});  // x given twice: the last wins
  CHECK(small.size() == 2);
  CHECK(small.total_bytes() == 8);
  CHECK(small.Set("z", "", false).code() == Code::kResourceExhausted);
  REQUIRE(small.Set("y", "1", true).ok());
  CHECK(small.total_bytes() == 5);
}

TEST_CASE("kv entry cap refuses new keys past it - overwrites and deletes still pass", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 64, /*max_total_bytes=*/0, /*max_entries=*/3);
  REQUIRE(kv.Set("a", "1", false).ok());
  REQUIRE(kv.Set("b/c", "2", false).ok());
  REQUIRE(kv.Set("d", "3", false).ok());
  Status full = kv.Set("e", "4", false);
  CHECK(full.code() == Code::kResourceExhausted);
  CHECK(full.message().find("3 keys") != std::string::npos);
  REQUIRE(kv.Set("a", "10", true).ok());  // an existing key
  kv.Delete("b");
  REQUIRE(kv.Set("e", "4", false).ok());
  CHECK(kv.size() == 3);
  // The default is what a state file may hold.
  CHECK(KvStore::kDefaultMaxEntries == static_cast<size_t>(kMaxStateKvEntries));
}

TEST_CASE("kv snapshot and restore round-trip and wake waiters", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 8);
  REQUIRE(kv.Set("x/1", "one", false).ok());
  REQUIRE(kv.Set("x/2", "two", false).ok());
  KvStore::Entries snap = kv.Snapshot();
  CHECK(Keys(snap) == std::vector<std::string>{"x/1", "x/2"});

  KvStore other(&clock, 8);
  REQUIRE(other.Set("stale", "s", false).ok());
  GetProbe probe;
  other.Get("x/2", Millis(100), probe.Callback());
  snap.emplace_back("//", "bad key");
  snap.emplace_back("x/3", "far too long");
  other.Restore(snap);
  CHECK(other.Snapshot() == kv.Snapshot());
  CHECK(probe.value() == "two");
}

TEST_CASE("kv 3 x 1000 sets to distinct keys list back sorted", "[core][kv]") {
  FakeClock clock;
  KvStore kv(&clock, 64);
  std::vector<std::string> expected;
  for (int writer = 0; writer < 3; ++writer) {
    for (int i = 0; i < 1000; ++i) {
      std::string key = "job/w" + std::to_string(writer) + "/k" + std::to_string(i);
      REQUIRE(kv.Set(key, std::to_string(i), false).ok());
      expected.push_back(key);
    }
  }
  std::sort(expected.begin(), expected.end());
  KvStore::Entries all = kv.List("job");
  REQUIRE(all.size() == 3000);
  CHECK(Keys(all) == expected);
  CHECK(kv.List("job/w1").size() == 1000);
}

}  // namespace pscore::core
