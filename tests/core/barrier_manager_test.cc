#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pscore/core/barrier_manager.h"
#include "pscore/core/clock.h"

// Catch2 comes after core headers: glog (via status.h) also defines CHECK, and the last
// definition wins. Here CHECK must be Catch's non-aborting assertion.
#include <catch2/catch.hpp>

namespace pscore::core {
namespace {

using Names = std::vector<std::string>;

// Records the answers of each Arrive; keyed by a label the test chooses.
struct Answers {
  std::map<std::string, std::vector<Status>> got;
  BarrierManager::Callback For(const std::string& label) {
    return [this, label](Status s) { got[label].push_back(std::move(s)); };
  }
  int calls(const std::string& label) const {
    auto it = got.find(label);
    return it == got.end() ? 0 : static_cast<int>(it->second.size());
  }
  const Status& last(const std::string& label) const { return got.at(label).back(); }
};

const Names kThree = {"w0", "w1", "w2"};

}  // namespace

TEST_CASE("barrier passes when every participant arrives", "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.Arrive("b1", "w0", Millis(100), kThree, a.For("w0"));
  bm.Arrive("b1", "w2", Millis(100), {"w2", "w1", "w0", "w1"}, a.For("w2"));  // Order, dups.
  CHECK(a.calls("w0") == 0);
  std::vector<BarrierInfo> info = bm.List();
  REQUIRE(info.size() == 1);
  CHECK(info[0].state == BarrierState::kWaiting);
  CHECK(info[0].arrived == 2);
  CHECK(info[0].expected == 3);
  CHECK(info[0].missing == Names{"w1"});

  bm.Arrive("b1", "w1", Millis(100), kThree, a.For("w1"));
  for (const char* w : {"w0", "w1", "w2"}) {
    REQUIRE(a.calls(w) == 1);
    CHECK(a.last(w).ok());
  }
  CHECK(bm.List()[0].state == BarrierState::kPassed);
  CHECK_FALSE(bm.NextDeadline().has_value());
}

TEST_CASE("barrier timeout names arrived, expected and missing", "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.Arrive("b1", "w0", Millis(100), kThree, a.For("w0"));
  clock.Advance(Millis(60));
  bm.Arrive("b1", "w1", Millis(10000), kThree, a.For("w1"));  // Deadline is the first's.
  CHECK(*bm.NextDeadline() == clock.Now() + Millis(40));
  clock.Advance(Millis(39));
  bm.Tick();
  CHECK(a.calls("w0") == 0);
  clock.Advance(Millis(1));
  bm.Tick();
  Status expected(Code::kTimeout, "barrier b1 timed out: 2/3 arrived (first: w0), missing: w2");
  CHECK(a.last("w0") == expected);
  CHECK(a.last("w1") == expected);
  CHECK(bm.List()[0].state == BarrierState::kFailed);

  bm.Arrive("b1", "w2", Millis(100), kThree, a.For("w2"));  // Late caller of that round.
  CHECK(a.last("w2") == expected);
  bm.Tick();
  CHECK(a.calls("w0") == 1);
}

TEST_CASE("barrier with a different participant set fails at once for all",
          "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.Arrive("b1", "w0", Millis(100), kThree, a.For("w0"));
  bm.Arrive("b1", "w1", Millis(100), {"w0", "w1"}, a.For("w1"));
  REQUIRE(a.calls("w0") == 1);
  REQUIRE(a.calls("w1") == 1);
  CHECK(a.last("w0").code() == Code::kFailedPrecondition);
  CHECK(a.last("w0") == a.last("w1"));
  CHECK(a.last("w0").message() ==
        "barrier b1: participant set mismatch: w1 gave [w0, w1] but the first arrival "
        "fixed [w0, w1, w2]");
  bm.Arrive("b1", "w2", Millis(100), kThree, a.For("w2"));
  CHECK(a.last("w2") == a.last("w0"));
  CHECK_FALSE(bm.NextDeadline().has_value());
}

TEST_CASE("barrier caller outside the set fails it at once for all", "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.Arrive("b1", "w0", Millis(100), kThree, a.For("w0"));
  bm.Arrive("b1", "s9", Millis(100), kThree, a.For("s9"));
  REQUIRE(a.calls("w0") == 1);
  CHECK(a.last("w0").code() == Code::kInvalidArgument);
  CHECK(a.last("w0").message().find("s9") != std::string::npos);
  CHECK(a.last("s9") == a.last("w0"));

  Answers b;  // A first arrival outside its own set fails at once too.
  bm.Arrive("b2", "x", Millis(100), {"w0"}, b.For("x"));
  CHECK(b.last("x").code() == Code::kInvalidArgument);
}

TEST_CASE("barrier over all nodes uses the set at the first arrival", "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.Arrive("none", "w0", Millis(100), {}, a.For("empty"));
  CHECK(a.last("empty").code() == Code::kFailedPrecondition);

  bm.SetAllNodes({"w1", "w0"});
  bm.Arrive("all", "w0", Millis(100), {}, a.For("w0"));
  bm.SetAllNodes({"w0", "w1", "w2"});  // Does not change the open round.
  bm.Arrive("all", "w1", Millis(100), {}, a.For("w1"));
  CHECK(a.last("w0").ok());
  CHECK(a.last("w1").ok());

  // An explicit set equal to the current node list matches "all"; empty matches it too.
  bm.Arrive("mixed", "w0", Millis(100), kThree, a.For("m0"));
  bm.Arrive("mixed", "w1", Millis(100), {}, a.For("m1"));
  bm.Arrive("mixed", "w2", Millis(100), {}, a.For("m2"));
  CHECK(a.last("m0").ok());
  CHECK(a.last("m2").ok());
}

TEST_CASE("barrier rounds: the k-th arrival of a node is generation k", "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.Arrive("b", "w0", Millis(100), {"w0", "w1"}, a.For("w0-1"));
  bm.Arrive("b", "w0", Millis(100), {"w0", "w1"}, a.For("w0-2"));  // Runs ahead.
  bm.Arrive("b", "w1", Millis(100), {"w0", "w1"}, a.For("w1-1"));
  CHECK(a.last("w0-1").ok());
  CHECK(a.calls("w0-2") == 0);
  bm.Arrive("b", "w1", Millis(100), {"w0", "w1"}, a.For("w1-2"));
  CHECK(a.last("w0-2").ok());
  CHECK(a.last("w1-2").ok());

  // Round 3 times out without w1; w1's third arrival learns it at once, its fourth waits.
  bm.Arrive("b", "w0", Millis(100), {"w0", "w1"}, a.For("w0-3"));
  clock.Advance(Millis(100));
  bm.Tick();
  CHECK(a.last("w0-3").message() == "barrier b (generation 3) timed out: 1/2 arrived (first: w0), "
                                    "missing: w1");
  bm.Arrive("b", "w1", Millis(100), {"w0", "w1"}, a.For("w1-3"));
  CHECK(a.last("w1-3") == a.last("w0-3"));
  bm.Arrive("b", "w1", Millis(100), {"w0", "w1"}, a.For("w1-4"));
  CHECK(a.calls("w1-4") == 0);
  bm.Arrive("b", "w0", Millis(100), {"w0", "w1"}, a.For("w0-4"));
  CHECK(a.last("w1-4").ok());
}

TEST_CASE("barrier retry with an explicit generation gets the same result",
          "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.Arrive("b", "w0", Millis(100), {"w0", "w1"}, a.For("w0"));
  bm.Arrive("b", "w0", Millis(100), {"w0", "w1"}, a.For("w0-dup"), 1);  // Retry, waiting.
  // The second call from w0 while its round waits supersedes the first.
  REQUIRE(a.calls("w0") == 1);
  CHECK(a.last("w0").code() == Code::kCancelled);
  CHECK_THAT(a.last("w0").message(), Catch::Contains("w0 called again"));
  CHECK(bm.List()[0].arrived == 1);
  bm.Arrive("b", "w1", Millis(100), {"w0", "w1"}, a.For("w1"));
  CHECK(a.calls("w0") == 1);
  CHECK(a.last("w0-dup").ok());
  bm.Arrive("b", "w1", Millis(100), {"w0", "w1"}, a.For("w1-retry"), 1);  // Passed already.
  REQUIRE(a.calls("w1-retry") == 1);
  CHECK(a.last("w1-retry").ok());
  CHECK(bm.List().size() == 1);  // The retry opened no new round.
  bm.Arrive("b", "w9", Millis(100), {"w0", "w1"}, a.For("w9"), 1);
  CHECK(a.last("w9").code() == Code::kInvalidArgument);
  CHECK(bm.List()[0].state == BarrierState::kPassed);
}

TEST_CASE("barrier cancel answers waiters - passed or unknown is an error", "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  Status unknown = bm.Cancel("nope");
  CHECK(unknown.code() == Code::kFailedPrecondition);
  CHECK_THAT(unknown.message(), Catch::Contains("barrier nope is unknown"));
  bm.Arrive("b1", "w0", Millis(100), kThree, a.For("w0"));
  bm.Arrive("b1", "w1", Millis(100), kThree, a.For("w1"));
  REQUIRE(bm.Cancel("b1").ok());
  CHECK(a.last("w0") == Status(Code::kCancelled, "barrier b1 cancelled"));
  CHECK(a.last("w1").code() == Code::kCancelled);
  CHECK(bm.Cancel("b1").code() == Code::kFailedPrecondition);
  bm.Arrive("b1", "w2", Millis(100), kThree, a.For("w2"));  // Late to the cancelled round.
  CHECK(a.last("w2").code() == Code::kCancelled);

  bm.Arrive("p", "w0", Millis(100), {"w0"}, a.For("p"));
  CHECK(a.last("p").ok());
  Status passed = bm.Cancel("p");
  CHECK(passed.code() == Code::kFailedPrecondition);
  CHECK(passed.message() == "barrier p already passed; nothing to cancel");
  clock.Advance(Millis(1000));
  bm.Tick();
  CHECK(a.calls("w0") == 1);
}

TEST_CASE("barrier cancel-all answers every waiting round", "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.Arrive("x", "w0", Millis(100), kThree, a.For("x"));
  bm.Arrive("y", "w1", Millis(100), kThree, a.For("y"));
  bm.Arrive("z", "w0", Millis(100), {"w0"}, a.For("z"));
  Status stop(Code::kUnavailable, "scheduler stopping");
  bm.CancelAll(stop);
  CHECK(a.last("x") == stop);
  CHECK(a.last("y") == stop);
  CHECK(a.last("z").ok());  // Already passed: untouched and not answered twice.
  CHECK(a.calls("z") == 1);
  CHECK_FALSE(bm.NextDeadline().has_value());
}

TEST_CASE("barrier fails for all when a participant fails", "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.Arrive("b1", "w0", Millis(100), kThree, a.For("b1-w0"));
  bm.Arrive("b2", "w0", Millis(100), {"w0", "w1"}, a.For("b2-w0"));
  bm.NodeFailed("w2", "heartbeat lost");
  REQUIRE(a.calls("b1-w0") == 1);
  CHECK(a.last("b1-w0") ==
        Status(Code::kAborted, "barrier b1 failed: participant w2 failed: heartbeat lost"));
  CHECK(a.calls("b2-w0") == 0);  // w2 is not in b2.
  bm.Arrive("b2", "w1", Millis(100), {"w0", "w1"}, a.For("b2-w1"));
  CHECK(a.last("b2-w0").ok());

  // Until w2 is back, a round naming it fails at its first arrival.
  bm.Arrive("b3", "w0", Millis(100), kThree, a.For("b3-w0"));
  REQUIRE(a.calls("b3-w0") == 1);
  CHECK(a.last("b3-w0") ==
        Status(Code::kAborted, "barrier b3 failed: participant w2 failed: heartbeat lost"));
  // After restarting, w2 joins the next fresh round of b1 rather than the failed one.
  bm.NodeRecovered("w2");
  bm.Arrive("b1", "w2", Millis(100), kThree, a.For("b1-w2"));
  CHECK(a.calls("b1-w2") == 0);
  bm.Arrive("b1", "w0", Millis(100), kThree, a.For("b1-w0"));
  bm.Arrive("b1", "w1", Millis(100), kThree, a.For("b1-w1"));  // w1's 1st: the failed round.
  CHECK(a.last("b1-w1").code() == Code::kAborted);
  bm.Arrive("b1", "w1", Millis(100), kThree, a.For("b1-w1"));
  CHECK(a.last("b1-w2").ok());
  CHECK(a.last("b1-w1").ok());
}

TEST_CASE("barrier naming a member not in the cluster fails INVALID_ARGUMENT for all at once",
          "[core][barrier][parity]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  bm.SetMembership([](const std::string& n) { return n == "w0" || n == "w1"; });
  Answers a;
  bm.Arrive("b", "w0", Millis(100000), {"w0", "w1"}, a.For("w0"));
  CHECK(a.calls("w0") == 0);
  bm.Arrive("b", "w1", Millis(100000), {"w0", "w1", "ghost"}, a.For("w1"));
  REQUIRE(a.calls("w0") == 1);
  REQUIRE(a.calls("w1") == 1);
  CHECK(a.last("w0").code() == Code::kInvalidArgument);
  CHECK_THAT(a.last("w0").message(), Catch::Contains("participant ghost is not in the cluster"));
  CHECK(a.last("w1") == a.last("w0"));
  bm.Arrive("c", "w0", Millis(100000), {"w0", "ghost"}, a.For("c-w0"));
  REQUIRE(a.calls("c-w0") == 1);
  CHECK(a.last("c-w0").code() == Code::kInvalidArgument);
  CHECK_THAT(a.last("c-w0").message(), Catch::Contains("participant ghost is not in the cluster"));
  CHECK_FALSE(bm.NextDeadline().has_value());
}

TEST_CASE("barrier over a participant that failed before fails at once - recovered, it waits again",
          "[core][barrier][parity]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.NodeFailed("w1", "it shut down (called Finish)");
  bm.Arrive("b", "w0", Millis(100000), {"w0", "w1"}, a.For("w0"));
  REQUIRE(a.calls("w0") == 1);
  CHECK(a.last("w0").code() == Code::kAborted);
  CHECK_THAT(a.last("w0").message(), Catch::Contains("participant w1 failed: it shut down"));
  bm.NodeRecovered("w1");
  bm.Arrive("b2", "w0", Millis(100000), {"w0", "w1"}, a.For("w0-2"));
  CHECK(a.calls("w0-2") == 0);
  bm.Arrive("b2", "w1", Millis(100000), {"w0", "w1"}, a.For("w1-2"));
  CHECK(a.last("w0-2").ok());
  CHECK(a.last("w1-2").ok());
}

TEST_CASE("barrier timeout names k/n and the first arrival and at most three stragglers", "[core][barrier][parity]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  const Names six = {"w0", "w1", "w2", "w3", "w4", "w5"};
  bm.Arrive("b", "w4", Millis(10), six, a.For("w4"));
  bm.Arrive("b", "w1", Millis(10), six, a.For("w1"));
  clock.Advance(Millis(11));
  bm.Tick();
  REQUIRE(a.calls("w4") == 1);
  CHECK(a.last("w4") ==
        Status(Code::kTimeout, "barrier b timed out: 2/6 arrived (first: w4), missing: w0, w2, w3 and 1 more"));
}

TEST_CASE("a second barrier call while the first waits cancels the first - the round still passes once",
          "[core][barrier][parity]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.Arrive("b", "w0", Millis(1000), {"w0", "w1"}, a.For("first"), 1, /*owner=*/7);
  CHECK(bm.waiting_of(7) == 1);
  bm.Arrive("b", "w0", Millis(1000), {"w0", "w1"}, a.For("second"), 1, /*owner=*/8);
  REQUIRE(a.calls("first") == 1);
  CHECK(a.last("first").code() == Code::kCancelled);
  CHECK(bm.waiting_of(7) == 0);
  CHECK(bm.waiting_of(8) == 1);
  bm.Withdraw(7);  // the superseded call's connection closing changes nothing
  CHECK(bm.List()[0].arrived == 1);
  bm.Arrive("b", "w1", Millis(1000), {"w0", "w1"}, a.For("w1"), 1);
  CHECK(a.last("second").ok());
  CHECK(a.calls("first") == 1);
  CHECK(a.last("w1").ok());
}

TEST_CASE("barrier callbacks may re-enter the manager", "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  int passed = 0;
  std::function<void(const std::string&)> arrive = [&](const std::string& node) {
    bm.Arrive("loop", node, Millis(100), {"a", "b"}, [&, node](Status s) {
      if (!s.ok()) return;
      if (++passed < 10) arrive(node);
    });
  };
  arrive("a");
  arrive("b");
  CHECK(passed == 10);
}

TEST_CASE("barrier 64 nodes x 100 rounds of one id all pass", "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Names nodes;
  for (int i = 0; i < 64; ++i) nodes.push_back("n" + std::to_string(i));
  bm.SetAllNodes(nodes);
  int ok = 0;
  int answered = 0;
  for (int round = 0; round < 100; ++round) {
    for (const std::string& n : nodes) {
      bm.Arrive("step", n, Millis(1000), round % 2 ? Names{} : nodes, [&](Status s) {
        ++answered;
        if (s.ok()) ++ok;
      });
    }
    clock.Advance(Millis(1));
    bm.Tick();
  }
  CHECK(answered == 6400);
  CHECK(ok == 6400);
  std::vector<BarrierInfo> info = bm.List();
  REQUIRE(info.size() == 1);  // Old rounds are pruned.
  CHECK(info[0].generation == 100);
  CHECK(info[0].state == BarrierState::kPassed);
}

TEST_CASE("barrier ids whose rounds ended are forgotten after their idle time - waiting ones never",
          "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock, Millis(1000));
  Answers a;
  // 1,000 ids used once each (one per step), all passed.
  for (int step = 0; step < 1000; ++step) {
    const std::string id = "step-" + std::to_string(step);
    bm.Arrive(id, "w0", Millis(100), {"w0", "w1"}, a.For("w0"));
    bm.Arrive(id, "w1", Millis(100), {"w0", "w1"}, a.For("w1"));
  }
  REQUIRE(a.calls("w0") == 1000);
  // One round that waits with a deadline far away, and one id whose round is retried late.
  bm.Arrive("slow", "w0", Millis(60000), {"w0", "w1"}, a.For("slow"));
  CHECK(bm.ids() == 1001);
  clock.Advance(Millis(999));
  bm.Tick();
  CHECK(bm.ids() == 1001);  // not yet
  bm.Arrive("step-7", "w1", Millis(100), {"w0", "w1"}, a.For("retry"), 1);  // a late retry: still answered
  REQUIRE(a.calls("retry") == 1);
  CHECK(a.last("retry").ok());
  clock.Advance(Millis(1));
  bm.Tick();
  CHECK(bm.ids() == 2);  // the retried id was active 1 ms ago; the waiting one stays
  clock.Advance(Millis(999));
  bm.Tick();
  CHECK(bm.ids() == 1);
  std::vector<BarrierInfo> info = bm.List();
  REQUIRE(info.size() == 1);
  CHECK(info[0].id == "slow");
  CHECK(info[0].state == BarrierState::kWaiting);
  CHECK(a.calls("slow") == 0);
  // A forgotten id starts again at round 1, for every node alike.
  bm.Arrive("step-3", "w0", Millis(100), {"w0", "w1"}, a.For("again-w0"));
  bm.Arrive("step-3", "w1", Millis(100), {"w0", "w1"}, a.For("again-w1"));
  REQUIRE(a.calls("again-w1") == 1);
  CHECK(a.last("again-w0").ok());
  info = bm.List();
  REQUIRE(info.size() == 2);
  CHECK(info[0].id == "slow");
  CHECK(info[1].generation == 1);
  // The waiting round ends at its deadline, and its id is forgotten keep_ended later.
  clock.Advance(Millis(60000));
  bm.Tick();
  CHECK(a.last("slow").code() == Code::kTimeout);
  CHECK(bm.ids() == 1);
  clock.Advance(Millis(1000));
  bm.Tick();
  CHECK(bm.ids() == 0);
}

TEST_CASE("barrier arrivals of a closed connection are withdrawn - the node no longer counts as arrived",
          "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  constexpr uint64_t kConnA = 7, kConnB = 8;
  bm.Arrive("b1", "w0", Millis(1000), kThree, a.For("w0"), 0, kConnA);
  bm.Arrive("b1", "w1", Millis(1000), kThree, a.For("w1"), 0, kConnB);
  CHECK(bm.waiting_of(kConnA) == 1);
  bm.Withdraw(kConnA);
  REQUIRE(a.calls("w0") == 1);
  CHECK(a.last("w0").code() == Code::kCancelled);
  CHECK_THAT(a.last("w0").message(), Catch::Contains("connection that arrived for w0 closed"));
  CHECK(bm.waiting_of(kConnA) == 0);
  // w1 keeps waiting; w0 is missing again.
  std::vector<BarrierInfo> info = bm.List();
  REQUIRE(info.size() == 1);
  CHECK(info[0].state == BarrierState::kWaiting);
  CHECK(info[0].arrived == 1);
  CHECK(info[0].missing == Names{"w0", "w2"});
  // w2 arriving does not pass the round: the departed w0 no longer counts.
  bm.Arrive("b1", "w2", Millis(1000), kThree, a.For("w2"), 0, kConnB);
  CHECK(a.calls("w1") == 0);
  CHECK(a.calls("w2") == 0);
  // w0 reconnects and arrives again: it rejoins the same round, which passes.
  bm.Arrive("b1", "w0", Millis(1000), kThree, a.For("w0 again"), 0, 9);
  REQUIRE(a.calls("w0 again") == 1);
  CHECK(a.last("w0 again").ok());
  CHECK(a.last("w1").ok());
  CHECK(a.last("w2").ok());
  info = bm.List();
  REQUIRE(info.size() == 1);
  CHECK(info[0].generation == 1);
}

TEST_CASE("a barrier round whose every waiter withdrew is dropped - it counts against nobody",
          "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.Arrive("b1", "w0", Millis(1000), kThree, a.For("w0"), 0, 7);
  bm.Withdraw(7);
  CHECK(a.calls("w0") == 1);
  CHECK(bm.List().empty());
  CHECK_FALSE(bm.NextDeadline().has_value());
  // The node's next arrival opens round 1 again, with its own timeout.
  bm.Arrive("b1", "w0", Millis(50), kThree, a.For("w0 again"), 0, 8);
  REQUIRE(bm.List().size() == 1);
  CHECK(bm.List()[0].generation == 1);
  clock.Advance(Millis(50));
  bm.Tick();
  REQUIRE(a.calls("w0 again") == 1);
  CHECK(a.last("w0 again").code() == Code::kTimeout);
}

TEST_CASE("barrier arrivals waiting on one connection are capped - others may still arrive",
          "[core][barrier]") {
  FakeClock clock;
  BarrierLimits limits;
  limits.max_waiting_per_owner = 3;
  BarrierManager bm(&clock, BarrierManager::kDefaultKeepEnded, limits);
  Answers a;
  for (int i = 0; i < 3; ++i) bm.Arrive("b1", "w0", Millis(1000), kThree, a.For("w0"), 0, 7);
  CHECK(a.calls("w0") == 0);
  bm.Arrive("b1", "w0", Millis(1000), kThree, a.For("over"), 0, 7);
  REQUIRE(a.calls("over") == 1);
  CHECK(a.last("over").code() == Code::kResourceExhausted);
  CHECK_THAT(a.last("over").message(), Catch::Contains("3 barrier arrivals already wait"));
  bm.Arrive("b1", "w1", Millis(1000), kThree, a.For("w1"), 0, 8);
  CHECK(a.calls("w1") == 0);
  CHECK(bm.waiting_of(8) == 1);
  // The default is 4096, as for blocking KV gets.
  CHECK(BarrierLimits{}.max_waiting_per_owner == 4096);
}

TEST_CASE("barrier rounds a connection opens are capped, and so are all rounds - refusals change nothing",
          "[core][barrier]") {
  FakeClock clock;
  BarrierLimits limits;
  limits.max_rounds_per_owner = 2;
  limits.max_rounds = 3;
  BarrierManager bm(&clock, BarrierManager::kDefaultKeepEnded, limits);
  Answers a;
  bm.Arrive("r1", "w0", Millis(1000), kThree, a.For("r1"), 0, 7);
  bm.Arrive("r2", "w0", Millis(1000), kThree, a.For("r2"), 0, 7);
  bm.Arrive("r3", "w0", Millis(1000), kThree, a.For("r3"), 0, 7);
  REQUIRE(a.calls("r3") == 1);
  CHECK(a.last("r3").code() == Code::kResourceExhausted);
  CHECK_THAT(a.last("r3").message(), Catch::Contains("opened on this connection"));
  CHECK(bm.ids() == 2);  // the refused id was not kept
  // Joining a round another connection opened is not opening one.
  bm.Arrive("r1", "w1", Millis(1000), kThree, a.For("r1 w1"), 0, 7);
  CHECK(a.calls("r1 w1") == 0);
  // Another connection opens the third round, then the total is reached.
  bm.Arrive("r3", "w1", Millis(1000), kThree, a.For("r3 w1"), 0, 8);
  CHECK(a.calls("r3 w1") == 0);
  bm.Arrive("r4", "w1", Millis(1000), kThree, a.For("r4"), 0, 9);
  REQUIRE(a.calls("r4") == 1);
  CHECK(a.last("r4").code() == Code::kResourceExhausted);
  CHECK_THAT(a.last("r4").message(), Catch::Contains("3 barrier rounds already wait"));
  // A round that ends frees its place: r2 is cancelled, so connection 7 may open one more.
  REQUIRE(bm.Cancel("r2").ok());
  bm.Arrive("r5", "w0", Millis(1000), kThree, a.For("r5"), 0, 7);
  CHECK(a.calls("r5") == 0);
  // The refused w0 arrival on r3 did not move w0's counter: it joins round 1 of r3.
  bm.Arrive("r3", "w0", Millis(1000), kThree, a.For("r3 again"), 0, 7);
  CHECK(a.calls("r3 again") == 0);
  for (const BarrierInfo& info : bm.List()) {
    if (info.id == "r3") CHECK(info.arrived == 2);
  }
}

TEST_CASE("barrier timeouts over 24 hours are refused - 24 hours is accepted", "[core][barrier]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  bm.Arrive("b1", "w0", std::chrono::hours(24) + Millis(1), kThree, a.For("long"));
  REQUIRE(a.calls("long") == 1);
  CHECK(a.last("long").code() == Code::kInvalidArgument);
  CHECK_THAT(a.last("long").message(), Catch::Contains("over the limit of 86400000 ms"));
  CHECK(bm.ids() == 0);
  bm.Arrive("b1", "w0", std::chrono::hours(24), kThree, a.For("day"));
  CHECK(a.calls("day") == 0);
  REQUIRE(bm.NextDeadline().has_value());
  CHECK(*bm.NextDeadline() == clock.Now() + std::chrono::hours(24));
}

TEST_CASE("barrier ids kept after their rounds ended are bounded - the longest idle is forgotten",
          "[core][barrier]") {
  FakeClock clock;
  BarrierLimits limits;
  limits.max_ended_ids = 2;
  BarrierManager bm(&clock, BarrierManager::kDefaultKeepEnded, limits);
  Answers a;
  for (const char* id : {"s1", "s2", "s3"}) {
    bm.Arrive(id, "w0", Millis(1000), {"w0"}, a.For(id));
    REQUIRE(a.calls(id) == 1);
    CHECK(a.last(id).ok());
    clock.Advance(Millis(1));
  }
  CHECK(bm.ids() == 2);
  std::vector<BarrierInfo> info = bm.List();
  REQUIRE(info.size() == 2);
  CHECK(info[0].id == "s2");
  CHECK(info[1].id == "s3");
}

TEST_CASE("barrier round counter: a caller ahead of the service fails INTERNAL-class, a repeat gets the stored result",
          "[core][barrier][round]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  const Names two = {"w0", "w1"};
  bm.Arrive("b", "w0", Millis(100), two, a.For("w0-1"), 1);
  bm.Arrive("b", "w1", Millis(100), two, a.For("w1-1"), 1);
  REQUIRE(a.calls("w0-1") == 1);
  CHECK(a.last("w0-1").ok());
  // Round 3 while the service has passed round 1 only: refused, nothing opened.
  bm.Arrive("b", "w0", Millis(100), two, a.For("w0-3"), 3);
  REQUIRE(a.calls("w0-3") == 1);
  CHECK(a.last("w0-3").code() == Code::kInternal);
  CHECK(a.last("w0-3").message().find("round 3") != std::string::npos);
  CHECK(bm.List().size() == 1);
  // Round 2 is the next one; a repeat of round 1 is answered at once with its result.
  bm.Arrive("b", "w0", Millis(100), two, a.For("w0-2"), 2);
  CHECK(a.calls("w0-2") == 0);
  bm.Arrive("b", "w1", Millis(100), two, a.For("w1-1again"), 1);
  REQUIRE(a.calls("w1-1again") == 1);
  CHECK(a.last("w1-1again").ok());
  bm.Arrive("b", "w1", Millis(100), two, a.For("w1-2"), 2);
  CHECK(a.last("w0-2").ok());
  CHECK(a.last("w1-2").ok());
  CHECK(bm.LastRoundOf("b", "w1") == 2);
  CHECK(bm.LastRoundOf("b", "w9") == 0);
  CHECK(bm.LastRoundOf("nope", "w1") == 0);
  // An id the manager does not know starts at the caller's round.
  bm.Arrive("fresh", "w0", Millis(100), two, a.For("f0"), 7);
  bm.Arrive("fresh", "w1", Millis(100), two, a.For("f1"), 7);
  CHECK(a.last("f0").ok());
  CHECK(a.last("f1").ok());
}

TEST_CASE("barrier round counter: newest ended rounds restore into a new manager with their results and each node's round",
          "[core][barrier][round]") {
  FakeClock clock;
  BarrierManager bm(&clock);
  Answers a;
  const Names two = {"w0", "w1"};
  for (uint64_t r = 1; r <= 3; ++r) {
    bm.Arrive("step", "w0", Millis(100), two, a.For("s0"), r);
    bm.Arrive("step", "w1", Millis(100), two, a.For("s1"), r);
  }
  bm.Arrive("late", "w0", Millis(100), two, a.For("late"), 1);
  clock.Advance(Millis(100));
  bm.Tick();
  REQUIRE(a.calls("late") == 1);
  bm.Arrive("open", "w0", Millis(100), two, a.For("open"), 1);  // still waiting: not listed
  std::vector<BarrierManager::EndedRound> ended = bm.NewestEndedRounds();
  REQUIRE(ended.size() == 2);
  CHECK(ended[0].id == "late");
  CHECK(ended[0].round == 1);
  CHECK(ended[0].result.code() == Code::kTimeout);
  CHECK(ended[1].id == "step");
  CHECK(ended[1].round == 3);
  CHECK(ended[1].result.ok());

  using Joined = std::vector<std::pair<std::string, uint64_t>>;
  CHECK(ended[0].joined == Joined{{"w0", 1}});
  CHECK(ended[1].joined == Joined{{"w0", 3}, {"w1", 3}});

  BarrierManager restarted(&clock);
  for (const auto& e : ended) restarted.RestoreEndedRound(e.id, e.round, e.result, e.joined);
  // A process restarted with its node id resumes its count where its predecessor was.
  CHECK(restarted.LastRoundOf("step", "w1") == 3);
  CHECK(restarted.LastRoundOf("late", "w0") == 1);
  // w1 never joined "late": with no round kept for it, it is told the restored round.
  CHECK(restarted.LastRoundOf("late", "w1") == 1);
  Answers b;
  // A call of the restored round is re-issued: its stored answer at once.
  restarted.Arrive("step", "w1", Millis(100), two, b.For("again"), 3);
  REQUIRE(b.calls("again") == 1);
  CHECK(b.last("again").ok());
  restarted.Arrive("late", "w1", Millis(100), two, b.For("late"), 1);
  REQUIRE(b.calls("late") == 1);
  CHECK(b.last("late") == ended[0].result);
  // Round 5 is ahead of the service; round 4 opens fresh and passes.
  restarted.Arrive("step", "w0", Millis(100), two, b.For("ahead"), 5);
  REQUIRE(b.calls("ahead") == 1);
  CHECK(b.last("ahead").code() == Code::kInternal);
  restarted.Arrive("step", "w0", Millis(100), two, b.For("w0-4"), 4);
  CHECK(b.calls("w0-4") == 0);
  restarted.Arrive("step", "w1", Millis(100), two, b.For("w1-4"), 4);
  CHECK(b.last("w0-4").ok());
  CHECK(b.last("w1-4").ok());
}

TEST_CASE("after a restart a node with no round of its own is told the restored round of an id", "[barrier]") {
  FakeClock clock;
  BarrierManager restarted(&clock);
  restarted.RestoreEndedRound("step", 7, Status::Ok());
  // The rounds each node joined were not kept: a worker restarted with the scheduler
  // resumes from the newest ended round, and its next call is round 8.
  CHECK(restarted.LastRoundOf("step", "w1") == 7);
  CHECK(restarted.LastRoundOf("other", "w1") == 0);
  const std::vector<std::string> two = {"w0", "w1"};
  Answers a;
  restarted.Arrive("step", "w0", Millis(100), two, a.For("w0-8"), 8);
  restarted.Arrive("step", "w1", Millis(100), two, a.For("w1-8"), 8);
  CHECK(a.last("w0-8").ok());
  CHECK(a.last("w1-8").ok());
  CHECK(restarted.LastRoundOf("step", "w1") == 8);
}

}  // namespace pscore::core
