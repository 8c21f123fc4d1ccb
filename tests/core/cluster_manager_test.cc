#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

// Our headers first: glog defines its own CHECK, and catch.hpp must come last so that CHECK
// below is Catch's (reports and continues) rather than glog's (aborts the binary).
#include "pscore/core/cluster_manager.h"

#include <catch2/catch.hpp>

namespace pscore::core {
namespace {

using Kind = Event::Kind;
constexpr uint64_t kInc = 100;

RegisterRequest Req(const std::string& id, pb::NodeRole role, uint64_t inc = kInc,
                    int rank = -1, int devices = 0) {
  RegisterRequest req;
  req.node_id = id;
  req.role = role;
  req.ip = "10.0.0.1";
  req.port = 7000;
  req.incarnation = inc;
  req.requested_rank = rank;
  for (int i = devices - 1; i >= 0; --i) {  // reversed on purpose: the manager sorts by local_id
    pb::Device d;
    d.set_local_id(i);
    d.set_device_ip("192.168.0." + std::to_string(i));
    req.devices.push_back(d);
  }
  return req;
}

std::vector<Kind> Kinds(const std::vector<Event>& events) {
  std::vector<Kind> kinds;
  for (const Event& e : events) kinds.push_back(e.kind);
  return kinds;
}

struct Fixture {
  explicit Fixture(int workers = 2, int servers = 1) {
    config.worker_num = workers;
    config.server_num = servers;
    config.heartbeat_timeout = std::chrono::seconds(30);
    config.scale_timeout = std::chrono::seconds(60);
    cm = std::make_unique<ClusterManager>(config, &clock);
  }
  // Registers s0.. and w0.. up to the configured totals and drains the events.
  void StartAll(int devices = 0) {
    for (int i = 0; i < config.server_num; ++i) {
      REQUIRE(cm->Register(Req("s" + std::to_string(i), pb::SERVER, kInc, -1, devices)).ok());
    }
    for (int i = 0; i < config.worker_num; ++i) {
      REQUIRE(cm->Register(Req("w" + std::to_string(i), pb::WORKER, kInc, -1, devices)).ok());
    }
    REQUIRE(cm->state() == pb::CLUSTER_READY);
    cm->TakeEvents();
  }
  // Members of these roles restart without being recorded in error (call before StartAll).
  void Recoverable(std::vector<pb::NodeRole> roles) {
    config.recoverable_roles = std::move(roles);
    cm = std::make_unique<ClusterManager>(config, &clock);
  }
  void BeatAll() {
    for (const NodeRecord* rec : cm->Nodes()) {
      if (!rec->timed_out) REQUIRE(cm->Heartbeat(rec->node_id).ok());
    }
  }
  FakeClock clock;
  ClusterConfig config;
  std::unique_ptr<ClusterManager> cm;
};

}  // namespace

TEST_CASE("register validates role, ranks and quota with named values", "[core][cluster]") {
  Fixture f(/*workers=*/3, /*servers=*/2);
  Result<RegisterOutcome> bad = f.cm->Register(Req("x", pb::SCHEDULER));
  CHECK(bad.status().code() == Code::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("unknown role scheduler for node x: must be server or worker"));

  Result<RegisterOutcome> w_a = f.cm->Register(Req("wa", pb::WORKER, kInc, /*rank=*/2));
  REQUIRE(w_a.ok());
  CHECK(w_a->rank == 2);
  CHECK(f.cm->Register(Req("wb", pb::WORKER))->rank == 0);  // lowest free, arrival order
  CHECK(f.cm->Register(Req("s0", pb::SERVER))->rank == 0);

  Result<RegisterOutcome> taken = f.cm->Register(Req("wc", pb::WORKER, kInc, /*rank=*/2));
  CHECK(taken.status().code() == Code::kAlreadyExists);
  CHECK_THAT(taken.status().message(), Catch::Contains("worker rank 2 already taken by node wa"));
  Result<RegisterOutcome> range = f.cm->Register(Req("wc", pb::WORKER, kInc, /*rank=*/5));
  CHECK(range.status().code() == Code::kFailedPrecondition);  // beyond the configured count
  CHECK_THAT(range.status().message(), Catch::Contains("rank 5 out of range [0, 3)"));
  CHECK(f.cm->Register(Req("wc", pb::WORKER, kInc, /*rank=*/-2)).status().code() == Code::kInvalidArgument);

  CHECK(f.cm->Register(Req("wc", pb::WORKER))->rank == 1);
  CHECK(f.cm->Register(Req("s1", pb::SERVER))->rank == 1);
  Result<RegisterOutcome> full = f.cm->Register(Req("s2", pb::SERVER));
  CHECK(full.status().code() == Code::kInvalidArgument);  // not in the cluster, whatever the quota
  CHECK_THAT(full.status().message(), Catch::Contains("node s2 is not in the cluster: server quota full (2/2)"));
  // Of these only this refusal is one a scale-out may lift later (a node waits for it,
  // join_timeout).
  CHECK(IsQuotaFull(full.status()));
  CHECK_FALSE(IsQuotaFull(bad.status()));
  CHECK_FALSE(IsQuotaFull(taken.status()));
  CHECK_FALSE(IsQuotaFull(range.status()));
  CHECK_FALSE(IsScaleInRunning(full.status()));
  CHECK_FALSE(IsScaleInRunning(range.status()));
  // Also with a requested rank the node id is what is refused.
  CHECK(f.cm->Register(Req("s3", pb::SERVER, kInc, /*rank=*/1)).status().code() == Code::kInvalidArgument);
  CHECK(f.cm->registered(pb::SERVER) == 2);
  CHECK(f.cm->registered(pb::WORKER) == 3);
  CHECK(f.cm->Find("s2") == nullptr);
}

TEST_CASE("re-register keeps the rank - retry, restart, device and role changes", "[core][cluster]") {
  Fixture f(/*workers=*/2, /*servers=*/1);
  f.config.recoverable_roles = {pb::WORKER};  // a restart is admitted at once
  f.cm = std::make_unique<ClusterManager>(f.config, &f.clock);
  REQUIRE(f.cm->Register(Req("w0", pb::WORKER, kInc, -1, 2)).ok());
  f.cm->TakeEvents();

  Result<RegisterOutcome> retry = f.cm->Register(Req("w0", pb::WORKER, kInc, -1, 2));
  REQUIRE(retry.ok());
  CHECK(retry->retry);
  CHECK_FALSE(retry->restarted);
  CHECK(retry->rank == 0);
  CHECK(f.cm->TakeEvents().empty());

  Result<RegisterOutcome> restarted = f.cm->Register(Req("w0", pb::WORKER, kInc + 1, -1, 2));
  REQUIRE(restarted.ok());
  CHECK(restarted->restarted);
  CHECK(restarted->rank == 0);
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kNodeRestarted});
  CHECK(events[0].node_id == "w0");
  CHECK(f.cm->Find("w0")->incarnation == kInc + 1);

  Result<RegisterOutcome> devs = f.cm->Register(Req("w0", pb::WORKER, kInc + 1, -1, 3));
  CHECK(devs.status().code() == Code::kInvalidArgument);
  CHECK_THAT(devs.status().message(), Catch::Contains("3 devices, was 2"));
  Result<RegisterOutcome> role = f.cm->Register(Req("w0", pb::SERVER, kInc + 1, -1, 2));
  CHECK(role.status().code() == Code::kInvalidArgument);
  CHECK_THAT(role.status().message(), Catch::Contains("registered as worker, now claims server"));
  CHECK(f.cm->Find("w0")->role == pb::WORKER);
}

