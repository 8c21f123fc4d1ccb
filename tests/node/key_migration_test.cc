// KeyMigration and KeyOwnership without sockets: which keys a view owns; a drop computed
// for one view and entries moved here for the next, in both orders the threads allow.
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/core/key_range.h"
#include "pscore/core/kv_codec.h"
#include "pscore/node/common/executor.h"
#include "pscore/node/server/key_migration.h"
#include "pscore/node/server/key_ownership.h"
#include "node/no_links.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

// The first key from `from` whose range is `range` of `n` and, when `then_n` > 0, range
// `then_range` of `then_n`.
uint64_t KeyIn(uint64_t from, int range, int n, int then_range = -1, int then_n = 0) {
  for (uint64_t key = from; key < from + 1000000; ++key) {
    if (core::ServerForKey(key, n) != range) continue;
    if (then_n > 0 && core::ServerForKey(key, then_n) != then_range) continue;
    return key;
  }
  FAIL("no key of range " << range << "/" << n << " then " << then_range << "/" << then_n);
  return 0;
}

struct Server {
  comm::EventLoop loop{"migration-test"};
  KeyOwnership ownership{"s0"};
  testing::NoLinks links;
  ParamService params{ParamService::Options{"s0", "", 0, 0}, core::ParamStore::Options{}, &loop, &ownership, &links,
                      std::make_shared<std::atomic<uint64_t>>(0)};
  Executor executor{2};
  comm::AliveToken alive;
  KeyMigration migration{"s0", &loop, &executor, alive.watch(), &ownership, &params, &links};

  Server() {
    REQUIRE(loop.Start().ok());
    REQUIRE(params.Open().ok());
    auto lock = ownership.Exclusive();
    ownership.Adopt(/*rank=*/1, /*n=*/2, /*replicas=*/1);
  }
  ~Server() {
    executor.Shutdown();
    params.Stop();
    loop.Stop().IgnoreError();
  }
  bool Has(uint64_t key) const {
    uint32_t len = 0;
    return params.store().Lens(&key, 1, &len).ok();
  }
  // Rank 1 of 2's view settles (asked on the loop thread); how many keys the drop took.
  // `seen` runs where the drop reports.
  std::future<size_t> AskDrop(bool changed, std::function<void()> seen = nullptr) {
    auto dropped = std::make_shared<std::promise<size_t>>();
    std::future<size_t> count = dropped->get_future();
    loop.RunAndWait([&] {
      migration.DropNotHeld(1, 2, 1, changed, [dropped, seen](size_t n) {
        if (seen) seen();
        dropped->set_value(n);
      });
    });
    return count;
  }
  // Another server's entries for `key` reach this one on the calling thread; the answer.
  std::future<Status> Deliver(uint64_t key, const std::vector<float>& values) {
    auto answered = std::make_shared<std::promise<Status>>();
    std::future<Status> answer = answered->get_future();
    const auto len = static_cast<uint32_t>(values.size());
    DataRequest req;
    req.from_role = pb::SERVER;
    req.handler = kMigrateHandler;
    req.payload = core::EncodeKvPairs(&key, 1, &len, values.data(), values.size());
    migration.HandleEntries(
        req, Responder::Make(&loop, alive.watch(), [answered](const Status& st, Payload) { answered->set_value(st); }));
    return answer;
  }
};

template <typename T>
T Within10s(std::future<T> f) {
  REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  return f.get();
}

