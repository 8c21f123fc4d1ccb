// Registration bookkeeping the scheduler relies on to keep a REGISTER O(1): the count of
// flagged nodes (timed out or in error) and the kept table of taken ranks.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "pscore/core/cluster_manager.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::core {
namespace {

RegisterRequest Member(const std::string& id, pb::NodeRole role, uint64_t inc = 1, int rank = -1) {
  RegisterRequest req;
  req.node_id = id;
  req.role = role;
  req.ip = "10.0.0.1";
  req.port = 7000;
  req.incarnation = inc;
  req.requested_rank = rank;
  return req;
}

ClusterConfig Config(int workers, int servers) {
  ClusterConfig c;
  c.worker_num = workers;
  c.server_num = servers;
  c.heartbeat_timeout = std::chrono::seconds(30);
  return c;
}

TEST_CASE("flagged counts the nodes timed out or in error and drops as they recover or reset", "[core][cluster]") {
  FakeClock clock;
  ClusterManager cm(Config(2, 1), &clock);
  for (auto [id, role] : {std::pair{"s0", pb::SERVER}, {"w0", pb::WORKER}, {"w1", pb::WORKER}}) {
    REQUIRE(cm.Register(Member(id, role)).ok());
  }
  CHECK(cm.flagged() == 0);
  REQUIRE(cm.ReportError("w0", 7, "disk").ok());
  CHECK(cm.flagged() == 1);
  REQUIRE(cm.ReportError("w0", 8, "again").ok());  // still one node
  CHECK(cm.flagged() == 1);
  clock.Advance(std::chrono::seconds(20));
  REQUIRE(cm.Heartbeat("s0").ok());
  REQUIRE(cm.Heartbeat("w0").code() == Code::kAborted);  // in error: refused, yet counted as alive
  clock.Advance(std::chrono::seconds(11));  // w1 silent for 31 s
  cm.Tick();
  CHECK(cm.flagged() == 2);
  REQUIRE(cm.Register(Member("w1", pb::WORKER)).ok());  // recovers
  CHECK(cm.flagged() == 1);
  REQUIRE(cm.ResetNode("w0").ok());  // a reset clears the error, then the restart registers
  REQUIRE(cm.Register(Member("w0", pb::WORKER, /*inc=*/2)).ok());
  CHECK(cm.flagged() == 0);
  REQUIRE(cm.ReportError("s0", 1, "x").ok());
  REQUIRE(cm.ResetNode("s0").ok());
  CHECK(cm.flagged() == 0);
}

TEST_CASE("ranks stay dense and unique across registrations and removals and requested ranks", "[core][cluster]") {
  FakeClock clock;
  ClusterManager cm(Config(4, 1), &clock);
  REQUIRE(cm.Register(Member("s0", pb::SERVER)).ok());
  Result<RegisterOutcome> w2 = cm.Register(Member("w2", pb::WORKER, 1, /*rank=*/2));
  REQUIRE(w2.ok());
  CHECK(w2->rank == 2);
  Result<RegisterOutcome> taken = cm.Register(Member("wx", pb::WORKER, 1, /*rank=*/2));
  REQUIRE_FALSE(taken.ok());
  CHECK(taken.status().code() == Code::kAlreadyExists);
  CHECK_THAT(taken.status().message(), Catch::Contains("w2"));
  CHECK(cm.Register(Member("w0", pb::WORKER)).value().rank == 0);
  CHECK(cm.Register(Member("w1", pb::WORKER)).value().rank == 1);
  CHECK(cm.Register(Member("w3", pb::WORKER)).value().rank == 3);  // READY now
  REQUIRE(cm.state() == pb::CLUSTER_READY);
  // Scale-in removes w1 and compacts: w2 -> 1, w3 -> 2. A scale-out then hands out rank 3.
  REQUIRE(cm.ScaleInByIds({"w1"}).ok());
  for (const char* id : {"s0", "w0", "w1", "w2", "w3"}) REQUIRE(cm.ScaleInDone(id, cm.epoch()).ok());
  REQUIRE(cm.state() == pb::CLUSTER_READY);
  CHECK(cm.Find("w2")->rank == 1);
  CHECK(cm.Find("w3")->rank == 2);
  REQUIRE(cm.ScaleOut(/*worker_num=*/4, /*server_num=*/1).ok());
  Result<RegisterOutcome> w4 = cm.Register(Member("w4", pb::WORKER));
  REQUIRE(w4.ok());
  CHECK(w4->rank == 3);
}

TEST_CASE("sessions: 0 and the current one pass - another is refused failed_precondition naming both - a restore keeps it",
          "[core][cluster][session]") {
  FakeClock clock;
  ClusterManager cm(Config(1, 1), &clock);
  cm.set_session_id(41);
  CHECK(cm.session_id() == 41);
  CHECK(cm.CheckSession(0).ok());   // never registered: admin clients, subscribers
  CHECK(cm.CheckSession(41).ok());
  Status stale = cm.CheckSession(17);
  CHECK(stale.code() == Code::kFailedPrecondition);
  CHECK_THAT(stale.message(), Catch::StartsWith(kStaleSessionPrefix) && Catch::Contains("17") &&
                                  Catch::Contains("41") && Catch::Contains("register again"));
  CHECK(IsStaleSession(stale));
  // Another failed_precondition is not a stale session, nor is a stale message of another class.
  CHECK_FALSE(IsStaleSession(Status(Code::kFailedPrecondition, "node w0 already left")));
  CHECK_FALSE(IsStaleSession(Status(Code::kAborted, stale.message())));

  // With its state (--state_dir) a restarted scheduler keeps the session: the registrations
  // made in it are restored with it, so requests made under it stay valid.
  REQUIRE(cm.Register(Member("s0", pb::SERVER)).ok());
  pb::PersistedState state = cm.Snapshot();
  CHECK(state.session_id() == 41);
  ClusterManager restored(Config(1, 1), &clock);
  restored.set_session_id(99);  // what a fresh start drew
  REQUIRE(restored.Restore(state).ok());
  CHECK(restored.session_id() == 41);
  CHECK(restored.CheckSession(41).ok());
  // A state file with no session (an older file's format) keeps the drawn one.
  state.clear_session_id();
  ClusterManager older(Config(1, 1), &clock);
  older.set_session_id(99);
  REQUIRE(older.Restore(state).ok());
  CHECK(older.session_id() == 99);
  CHECK(older.CheckSession(41).code() == Code::kFailedPrecondition);
}

// The state file lags the scheduler by a write: a predecessor may have published epochs it
// did not persist. A member that knows one of them tells the restored scheduler in its
// heartbeats, and the membership goes out again past it (else members would ignore it as
// stale).
TEST_CASE("a restored scheduler moves its epoch past one a member knows and publishes the membership again",
          "[core][cluster]") {
  FakeClock clock;
  ClusterManager cm(Config(1, 1), &clock);
  REQUIRE(cm.Register(Member("s0", pb::SERVER)).ok());
  REQUIRE(cm.Register(Member("w0", pb::WORKER)).ok());
  REQUIRE(cm.state() == pb::CLUSTER_READY);
  cm.TakeEvents();
  // A scheduler that was not restored published every epoch there is: no claim is believed.
  cm.SeenEpoch(cm.epoch() + 5);
  CHECK(cm.TakeEvents().empty());
  const pb::PersistedState state = cm.Snapshot();
  ClusterManager restored(Config(1, 1), &clock);
  REQUIRE(restored.Restore(state).ok());
  const uint64_t epoch = restored.epoch();
  REQUIRE(epoch == state.epoch() + 1);
  restored.TakeEvents();

  restored.SeenEpoch(epoch);  // known: nothing to do
  restored.SeenEpoch(epoch - 1);
  CHECK(restored.epoch() == epoch);
  CHECK(restored.TakeEvents().empty());

  restored.SeenEpoch(epoch + 2);  // two epochs the file never held
  CHECK(restored.epoch() == epoch + 3);
  std::vector<Event> events = restored.TakeEvents();
  REQUIRE(events.size() == 1);
  CHECK(events[0].kind == Event::Kind::kMetadataChanged);
  CHECK(restored.BuildMetadata().epoch() == epoch + 3);

  // A lead no lost write explains is not believed: at most kMaxEpochLead past the file's.
  restored.SeenEpoch(state.epoch() + ClusterManager::kMaxEpochLead + 1);
  CHECK(restored.epoch() == epoch + 3);
  CHECK(restored.TakeEvents().empty());
  restored.SeenEpoch(state.epoch() + ClusterManager::kMaxEpochLead);
  CHECK(restored.epoch() == state.epoch() + ClusterManager::kMaxEpochLead + 1);
}

}  // namespace
}  // namespace pscore::core