TEST_CASE("a node in error is refused on retry and on restart until reset", "[core][cluster]") {
  Fixture f;
  f.StartAll();
  REQUIRE(f.cm->ReportError("w1", 42, "disk full").ok());
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kNodeError});
  CHECK(events[0].node_id == "w1");
  CHECK(events[0].error_code == 42);
  CHECK(events[0].message == "disk full");
  CHECK(events[0].propagate);
  CHECK(f.cm->Find("w1")->state == pb::NODE_IN_ERROR);
  CHECK(f.cm->ReportError("nope", 1, "x").code() == Code::kNotFound);

  Result<RegisterOutcome> refused = f.cm->Register(Req("w1", pb::WORKER));
  CHECK(refused.status().code() == Code::kFailedPrecondition);
  CHECK_THAT(refused.status().message(), Catch::Contains("code 42: disk full"));
  CHECK_THAT(refused.status().message(), Catch::Contains("reset it"));
  Result<RegisterOutcome> restart = f.cm->Register(Req("w1", pb::WORKER, kInc + 9));
  CHECK(restart.status().code() == Code::kFailedPrecondition);
  CHECK(f.cm->Find("w1")->in_error);
  REQUIRE(f.cm->ResetNode("w1").ok());
  CHECK_FALSE(f.cm->Find("w1")->in_error);
  CHECK(f.cm->Register(Req("w1", pb::WORKER))->retry);  // the same process, reset

  // Reset, then a new process: admitted as a restart.
  REQUIRE(f.cm->ReportError("w1", 7, "oom").ok());
  REQUIRE(f.cm->ResetNode("w1").ok());
  f.cm->TakeEvents();
  Result<RegisterOutcome> fresh = f.cm->Register(Req("w1", pb::WORKER, kInc + 9));
  REQUIRE(fresh.ok());
  CHECK(fresh->restarted);
  CHECK(Kinds(f.cm->TakeEvents()) == std::vector<Kind>{Kind::kNodeRestarted});
  CHECK_FALSE(f.cm->Find("w1")->in_error);
  CHECK(f.cm->Find("w1")->state == pb::NODE_READY);
}

TEST_CASE("a new incarnation of a member is recorded in error ABORTED naming it - reset lets it in",
          "[core][cluster][incarnation]") {
  Fixture f;
  f.StartAll();
  Result<RegisterOutcome> restarted = f.cm->Register(Req("s0", pb::SERVER, kInc + 1));
  CHECK(restarted.status().code() == Code::kAborted);
  CHECK_THAT(restarted.status().message(), Catch::Contains("server s0 restarted"));
  CHECK_THAT(restarted.status().message(), Catch::Contains("reset"));
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kNodeError});
  CHECK(events[0].node_id == "s0");
  CHECK(events[0].error_code == static_cast<int>(Code::kAborted));
  CHECK(events[0].propagate);
  CHECK_FALSE(events[0].reported);
  CHECK_THAT(events[0].message, Catch::Contains("state of its old process is lost"));
  const NodeRecord* s0 = f.cm->Find("s0");
  CHECK(s0->state == pb::NODE_IN_ERROR);
  CHECK(s0->incarnation == kInc);  // the old one stays registered until the reset

  // Refused again, whatever the incarnation, and nothing more is told.
  CHECK(f.cm->Register(Req("s0", pb::SERVER, kInc + 2)).status().code() == Code::kFailedPrecondition);
  CHECK(f.cm->Register(Req("s0", pb::SERVER, kInc)).status().code() == Code::kFailedPrecondition);
  CHECK(f.cm->TakeEvents().empty());

  REQUIRE(f.cm->ResetNode("s0").ok());
  // The old process's beats now say "register again".
  CHECK(f.cm->Heartbeat("s0", kInc).code() == Code::kNotFound);
  Result<RegisterOutcome> back = f.cm->Register(Req("s0", pb::SERVER, kInc + 2));
  REQUIRE(back.ok());
  CHECK(back->restarted);
  CHECK(back->rank == 0);
  CHECK(f.cm->Find("s0")->incarnation == kInc + 2);
  CHECK(f.cm->Heartbeat("s0", kInc + 2).ok());
}

TEST_CASE("the same incarnation re-registering is a retry - nothing is told", "[core][cluster][incarnation]") {
  Fixture f;
  f.StartAll();
  for (int i = 0; i < 3; ++i) {
    Result<RegisterOutcome> again = f.cm->Register(Req("w0", pb::WORKER));
    REQUIRE(again.ok());
    CHECK(again->retry);
    CHECK_FALSE(again->restarted);
  }
  CHECK(f.cm->TakeEvents().empty());
  CHECK_FALSE(f.cm->Find("w0")->in_error);
}

TEST_CASE("heartbeats carry the incarnation - stale or foreign refused ABORTED - in error refused",
          "[core][cluster][incarnation]") {
  Fixture f;
  f.StartAll();
  CHECK(f.cm->Heartbeat("w0", kInc).ok());
  Status foreign = f.cm->Heartbeat("w0", kInc + 5);
  CHECK(foreign.code() == Code::kAborted);
  CHECK_THAT(foreign.message(), Catch::Contains("incarnation " + std::to_string(kInc + 5)));
  CHECK_THAT(foreign.message(), Catch::Contains("w0"));
  CHECK(f.cm->Heartbeat("w0", uint64_t{0}).code() == Code::kAborted);

  REQUIRE(f.cm->ReportError("w1", 3, "device lost").ok());
  Status in_error = f.cm->Heartbeat("w1", kInc);
  CHECK(in_error.code() == Code::kAborted);
  CHECK_THAT(in_error.message(), Catch::Contains("w1 is in error"));
  CHECK_THAT(in_error.message(), Catch::Contains("device lost"));
  // The process is alive: a refused beat still counts, so it is not timed out as well.
  f.clock.Advance(std::chrono::seconds(20));
  CHECK(f.cm->Heartbeat("w1", kInc).code() == Code::kAborted);
  CHECK(f.cm->Heartbeat("w0", kInc).ok());
  CHECK(f.cm->Heartbeat("s0", kInc).ok());
  f.clock.Advance(std::chrono::seconds(20));
  f.cm->Tick();
  CHECK_FALSE(f.cm->Find("w1")->timed_out);
}