TEST_CASE("ownership: the one server of a job owns every key - rank 0 of 2 refuses a key of rank 1, naming it",
          "[node][server][scaling]") {
  std::vector<uint64_t> keys(100000);
  std::iota(keys.begin(), keys.end(), uint64_t{0});
  keys.push_back(UINT64_MAX);
  KeyOwnership one{"s0"};
  {
    auto lock = one.Exclusive();
    one.Adopt(/*rank=*/0, /*n=*/1, /*replicas=*/1);
  }
  CHECK(one.CheckOwned(keys.data(), keys.size()).ok());
  for (uint64_t key : keys) REQUIRE(core::ServerForKey(key, 1) == 0);
  KeyOwnership two{"s0"};
  {
    auto lock = two.Exclusive();
    two.Adopt(/*rank=*/0, /*n=*/2, /*replicas=*/1);
  }
  const uint64_t mine = KeyIn(0, 0, 2), theirs = KeyIn(0, 1, 2);
  CHECK(two.CheckOwned(&mine, 1).ok());
  const uint64_t both[] = {mine, theirs};
  const Status st = two.CheckOwned(both, 2);
  CHECK(st.code() == Code::kAborted);
  CHECK(st.message() == "key " + std::to_string(theirs) + " is owned by server rank 1 of 2, not 0");
}

TEST_CASE("ownership: every range held elsewhere - only with another live replica of each, not one being rebuilt",
          "[node][server][replication]") {
  auto held_elsewhere = [](int rank, int n, int replicas, std::vector<char> live, std::vector<char> resyncing) {
    KeyOwnership o{"s" + std::to_string(rank)};
    auto lock = o.Exclusive();
    KeyView v;
    v.rank = rank;
    v.n = n;
    v.replicas = replicas;
    v.live = std::move(live);
    v.resyncing = std::move(resyncing);
    o.Settle(v);
    return o.EveryRangeHeldElsewhere();
  };
  CHECK_FALSE(held_elsewhere(0, 2, 1, {1, 1}, {0, 0}));   // one copy of each range
  CHECK(held_elsewhere(0, 2, 2, {1, 1}, {0, 0}));         // the other server holds both ranges too
  CHECK_FALSE(held_elsewhere(0, 2, 2, {1, 0}, {0, 0}));   // ... but it is down
  CHECK_FALSE(held_elsewhere(0, 2, 2, {1, 1}, {0, 1}));   // ... or being rebuilt
  CHECK(held_elsewhere(1, 3, 2, {1, 1, 1}, {0, 0, 0}));   // rank 1 holds ranges 0 and 1: ranks 0 and 2 too
  CHECK_FALSE(held_elsewhere(1, 3, 2, {1, 1, 0}, {0, 0, 0}));  // range 1's other copy is on rank 2, down
  CHECK_FALSE(held_elsewhere(1, 3, 2, {0, 1, 1}, {0, 0, 0}));  // range 0's other copy is on rank 0, down
}

TEST_CASE("migration: entries moved here while a drop of an earlier view is queued survive it",
          "[node][server][scaling]") {
  Server s;
  // Rank 1 of 2 holds a key of range 0 (moved away by the last scale): the drop takes it.
  const uint64_t stale = KeyIn(0, /*range=*/0, /*n=*/2);
  s.params.store().Insert(stale, std::vector<float>(4, 1.0f));
  // The next scale-out (3 servers) gives rank 1 a key of what was range 0 of 2.
  const uint64_t moved = KeyIn(stale + 1, /*range=*/0, /*n=*/2, /*then_range=*/1, /*then_n=*/3);

  // The drop lane is busy (an earlier drop waiting for a stripe, say) when the view settles.
  std::promise<void> release;
  std::shared_future<void> busy = release.get_future().share();
  s.executor.Submit(KeyMigration::kDropLane, [busy] { busy.wait(); });
  std::future<size_t> dropped = s.AskDrop(/*changed=*/true);
  // Another server's entries for the next view arrive on a handler thread meanwhile.
  const std::vector<float> values(4, 7.0f);
  std::future<Status> stored = s.Deliver(moved, values);
  release.set_value();

  CHECK(Within10s(std::move(dropped)) == 1);
  CHECK(Within10s(std::move(stored)).ok());
  CHECK_FALSE(s.Has(stale));
  REQUIRE(s.Has(moved));
  std::vector<uint32_t> lens;
  std::vector<float> got;
  REQUIRE(s.params.store().Pull(&moved, 1, &lens, &got).ok());
  CHECK(got == values);
}