TEST_CASE("recoverable roles: errors not propagated - a restart is admitted - heartbeats in error accepted",
          "[core][cluster][incarnation]") {
  Fixture f;
  f.config.recoverable_roles = {pb::WORKER};
  f.cm = std::make_unique<ClusterManager>(f.config, &f.clock);
  f.StartAll();
  REQUIRE(f.cm->ReportError("w0", 5, "nan loss").ok());
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kNodeError});
  CHECK_FALSE(events[0].propagate);
  CHECK(f.cm->Heartbeat("w0", kInc).ok());
  // Its restart is admitted at once and clears the error.
  Result<RegisterOutcome> back = f.cm->Register(Req("w0", pb::WORKER, kInc + 1));
  REQUIRE(back.ok());
  CHECK(back->restarted);
  CHECK_FALSE(f.cm->Find("w0")->in_error);
  CHECK(Kinds(f.cm->TakeEvents()) == std::vector<Kind>{Kind::kNodeRestarted});
  // A server is not recoverable here: its restart is an error told to all.
  CHECK(f.cm->Register(Req("s0", pb::SERVER, kInc + 1)).status().code() == Code::kAborted);
  events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kNodeError});
  CHECK(events[0].propagate);
}

TEST_CASE("all registered: topology ids, metadata, then READY", "[core][cluster]") {
  Fixture f(/*workers=*/1, /*servers=*/2);
  // The worker arrives first but its devices are numbered after every server's.
  REQUIRE(f.cm->Register(Req("w0", pb::WORKER, kInc, -1, 1)).ok());
  REQUIRE(f.cm->Register(Req("s1", pb::SERVER, kInc, /*rank=*/1, 2)).ok());
  CHECK(f.cm->TakeEvents().empty());
  CHECK(f.cm->state() == pb::ClUSTER_STARTING);
  Result<RegisterOutcome> last = f.cm->Register(Req("s0", pb::SERVER, kInc, -1, 2));
  REQUIRE(last.ok());
  CHECK(last->epoch == 1);

  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kMetadataChanged, Kind::kStateChanged});
  CHECK(events[0].epoch == 1);
  CHECK(events[1].state == pb::CLUSTER_READY);
  CHECK(f.cm->epoch() == 1);

  pb::SendMetadataMessage meta = f.cm->BuildMetadata();
  CHECK(meta.epoch() == 1);
  CHECK(meta.cluster_state() == pb::CLUSTER_READY);
  CHECK(meta.worker_num() == 1);
  CHECK(meta.server_num() == 2);
  REQUIRE(meta.servers_meta_size() == 2);
  REQUIRE(meta.workers_meta_size() == 1);
  CHECK(meta.servers_meta(0).node_id() == "s0");
  CHECK(meta.servers_meta(1).node_id() == "s1");
  CHECK(meta.servers_meta(0).devices(0).local_id() == 0);
  CHECK(meta.servers_meta(0).devices(0).global_id() == 0);
  CHECK(meta.servers_meta(0).devices(1).global_id() == 1);
  CHECK(meta.servers_meta(1).devices(0).global_id() == 2);
  CHECK(meta.servers_meta(1).devices(1).global_id() == 3);
  CHECK(meta.workers_meta(0).devices(0).global_id() == 4);
  CHECK(meta.workers_meta(0).state() == pb::NODE_READY);
  CHECK(meta.workers_meta(0).is_alive());
}

TEST_CASE("heartbeat timeout marks the node and the cluster - re-register recovers",
          "[core][cluster]") {
  Fixture f;
  f.StartAll();
  CHECK(f.cm->Heartbeat("ghost").code() == Code::kNotFound);

  f.clock.Advance(std::chrono::seconds(20));
  REQUIRE(f.cm->Heartbeat("s0").ok());
  REQUIRE(f.cm->Heartbeat("w0").ok());
  f.clock.Advance(std::chrono::seconds(11));  // w1 silent 31 s since registering
  f.cm->Tick();
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kNodeTimedOut, Kind::kStateChanged});
  CHECK(events[0].node_id == "w1");
  CHECK(events[0].rank == 1);
  CHECK(events[1].state == pb::NODE_TIMEOUT);
  CHECK(f.cm->Find("w1")->state == pb::NODE_TIMED_OUT);
  CHECK_FALSE(f.cm->BuildMetadata().workers_meta(1).is_alive());

  f.cm->Tick();
  CHECK(f.cm->TakeEvents().empty());  // reported once
  CHECK(f.cm->Heartbeat("w1").code() == Code::kNotFound);

  Result<RegisterOutcome> back = f.cm->Register(Req("w1", pb::WORKER));
  REQUIRE(back.ok());
  CHECK(back->rank == 1);
  events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kNodeRecovered, Kind::kStateChanged});
  CHECK(events[1].state == pb::CLUSTER_READY);
  CHECK(f.cm->state() == pb::CLUSTER_READY);
  CHECK(f.cm->Find("w1")->state == pb::NODE_READY);
}

TEST_CASE("timeouts are found at the first tick past the deadline, also after every node timed out",
          "[core][cluster]") {
  Fixture f(/*workers=*/2, /*servers=*/1);
  f.StartAll();
  // Ticks before the earliest deadline find nothing; the first one past it finds w1.
  f.clock.Advance(std::chrono::seconds(10));
  REQUIRE(f.cm->Heartbeat("s0").ok());
  REQUIRE(f.cm->Heartbeat("w0").ok());
  f.cm->Tick();
  f.clock.Advance(std::chrono::seconds(20));  // w1: exactly 30 s, not past
  f.cm->Tick();
  CHECK(f.cm->TakeEvents().empty());
  f.clock.Advance(std::chrono::milliseconds(1));
  f.cm->Tick();
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE_FALSE(events.empty());
  CHECK(events[0].kind == Kind::kNodeTimedOut);
  CHECK(events[0].node_id == "w1");
  // Everyone else goes silent too; several time out in one tick, reported in role, rank order.
  f.clock.Advance(std::chrono::seconds(31));
  f.cm->Tick();
  events = f.cm->TakeEvents();
  std::vector<std::string> ids;
  for (const Event& e : events) {
    if (e.kind == Kind::kNodeTimedOut) ids.push_back(e.node_id);
  }
  CHECK(ids == std::vector<std::string>{"s0", "w0"});
  // No live node is left; one that re-registers must still be watched.
  REQUIRE(f.cm->Register(Req("w0", pb::WORKER)).ok());
  f.cm->TakeEvents();
  f.clock.Advance(std::chrono::seconds(29));
  f.cm->Tick();
  CHECK(f.cm->TakeEvents().empty());
  f.clock.Advance(std::chrono::seconds(2));
  f.cm->Tick();
  events = f.cm->TakeEvents();
  REQUIRE_FALSE(events.empty());
  CHECK(events[0].kind == Kind::kNodeTimedOut);
  CHECK(events[0].node_id == "w0");
}

TEST_CASE("a heartbeat hint skips the lookup only while it is valid", "[core][cluster]") {
  Fixture f(/*workers=*/3, /*servers=*/1);
  f.StartAll();
  ClusterManager::NodeHint hint;
  REQUIRE(f.cm->Heartbeat("w1", &hint).ok());
  CHECK(hint.rec == f.cm->Find("w1"));
  CHECK(hint.node_id == "w1");
  // A hint for another node (a link reused by a different id) is not trusted.
  f.clock.Advance(std::chrono::seconds(5));
  REQUIRE(f.cm->Heartbeat("w2", &hint).ok());
  CHECK(hint.rec == f.cm->Find("w2"));
  CHECK(f.cm->Find("w2")->last_heartbeat == f.clock.Now());
  CHECK(f.cm->Find("w1")->last_heartbeat != f.clock.Now());
  // Removing a record (a scale-in) invalidates every hint: the next call looks up again.
  ClusterManager::NodeHint w1_hint;
  REQUIRE(f.cm->Heartbeat("w1", &w1_hint).ok());
  REQUIRE(f.cm->ScaleInByIds({"w1"}).ok());
  for (const char* id : {"s0", "w0", "w1", "w2"}) REQUIRE(f.cm->ScaleInDone(id, f.cm->epoch()).ok());
  REQUIRE(f.cm->Find("w1") == nullptr);
  CHECK(f.cm->Heartbeat("w1", &w1_hint).code() == Code::kNotFound);
  CHECK(w1_hint.rec == nullptr);
  REQUIRE(f.cm->Heartbeat("w2", &hint).ok());
  CHECK(hint.rec == f.cm->Find("w2"));
}

TEST_CASE("finish barrier over live nodes - late second call is refused", "[core][cluster]") {
  Fixture f(/*workers=*/2, /*servers=*/1);
  f.StartAll();
  REQUIRE(f.cm->Finish("w0").ok());
  CHECK(f.cm->Finish("nope").code() == Code::kNotFound);
  CHECK(f.cm->FinishMissing() == std::vector<std::string>{"s0", "w1"});
  CHECK(f.cm->TakeEvents().empty());

  // w1 goes silent: the barrier no longer waits for it.
  f.clock.Advance(std::chrono::seconds(31));
  REQUIRE(f.cm->Heartbeat("s0").ok());
  REQUIRE(f.cm->Heartbeat("w0").ok());
  f.cm->Tick();
  f.cm->TakeEvents();
  CHECK(f.cm->FinishMissing() == std::vector<std::string>{"s0"});

  REQUIRE(f.cm->Finish("s0").ok());
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kFinishPassed, Kind::kStateChanged});
  CHECK(events[1].state == pb::CLUSTER_EXIT);
  CHECK(f.cm->state() == pb::CLUSTER_EXIT);
  CHECK(f.cm->Find("s0")->state == pb::NODE_FINISH);
  Status again = f.cm->Finish("w0");
  CHECK(again.code() == Code::kFailedPrecondition);
  CHECK(again.message() == "node w0 already left");
}

TEST_CASE("a timed-out finished node restarted after the finish barrier passed is refused - cluster is exiting",
          "[core][cluster]") {
  Fixture f(/*workers=*/2, /*servers=*/1);
  f.StartAll();
  REQUIRE(f.cm->Finish("s0").ok());
  REQUIRE(f.cm->Finish("w0").ok());
  // s0 dies after it finished: timed out, and the barrier does not wait for it.
  f.clock.Advance(std::chrono::seconds(31));
  REQUIRE(f.cm->Heartbeat("w0").ok());
  REQUIRE(f.cm->Heartbeat("w1").ok());
  f.cm->Tick();
  f.cm->TakeEvents();
  REQUIRE(f.cm->Finish("w1").ok());
  REQUIRE(f.cm->state() == pb::CLUSTER_EXIT);

  // Its restart (new incarnation, same node id) and a stranger are both refused.
  Result<RegisterOutcome> restart = f.cm->Register(Req("s0", pb::SERVER, kInc + 1));
  CHECK(restart.status().code() == Code::kFailedPrecondition);
  CHECK(restart.status().message() == "cluster is exiting; node s0 refused");
  CHECK(f.cm->Register(Req("w9", pb::WORKER)).status().code() == Code::kFailedPrecondition);
  CHECK(f.cm->state() == pb::CLUSTER_EXIT);
}

TEST_CASE("scale-out: new ranks follow old ones, done with newest epoch, READY", "[core][cluster]") {
  Fixture f(/*workers=*/1, /*servers=*/1);
  Status early = f.cm->ScaleOut(2, 2);
  CHECK(early.code() == Code::kFailedPrecondition);
  CHECK_THAT(early.message(), Catch::Contains("CLUSTER_STARTING"));
  f.StartAll(/*devices=*/1);
  CHECK(f.cm->ScaleOut(0, 2).code() == Code::kInvalidArgument);
  CHECK(f.cm->ScaleOut(1, 1).code() == Code::kInvalidArgument);
  Status too_many = f.cm->ScaleOut(1, core::kMaxRoleTotal + 1);
  CHECK(too_many.code() == Code::kInvalidArgument);
  CHECK_THAT(too_many.message(), Catch::Contains("nodes per role"));
  CHECK(f.cm->state() == pb::CLUSTER_READY);

  REQUIRE(f.cm->ScaleOut(2, 2).ok());
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kScaleOut, Kind::kStateChanged});
  CHECK(events[0].worker_num == 2);
  CHECK(events[0].server_num == 2);
  CHECK(events[0].epoch == 2);
  CHECK(events[1].state == pb::CLUSTER_SCALE_OUT);
  CHECK(f.cm->ScaleOut(3, 3).message() == "scale operation already running");
  Status waiting = f.cm->ScaleOutDone("s0", 2);
  CHECK(waiting.code() == Code::kFailedPrecondition);
  CHECK_THAT(waiting.message(), Catch::Contains("0 of 1 new servers registered"));

  CHECK(f.cm->Register(Req("s1", pb::SERVER, kInc, -1, 1))->rank == 1);
  CHECK(f.cm->TakeEvents().empty());
  CHECK(f.cm->Register(Req("w1", pb::WORKER, kInc, -1, 1))->rank == 1);
  events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kMetadataChanged});
  CHECK(events[0].epoch == 3);
  CHECK(f.cm->Find("w0")->rank == 0);
  CHECK(f.cm->Find("w0")->devices[0].global_id() == 2);  // after both servers' devices

  Status stale = f.cm->ScaleOutDone("s0", 2);
  CHECK(stale.code() == Code::kAborted);
  CHECK_THAT(stale.message(), Catch::Contains("stale epoch 2 < 3"));
  for (const char* id : {"s0", "s1", "w0"}) REQUIRE(f.cm->ScaleOutDone(id, 3).ok());
  CHECK(f.cm->TakeEvents().empty());
  REQUIRE(f.cm->ScaleOutDone("w1", 3).ok());
  events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kScaleDone, Kind::kStateChanged});
  CHECK(events[1].state == pb::CLUSTER_READY);
  CHECK(f.cm->worker_num() == 2);
  CHECK(f.cm->server_num() == 2);
  CHECK(f.cm->Find("w1")->state == pb::NODE_READY);
}