TEST_CASE("migration: a drop runs off the loop thread and entries with no drop queued are stored at once",
          "[node][server][scaling]") {
  Server s;
  const uint64_t stale = KeyIn(0, /*range=*/0, /*n=*/2);
  s.params.store().Insert(stale, std::vector<float>(2, 1.0f));
  std::atomic<bool> on_loop{true};
  CHECK(Within10s(s.AskDrop(/*changed=*/true, [&] { on_loop = s.loop.InLoopThread(); })) == 1);
  CHECK_FALSE(on_loop.load());

  // No drop queued: the entries are stored by the calling thread before it returns.
  const uint64_t moved = KeyIn(stale + 1, /*range=*/0, /*n=*/2);
  std::future<Status> stored = s.Deliver(moved, std::vector<float>(2, 3.0f));
  CHECK(s.Has(moved));
  CHECK(Within10s(std::move(stored)).ok());
}

TEST_CASE("migration: a settled view looks for entries not held only after a change or entries moved here",
          "[node][server][scaling]") {
  Server s;
  CHECK(Within10s(s.AskDrop(/*changed=*/true)) == 0);  // nothing here yet
  // Entries of a range rank 1 of 2 does not hold (a scale-out rolled back after they were
  // sent): the next settle, though the view is the same, drops them.
  const uint64_t foreign = KeyIn(0, /*range=*/0, /*n=*/2);
  REQUIRE(Within10s(s.Deliver(foreign, std::vector<float>(2, 5.0f))).ok());
  REQUIRE(s.Has(foreign));
  CHECK(Within10s(s.AskDrop(/*changed=*/false)) == 1);
  CHECK_FALSE(s.Has(foreign));
  // A change of view looks again whatever came before.
  s.params.store().Insert(foreign, std::vector<float>(2, 1.0f));
  CHECK(Within10s(s.AskDrop(/*changed=*/true)) == 1);
}

// The scale-in's switch runs on the move lane; a rollback settles the view on the loop
// thread. When the settle comes first, the switch belongs to a scale that is over: taken,
// it would leave this server serving the ranges of a membership that is gone.
TEST_CASE("migration: a scale's switch that runs after the view settled again (rolled back meanwhile) is not taken",
          "[node][server][scaling]") {
  Server s;  // s0, rank 1 of 2
  const uint64_t own = KeyIn(0, /*range=*/1, /*n=*/2);
  s.params.store().Insert(own, std::vector<float>(2, 1.0f));
  std::promise<void> release;
  std::shared_future<void> busy = release.get_future().share();
  s.executor.Submit(KeyMigration::kMoveLane, [busy] { busy.wait(); });
  pb::SendMetadataMessage md;
  for (auto [id, rank] : {std::pair<const char*, int>{"s1", 0}, {"s0", 1}}) {
    pb::ServersMeta* m = md.add_servers_meta();
    m->set_node_id(id);
    m->set_rank_id(rank);
    m->set_role(pb::SERVER);
  }
  pb::ScaleInMessage leave;
  leave.add_leaving_node_ids("s0");
  std::atomic<bool> handed_over{false};
  s.loop.RunAndWait([&] { s.migration.OnScaleInStart(md, leave, [&] { handed_over = true; }); });
  {
    KeyView before;
    before.rank = 1;
    before.n = 2;
    auto lock = s.ownership.Exclusive();
    s.ownership.Settle(before);
  }
  release.set_value();
  auto lane_ran = std::make_shared<std::promise<void>>();
  std::future<void> ran = lane_ran->get_future();
  s.executor.Submit(KeyMigration::kMoveLane, [lane_ran] { lane_ran->set_value(); });
  Within10s(std::move(ran));
  {
    auto lock = s.ownership.Share();
    CHECK(s.ownership.view().rank == 1);
    CHECK(s.ownership.view().n == 2);
  }
  CHECK(s.Has(own));
  CHECK_FALSE(handed_over.load());
}

}  // namespace
}  // namespace pscore::node