TEST_CASE("scale-out past its deadline rolls back to the old membership", "[core][cluster]") {
  Fixture f(/*workers=*/1, /*servers=*/1);
  f.StartAll();
  REQUIRE(f.cm->ScaleOut(1, 3).ok());
  REQUIRE(f.cm->Register(Req("s1", pb::SERVER)).ok());
  f.cm->TakeEvents();
  for (int i = 0; i < 3; ++i) {
    f.clock.Advance(std::chrono::seconds(20));
    f.BeatAll();
    f.cm->Tick();
  }
  CHECK(f.cm->state() == pb::CLUSTER_SCALE_OUT);  // exactly 60 s: not yet late
  f.clock.Advance(std::chrono::seconds(1));
  f.cm->Tick();
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) ==
          std::vector<Kind>{Kind::kRollback, Kind::kMetadataChanged, Kind::kStateChanged});
  CHECK(events[0].message ==
        "scale-out timed out after 60000 ms: 1 of 2 new servers registered");
  CHECK(events[0].epoch == 3);
  CHECK(events[2].state == pb::CLUSTER_READY);
  CHECK(f.cm->Find("s1") == nullptr);
  CHECK(f.cm->server_num() == 1);
  CHECK(f.cm->registered(pb::SERVER) == 1);
  CHECK(f.cm->BuildMetadata().servers_meta_size() == 1);
}

TEST_CASE("a node timing out during scale-in rolls it back", "[core][cluster]") {
  Fixture f(/*workers=*/3, /*servers=*/1);
  f.StartAll();
  REQUIRE(f.cm->ScaleInByIds({"w2"}).ok());
  f.cm->TakeEvents();
  CHECK(f.cm->Find("w2")->state == pb::NODE_LEAVING);
  f.clock.Advance(std::chrono::seconds(31));
  REQUIRE(f.cm->Heartbeat("s0").ok());
  REQUIRE(f.cm->Heartbeat("w0").ok());
  REQUIRE(f.cm->Heartbeat("w2").ok());
  f.cm->Tick();  // w1 is silent
  std::vector<Event> events = f.cm->TakeEvents();
  // One state change, to NODE_TIMEOUT (w1 is still gone): members are never told READY
  // for a moment in between.
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kNodeTimedOut, Kind::kRollback,
                                             Kind::kMetadataChanged, Kind::kStateChanged});
  CHECK(events[1].message == "worker w1 (rank 1) timed out during scale-in");
  CHECK(events[1].state == pb::NODE_TIMEOUT);
  CHECK(events[3].state == pb::NODE_TIMEOUT);
  CHECK(f.cm->state() == pb::NODE_TIMEOUT);
  CHECK(f.cm->worker_num() == 3);
  CHECK_FALSE(f.cm->Find("w2")->leaving);
  CHECK(f.cm->Find("w2")->state == pb::NODE_READY);
}

TEST_CASE("scale-in by ids: leaving nodes removed, ranks compacted, READY", "[core][cluster]") {
  Fixture f(/*workers=*/3, /*servers=*/2);
  f.StartAll(/*devices=*/1);
  Status unknown = f.cm->ScaleInByIds({"w9"});
  CHECK(unknown.code() == Code::kNotFound);
  CHECK_THAT(unknown.message(), Catch::Contains("w9"));
  Status all = f.cm->ScaleInByIds({"s0", "s1"});
  CHECK(all.code() == Code::kInvalidArgument);
  CHECK_THAT(all.message(), Catch::Contains("all 2 servers"));

  REQUIRE(f.cm->ScaleInByIds({"w1"}).ok());
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kScaleIn, Kind::kStateChanged});
  CHECK(events[0].leaving_node_ids == std::vector<std::string>{"w1"});
  CHECK(events[0].worker_num == 2);
  CHECK(events[0].server_num == 2);
  CHECK(events[0].epoch == 2);
  CHECK(events[1].state == pb::CLUSTER_SCALE_IN);
  // A new node while the scale-in runs: refused, a refusal it waits out (join_timeout).
  Status during = f.cm->Register(Req("w7", pb::WORKER)).status();
  CHECK(during.code() == Code::kFailedPrecondition);
  CHECK(during.message() == "scale-in running; new node w7 refused");
  CHECK(IsScaleInRunning(during));
  CHECK_FALSE(IsQuotaFull(during));
  CHECK_FALSE(IsStaleSession(during));

  CHECK(f.cm->ScaleInDone("w1", 1).code() == Code::kAborted);
  for (const char* id : {"s0", "s1", "w0", "w1"}) REQUIRE(f.cm->ScaleInDone(id, 2).ok());
  CHECK(f.cm->TakeEvents().empty());
  REQUIRE(f.cm->ScaleInDone("w2", 2).ok());
  events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kNodeLeft, Kind::kMetadataChanged,
                                             Kind::kScaleDone, Kind::kStateChanged});
  CHECK(events[0].node_id == "w1");
  CHECK(events[1].epoch == 3);
  CHECK(events[3].state == pb::CLUSTER_READY);
  CHECK(f.cm->Find("w1") == nullptr);
  CHECK(f.cm->Find("w2")->rank == 1);
  CHECK(f.cm->Find("w2")->devices[0].global_id() == 3);
  CHECK(f.cm->Heartbeat("w1").code() == Code::kNotFound);
  CHECK(f.cm->registered(pb::WORKER) == 2);
}

TEST_CASE("a member restarted during scale-in rolls it back at once, its new process in the old membership",
          "[core][cluster]") {
  Fixture f(/*workers=*/2, /*servers=*/2);
  f.Recoverable({pb::WORKER, pb::SERVER});
  f.StartAll();
  REQUIRE(f.cm->ScaleInByIds({"s1"}).ok());
  REQUIRE(f.cm->ScaleInDone("w1", 2).ok());
  f.cm->TakeEvents();
  RegisterRequest again = Req("s0", pb::SERVER, kInc + 1);
  again.port = 7100;  // a new process listens elsewhere
  Result<RegisterOutcome> out = f.cm->Register(again);
  REQUIRE(out.ok());
  CHECK(out->restarted);
  CHECK(out->rank == 0);
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kNodeRestarted, Kind::kRollback, Kind::kMetadataChanged,
                                             Kind::kStateChanged});
  CHECK(events[1].message == "server s0 (rank 0) restarted during scale-in");
  CHECK(events[3].state == pb::CLUSTER_READY);
  CHECK(out->epoch == f.cm->epoch());
  CHECK(f.cm->server_num() == 2);
  CHECK_FALSE(f.cm->Find("s1")->leaving);
  pb::SendMetadataMessage md = f.cm->BuildMetadata();
  REQUIRE(md.servers_meta_size() == 2);
  CHECK(md.servers_meta(0).port() == 7100);
  // Nothing of the undone operation is left: its DONE answers are refused.
  CHECK(f.cm->ScaleInDone("w0", 2).code() == Code::kFailedPrecondition);
}

TEST_CASE("a member that missed a scale-in's new ranks registers again with its old one and gets the new",
          "[core][cluster]") {
  Fixture f(/*workers=*/2, /*servers=*/3);
  f.StartAll();
  REQUIRE(f.cm->ScaleInByIds({"s0"}).ok());
  for (const char* id : {"s0", "s1", "s2", "w0", "w1"}) REQUIRE(f.cm->ScaleInDone(id, 2).ok());
  REQUIRE(f.cm->Find("s2")->rank == 1);
  f.cm->TakeEvents();
  // The same process (its link lost before the new metadata came) asks for rank 2.
  Result<RegisterOutcome> same = f.cm->Register(Req("s2", pb::SERVER, kInc, /*rank=*/2));
  REQUIRE(same.ok());
  CHECK(same->rank == 1);
  CHECK(same->retry);
  // A new process asking for a rank the member does not hold is still refused.
  Result<RegisterOutcome> other = f.cm->Register(Req("s2", pb::SERVER, kInc + 1, /*rank=*/2));
  CHECK(other.status().code() == Code::kInvalidArgument);
  CHECK_THAT(other.status().message(), Catch::Contains("holds server rank 1"));
}

TEST_CASE("a node removed by a scale-in is known as left to its own process only", "[core][cluster]") {
  Fixture f(/*workers=*/2, /*servers=*/2);
  f.StartAll();
  CHECK_FALSE(f.cm->LeftInScaleIn("s1", kInc));  // a member
  REQUIRE(f.cm->ScaleInByIds({"s1"}).ok());
  for (const char* id : {"s0", "s1", "w0", "w1"}) REQUIRE(f.cm->ScaleInDone(id, 2).ok());
  REQUIRE(f.cm->Find("s1") == nullptr);
  CHECK(f.cm->LeftInScaleIn("s1", kInc));
  CHECK_FALSE(f.cm->LeftInScaleIn("s1", kInc + 1));  // another process under its id
  CHECK_FALSE(f.cm->LeftInScaleIn("s0", kInc));
  // Readmitted by a later scale-out, it is a member again.
  REQUIRE(f.cm->ScaleOut(2, 2).ok());
  REQUIRE(f.cm->Register(Req("s1", pb::SERVER, kInc + 1)).ok());
  CHECK_FALSE(f.cm->LeftInScaleIn("s1", kInc));
}

TEST_CASE("scale-in by counts removes the highest ranks", "[core][cluster]") {
  Fixture f(/*workers=*/4, /*servers=*/2);
  f.StartAll();
  CHECK(f.cm->ScaleInByCounts(0, 2).code() == Code::kInvalidArgument);
  CHECK(f.cm->ScaleInByCounts(5, 2).code() == Code::kInvalidArgument);
  REQUIRE(f.cm->ScaleInByCounts(2, 1).ok());
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE_FALSE(events.empty());
  CHECK(events[0].leaving_node_ids == std::vector<std::string>{"s1", "w2", "w3"});
  CHECK(f.cm->ScaleInByCounts(1, 1).message() == "scale operation already running");
  for (const NodeRecord* rec : f.cm->Nodes()) REQUIRE(f.cm->ScaleInDone(rec->node_id, 2).ok());
  CHECK(f.cm->state() == pb::CLUSTER_READY);
  CHECK(f.cm->worker_num() == 2);
  CHECK(f.cm->server_num() == 1);
  CHECK(f.cm->Nodes().size() == 3);
}

TEST_CASE("admin states: new instance, sticky disable, enable, exit", "[core][cluster]") {
  Fixture f;
  CHECK(f.cm->SetState(pb::CLUSTER_NEW_INSTANCE).code() == Code::kFailedPrecondition);
  f.StartAll();
  REQUIRE(f.cm->SetState(pb::CLUSTER_NEW_INSTANCE).ok());
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(events.size() == 2);
  CHECK(events[0].state == pb::CLUSTER_NEW_INSTANCE);
  CHECK(events[1].state == pb::CLUSTER_READY);

  CHECK(f.cm->SetState(pb::CLUSTER_ENABLE_FLS).code() == Code::kFailedPrecondition);
  REQUIRE(f.cm->SetState(pb::CLUSTER_DISABLE_FLS).ok());
  CHECK(f.cm->state() == pb::CLUSTER_DISABLE_FLS);
  CHECK(f.cm->ScaleOut(3, 1).code() == Code::kFailedPrecondition);
  CHECK(f.cm->SetState(pb::CLUSTER_NEW_INSTANCE).code() == Code::kFailedPrecondition);
  f.clock.Advance(std::chrono::seconds(40));
  f.BeatAll();
  f.cm->Tick();
  CHECK(f.cm->state() == pb::CLUSTER_DISABLE_FLS);  // sticky
  f.cm->TakeEvents();
  REQUIRE(f.cm->SetState(pb::CLUSTER_ENABLE_FLS).ok());
  events = f.cm->TakeEvents();
  REQUIRE(events.size() == 2);
  CHECK(events[0].state == pb::CLUSTER_ENABLE_FLS);
  CHECK(events[1].state == pb::CLUSTER_READY);

  CHECK(f.cm->SetState(pb::CLUSTER_SCALE_OUT).code() == Code::kInvalidArgument);
  REQUIRE(f.cm->SetState(pb::CLUSTER_EXIT).ok());
  CHECK(f.cm->state() == pb::CLUSTER_EXIT);
  CHECK(f.cm->SetState(pb::CLUSTER_EXIT).code() == Code::kFailedPrecondition);
  CHECK(f.cm->Register(Req("w9", pb::WORKER)).status().code() == Code::kFailedPrecondition);
}

TEST_CASE("epoch only grows across membership changes", "[core][cluster]") {
  Fixture f(/*workers=*/2, /*servers=*/1);
  f.Recoverable({pb::WORKER});
  f.StartAll();
  std::vector<uint64_t> seen{f.cm->epoch()};
  REQUIRE(f.cm->ScaleOut(3, 1).ok());
  seen.push_back(f.cm->epoch());
  REQUIRE(f.cm->Register(Req("w2", pb::WORKER)).ok());
  seen.push_back(f.cm->epoch());
  for (const NodeRecord* rec : f.cm->Nodes()) REQUIRE(f.cm->ScaleOutDone(rec->node_id, seen.back()).ok());
  REQUIRE(f.cm->ScaleInByIds({"w0"}).ok());
  seen.push_back(f.cm->epoch());
  for (const NodeRecord* rec : f.cm->Nodes()) REQUIRE(f.cm->ScaleInDone(rec->node_id, seen.back()).ok());
  seen.push_back(f.cm->epoch());
  RegisterRequest moved = Req("w1", pb::WORKER, kInc + 1);
  moved.port = 7100;  // a restart on a new port republishes the address
  REQUIRE(f.cm->Register(moved).ok());
  seen.push_back(f.cm->epoch());
  CHECK(seen == std::vector<uint64_t>{1, 2, 3, 4, 5, 6});
  CHECK(f.cm->Find("w1")->rank == 0);
  CHECK(f.cm->Find("w2")->rank == 1);
}

TEST_CASE("a restart on a new address during scale-out restarts the done round",
          "[core][cluster]") {
  Fixture f(/*workers=*/1, /*servers=*/1);
  f.Recoverable({pb::WORKER});
  f.StartAll();
  REQUIRE(f.cm->ScaleOut(2, 1).ok());
  REQUIRE(f.cm->Register(Req("w1", pb::WORKER)).ok());
  REQUIRE(f.cm->epoch() == 3);
  REQUIRE(f.cm->ScaleOutDone("s0", 3).ok());
  f.cm->TakeEvents();
  RegisterRequest moved = Req("w0", pb::WORKER, kInc + 1);
  moved.ip = "10.0.0.2";
  REQUIRE(f.cm->Register(moved).ok());
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kNodeRestarted, Kind::kMetadataChanged});
  CHECK(events[1].epoch == 4);
  CHECK(f.cm->BuildMetadata().workers_meta(0).ip() == "10.0.0.2");
  CHECK(f.cm->ScaleOutDone("w0", 3).code() == Code::kAborted);
  for (const char* id : {"w0", "w1"}) REQUIRE(f.cm->ScaleOutDone(id, 4).ok());
  CHECK(f.cm->state() == pb::CLUSTER_SCALE_OUT);  // s0 must acknowledge epoch 4 as well
  REQUIRE(f.cm->ScaleOutDone("s0", 4).ok());
  CHECK(f.cm->state() == pb::CLUSTER_READY);
}

TEST_CASE("a node silent while starting leaves the cluster in NODE_TIMEOUT once ready",
          "[core][cluster]") {
  Fixture f(/*workers=*/1, /*servers=*/1);
  REQUIRE(f.cm->Register(Req("w0", pb::WORKER)).ok());
  f.clock.Advance(std::chrono::seconds(31));
  f.cm->Tick();
  std::vector<Event> events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) == std::vector<Kind>{Kind::kNodeTimedOut});  // no cluster state yet
  CHECK(f.cm->state() == pb::ClUSTER_STARTING);
  REQUIRE(f.cm->Register(Req("s0", pb::SERVER)).ok());
  events = f.cm->TakeEvents();
  REQUIRE(Kinds(events) ==
          std::vector<Kind>{Kind::kMetadataChanged, Kind::kStateChanged, Kind::kStateChanged});
  CHECK(events[1].state == pb::CLUSTER_READY);
  CHECK(events[2].state == pb::NODE_TIMEOUT);
  CHECK(f.cm->FinishMissing() == std::vector<std::string>{"s0"});
}

TEST_CASE("64 workers and 16 servers in random order get dense ranks and topology",
          "[core][cluster]") {
  Fixture f(/*workers=*/64, /*servers=*/16);
  std::vector<RegisterRequest> reqs;
  for (int i = 0; i < 16; ++i) reqs.push_back(Req("s" + std::to_string(i), pb::SERVER, 1, -1, 2));
  for (int i = 0; i < 64; ++i) reqs.push_back(Req("w" + std::to_string(i), pb::WORKER, 1, -1, 2));
  std::mt19937 rng(12345);
  std::shuffle(reqs.begin(), reqs.end(), rng);
  for (const RegisterRequest& req : reqs) REQUIRE(f.cm->Register(req).ok());
  REQUIRE(f.cm->state() == pb::CLUSTER_READY);

  std::vector<const NodeRecord*> nodes = f.cm->Nodes();
  REQUIRE(nodes.size() == 80);
  int next_global = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NodeRecord* rec = nodes[i];
    CHECK(rec->rank == (rec->role == pb::SERVER ? static_cast<int>(i) : static_cast<int>(i) - 16));
    for (const pb::Device& d : rec->devices) CHECK(d.global_id() == next_global++);
  }
  CHECK(next_global == 160);
  pb::SendMetadataMessage meta = f.cm->BuildMetadata();
  REQUIRE(meta.workers_meta_size() == 64);
  CHECK(meta.workers_meta(10).devices(0).global_id() > meta.workers_meta(9).devices(1).global_id());
  CHECK(meta.workers_meta(0).devices(0).global_id() == 32);
}

}  // namespace pscore::core

namespace pscore::core {

TEST_CASE("time the scheduler did not run does not time nodes out", "[core][cluster]") {
  FakeClock clock;
  ClusterConfig config;
  config.worker_num = 1;
  config.server_num = 1;
  config.heartbeat_timeout = std::chrono::seconds(1);
  ClusterManager cm(config, &clock);
  RegisterRequest w;
  w.node_id = "w0";
  w.role = pb::WORKER;
  w.incarnation = 1;
  RegisterRequest s = w;
  s.node_id = "s0";
  s.role = pb::SERVER;
  REQUIRE(cm.Register(w).ok());
  REQUIRE(cm.Register(s).ok());
  REQUIRE(cm.state() == pb::CLUSTER_READY);
  cm.TakeEvents();
  clock.Advance(std::chrono::seconds(5));  // The scheduler was stopped for 5 s.
  cm.Pause(std::chrono::seconds(5));
  cm.Tick();
  CHECK(cm.state() == pb::CLUSTER_READY);
  CHECK(cm.TakeEvents().empty());
  clock.Advance(std::chrono::milliseconds(1500));  // Now s0 is really silent past the timeout.
  REQUIRE(cm.Heartbeat("w0").ok());  // (every member silent at once is an isolation: below)
  cm.Tick();
  CHECK(cm.state() == pb::NODE_TIMEOUT);
  CHECK(cm.Find("s0")->timed_out);
}

TEST_CASE("every member silent at once is taken for the scheduler's own network - one heard again ends it, the "
          "others get a fresh heartbeat timeout",
          "[core][cluster][isolation]") {
  Fixture f(/*workers=*/2, /*servers=*/2);
  f.config.heartbeat_timeout = std::chrono::seconds(2);
  f.config.isolation_timeout = std::chrono::seconds(10);
  f.cm = std::make_unique<ClusterManager>(f.config, &f.clock);
  f.StartAll();
  f.clock.Advance(std::chrono::seconds(3));  // nobody heard past the heartbeat timeout
  f.cm->Tick();
  CHECK(f.cm->isolated());
  CHECK(f.cm->state() == pb::CLUSTER_READY);
  CHECK(f.cm->TakeEvents().empty());
  f.clock.Advance(std::chrono::seconds(6));  // 9 s since the last heartbeat: still held
  f.cm->Tick();
  CHECK(f.cm->isolated());
  CHECK(f.cm->flagged() == 0);
  REQUIRE(f.cm->Heartbeat("w1").ok());  // the link is back: one member is heard
  f.cm->Tick();
  CHECK_FALSE(f.cm->isolated());
  CHECK(f.cm->state() == pb::CLUSTER_READY);
  CHECK(f.cm->TakeEvents().empty());
  // The others have a fresh heartbeat timeout from now; those heard in it stay members.
  f.clock.Advance(std::chrono::milliseconds(1500));
  for (const char* id : {"s0", "w0", "w1"}) REQUIRE(f.cm->Heartbeat(id).ok());
  f.cm->Tick();
  CHECK(f.cm->flagged() == 0);
  f.clock.Advance(std::chrono::milliseconds(1500));  // s1 silent 3 s since the isolation ended
  for (const char* id : {"s0", "w0", "w1"}) REQUIRE(f.cm->Heartbeat(id).ok());
  f.cm->Tick();
  CHECK(f.cm->state() == pb::NODE_TIMEOUT);
  REQUIRE(f.cm->Find("s1")->timed_out);
  CHECK(f.cm->flagged() == 1);
}

TEST_CASE("a member silent a little longer than the others is held with them - none heard in half the heartbeat "
          "timeout is an isolation",
          "[core][cluster][isolation]") {
  Fixture f(/*workers=*/2, /*servers=*/1);
  f.config.heartbeat_timeout = std::chrono::seconds(2);
  f.config.isolation_timeout = std::chrono::seconds(10);
  f.cm = std::make_unique<ClusterManager>(f.config, &f.clock);
  f.StartAll();
  f.clock.Advance(std::chrono::milliseconds(300));  // w1 is stopped a while before the cut
  for (const char* id : {"s0", "w0"}) REQUIRE(f.cm->Heartbeat(id).ok());
  f.clock.Advance(std::chrono::milliseconds(900));  // w1 silent 1.2 s, the others 0.9 s
  f.cm->Tick();
  CHECK_FALSE(f.cm->isolated());
  f.clock.Advance(std::chrono::milliseconds(900));  // w1 2.1 s (past the timeout), the others 1.8 s
  f.cm->Tick();
  CHECK(f.cm->isolated());
  CHECK(f.cm->flagged() == 0);
  REQUIRE(f.cm->Heartbeat("s0").ok());
  f.cm->Tick();
  CHECK_FALSE(f.cm->isolated());
  CHECK(f.cm->flagged() == 0);
  // But one member silent past the timeout while another was heard within its last half
  // is that member's failure.
  f.clock.Advance(std::chrono::milliseconds(1500));
  REQUIRE(f.cm->Heartbeat("w0").ok());
  REQUIRE(f.cm->Heartbeat("w1").ok());
  f.clock.Advance(std::chrono::milliseconds(900));  // s0 silent 2.4 s, w0 and w1 0.9 s
  f.cm->Tick();
  CHECK_FALSE(f.cm->isolated());
  CHECK(f.cm->Find("s0")->timed_out);
}

TEST_CASE("every member silent past the isolation timeout times out - the job fails as it would have at once",
          "[core][cluster][isolation]") {
  Fixture f(/*workers=*/1, /*servers=*/1);
  f.config.heartbeat_timeout = std::chrono::seconds(2);
  f.config.isolation_timeout = std::chrono::seconds(10);
  f.cm = std::make_unique<ClusterManager>(f.config, &f.clock);
  f.StartAll();
  for (int i = 0; i < 10; ++i) {  // 10 s since the last heartbeat: held
    f.clock.Advance(std::chrono::seconds(1));
    f.cm->Tick();
  }
  CHECK(f.cm->isolated());
  CHECK(f.cm->flagged() == 0);
  f.clock.Advance(std::chrono::milliseconds(100));
  f.cm->Tick();
  CHECK_FALSE(f.cm->isolated());
  CHECK(f.cm->state() == pb::NODE_TIMEOUT);
  CHECK(f.cm->flagged() == 2);
  CHECK(f.cm->Find("w0")->lost_cause == "no heartbeat for 10100 ms");
}

TEST_CASE("a lone member silent, some of the members silent, or isolation_timeout 0 time out at once",
          "[core][cluster][isolation]") {
  SECTION("one member") {
    Fixture f(/*workers=*/1, /*servers=*/0);
    f.config.heartbeat_timeout = std::chrono::seconds(2);
    f.cm = std::make_unique<ClusterManager>(f.config, &f.clock);
    f.StartAll();
    f.clock.Advance(std::chrono::seconds(3));
    f.cm->Tick();
    CHECK_FALSE(f.cm->isolated());
    CHECK(f.cm->Find("w0")->timed_out);
  }
  SECTION("some members") {
    Fixture f(/*workers=*/2, /*servers=*/1);
    f.config.heartbeat_timeout = std::chrono::seconds(2);
    f.cm = std::make_unique<ClusterManager>(f.config, &f.clock);
    f.StartAll();
    f.clock.Advance(std::chrono::seconds(3));
    REQUIRE(f.cm->Heartbeat("w1").ok());
    f.cm->Tick();
    CHECK_FALSE(f.cm->isolated());
    CHECK(f.cm->flagged() == 2);
  }
  SECTION("isolation_timeout 0") {
    Fixture f(/*workers=*/2, /*servers=*/1);
    f.config.heartbeat_timeout = std::chrono::seconds(2);
    f.config.isolation_timeout = Duration::zero();
    f.cm = std::make_unique<ClusterManager>(f.config, &f.clock);
    f.StartAll();
    f.clock.Advance(std::chrono::seconds(3));
    f.cm->Tick();
    CHECK_FALSE(f.cm->isolated());
    CHECK(f.cm->flagged() == 3);
  }
}

TEST_CASE("an isolation during a scale counts against neither the members nor the scale's deadline",
          "[core][cluster][isolation][scale]") {
  Fixture f(/*workers=*/1, /*servers=*/2);
  f.config.heartbeat_timeout = std::chrono::seconds(2);
  f.config.scale_timeout = std::chrono::seconds(5);
  f.config.isolation_timeout = std::chrono::seconds(10);
  f.cm = std::make_unique<ClusterManager>(f.config, &f.clock);
  f.StartAll();
  REQUIRE(f.cm->ScaleInByIds({"s1"}).ok());
  f.cm->TakeEvents();
  f.clock.Advance(std::chrono::seconds(8));  // past both the heartbeat and the scale timeout
  f.cm->Tick();
  CHECK(f.cm->isolated());
  CHECK(f.cm->state() == pb::CLUSTER_SCALE_IN);
  for (const char* id : {"s0", "s1", "w0"}) REQUIRE(f.cm->Heartbeat(id).ok());
  f.cm->Tick();
  CHECK_FALSE(f.cm->isolated());
  CHECK(f.cm->state() == pb::CLUSTER_SCALE_IN);  // its deadline moved by the 8 s
  for (const char* id : {"s0", "s1", "w0"}) REQUIRE(f.cm->ScaleInDone(id, f.cm->epoch()).ok());
  CHECK(f.cm->state() == pb::CLUSTER_READY);
  CHECK(f.cm->server_num() == 1);
}

}  // namespace pscore::core
