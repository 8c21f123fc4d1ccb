// How a job ends (ClusterManager::outcome) and a member's scheduler watch (SchedulerWatch):
// both pure state machines driven by a fake clock, no sockets.
#include <algorithm>
#include <string>
#include <vector>

#include "pscore/core/cluster_manager.h"
#include "pscore/core/scheduler_watch.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::core {
namespace {

using Kind = Event::Kind;
using std::chrono::milliseconds;
using std::chrono::seconds;

RegisterRequest Req(const std::string& id, pb::NodeRole role, uint64_t inc = 100) {
  RegisterRequest req;
  req.node_id = id;
  req.role = role;
  req.ip = "10.0.0.1";
  req.port = 7000;
  req.incarnation = inc;
  return req;
}

// s0 + w0 + w1, READY, heartbeat timeout 30 s.
struct Job {
  Job() {
    ClusterConfig c;
    c.worker_num = 2;
    c.server_num = 1;
    c.heartbeat_timeout = seconds(30);
    c.recoverable_roles = {pb::WORKER};  // a lost worker may come back as a new process
    cm = std::make_unique<ClusterManager>(c, &clock);
    for (auto [id, role] : {std::pair{"s0", pb::SERVER}, {"w0", pb::WORKER}, {"w1", pb::WORKER}}) {
      REQUIRE(cm->Register(Req(id, role)).ok());
    }
    REQUIRE(cm->state() == pb::CLUSTER_READY);
    cm->TakeEvents();
  }
  // 31 s pass; only `alive` beat meanwhile.
  void Silence(const std::vector<std::string>& alive) {
    clock.Advance(seconds(31));
    for (const std::string& id : alive) REQUIRE(cm->Heartbeat(id).ok());
    cm->Tick();
  }
  FakeClock clock;
  std::unique_ptr<ClusterManager> cm;
};

// The last event of `kind` (the exit comes after any other state change).
const Event* Find(const std::vector<Event>& events, Kind kind) {
  const Event* found = nullptr;
  for (const Event& e : events) {
    if (e.kind == kind) found = &e;
  }
  return found;
}

}  // namespace

TEST_CASE("every node finishing ends the job finished, with no error on the exit events", "[core][outcome]") {
  Job job;
  CHECK(job.cm->outcome().result == JobOutcome::Result::kRunning);
  for (const char* id : {"s0", "w0", "w1"}) REQUIRE(job.cm->Finish(id).ok());
  REQUIRE(job.cm->state() == pb::CLUSTER_EXIT);
  CHECK(job.cm->outcome().result == JobOutcome::Result::kFinished);
  CHECK(job.cm->outcome().failed_nodes.empty());
  std::vector<Event> events = job.cm->TakeEvents();
  for (Kind kind : {Kind::kFinishPassed, Kind::kStateChanged}) {
    const Event* e = Find(events, kind);
    REQUIRE(e != nullptr);
    CHECK(e->error_code == 0);
  }
  CHECK(job.cm->Snapshot().job_result() == "finished");
}

TEST_CASE("a worker lost before it finished fails the job, naming it and the cause", "[core][outcome]") {
  Job job;
  REQUIRE(job.cm->Finish("s0").ok());
  REQUIRE(job.cm->Finish("w0").ok());
  job.Silence({"s0", "w0"});  // w1 died: the barrier passes without it
  REQUIRE(job.cm->state() == pb::CLUSTER_EXIT);
  const JobOutcome& out = job.cm->outcome();
  CHECK(out.result == JobOutcome::Result::kFailed);
  CHECK(out.failure == "worker w1 lost (no heartbeat for 31000 ms)");
  CHECK(out.failed_nodes == std::vector<std::string>{"w1"});
  std::vector<Event> events = job.cm->TakeEvents();
  for (Kind kind : {Kind::kFinishPassed, Kind::kStateChanged}) {
    const Event* e = Find(events, kind);
    REQUIRE(e != nullptr);
    CHECK(e->state == pb::CLUSTER_EXIT);
    CHECK(e->error_code == static_cast<int>(Code::kAborted));
    CHECK(e->message == "job failed: worker w1 lost (no heartbeat for 31000 ms)");
  }
  const pb::PersistedState snap = job.cm->Snapshot();
  CHECK(snap.job_result() == "failed");
  CHECK(snap.job_failure() == out.failure);
  REQUIRE(snap.failed_nodes_size() == 1);
  CHECK(snap.failed_nodes(0) == "w1");
}

TEST_CASE("several lost nodes are all named, servers first", "[core][outcome]") {
  Job job;
  REQUIRE(job.cm->Finish("w0").ok());
  job.Silence({"w0"});
  REQUIRE(job.cm->state() == pb::CLUSTER_EXIT);
  CHECK(job.cm->outcome().failure ==
        "server s0 lost (no heartbeat for 31000 ms); worker w1 lost (no heartbeat for 31000 ms)");
  CHECK(job.cm->outcome().failed_nodes == std::vector<std::string>{"s0", "w1"});
}

TEST_CASE("a node that finished and then went silent does not fail the job", "[core][outcome]") {
  Job job;
  REQUIRE(job.cm->Finish("w1").ok());
  job.Silence({"s0", "w0"});
  REQUIRE(job.cm->state() != pb::CLUSTER_EXIT);
  REQUIRE(job.cm->Finish("s0").ok());
  REQUIRE(job.cm->Finish("w0").ok());
  REQUIRE(job.cm->state() == pb::CLUSTER_EXIT);
  CHECK(job.cm->outcome().result == JobOutcome::Result::kFinished);
}

TEST_CASE("a lost worker restarted before the barrier passes does not fail the job", "[core][outcome]") {
  Job job;
  REQUIRE(job.cm->Finish("s0").ok());
  job.Silence({"s0", "w0"});  // w1 lost; w0 has not finished, so the barrier waits
  REQUIRE(job.cm->Find("w1")->timed_out);
  REQUIRE(job.cm->Register(Req("w1", pb::WORKER, /*inc=*/101)).ok());  // restarted
  REQUIRE(job.cm->Finish("w1").ok());
  REQUIRE(job.cm->Finish("w0").ok());
  REQUIRE(job.cm->state() == pb::CLUSTER_EXIT);
  CHECK(job.cm->outcome().result == JobOutcome::Result::kFinished);
}

TEST_CASE("every node timed out once the finish barrier started ends the job failed, naming the lost ones",
          "[core][outcome]") {
  Job job;
  REQUIRE(job.cm->Finish("w0").ok());
  job.Silence({});  // nobody beats: w0 finished (then went), s0 and w1 died
  REQUIRE(job.cm->state() == pb::CLUSTER_EXIT);
  CHECK(job.cm->outcome().result == JobOutcome::Result::kFailed);
  CHECK(job.cm->outcome().failure ==
        "server s0 lost (no heartbeat for 31000 ms); worker w1 lost (no heartbeat for 31000 ms)");
  CHECK(job.cm->outcome().failed_nodes == std::vector<std::string>{"s0", "w1"});
  const std::vector<Event> events = job.cm->TakeEvents();
  const Event* exit = Find(events, Kind::kStateChanged);
  REQUIRE(exit != nullptr);
  CHECK(exit->error_code == static_cast<int>(Code::kAborted));
}

TEST_CASE("a node still in error when the finish barrier passes fails the job, naming its error", "[core][outcome]") {
  Job job;
  REQUIRE(job.cm->ReportError("w1", 3, "disk full").ok());
  for (const char* id : {"s0", "w0", "w1"}) REQUIRE(job.cm->Finish(id).ok());
  REQUIRE(job.cm->state() == pb::CLUSTER_EXIT);
  CHECK(job.cm->outcome().result == JobOutcome::Result::kFailed);
  CHECK(job.cm->outcome().failure == "worker w1 in error (3: disk full)");
  CHECK(job.cm->outcome().failed_nodes == std::vector<std::string>{"w1"});
}

TEST_CASE("a worker scaled in left cleanly and does not fail the job", "[core][outcome]") {
  Job job;
  REQUIRE(job.cm->ScaleInByIds({"w1"}).ok());
  for (const char* id : {"s0", "w0", "w1"}) REQUIRE(job.cm->ScaleInDone(id, job.cm->epoch()).ok());
  REQUIRE(job.cm->Find("w1") == nullptr);
  REQUIRE(job.cm->Finish("s0").ok());
  REQUIRE(job.cm->Finish("w0").ok());
  REQUIRE(job.cm->state() == pb::CLUSTER_EXIT);
  CHECK(job.cm->outcome().result == JobOutcome::Result::kFinished);
}

TEST_CASE("an admin stop ends the job stopped", "[core][outcome]") {
  Job job;
  REQUIRE(job.cm->SetState(pb::CLUSTER_EXIT).ok());
  CHECK(job.cm->outcome().result == JobOutcome::Result::kStopped);
  CHECK(std::string(JobResultName(job.cm->outcome().result)) == "stopped");
}

namespace {

// Advances the clock by `total` in steps of at most 50 ms, checking after each step as the
// node's timer does; returns the verdicts other than kAlive.
std::vector<SchedulerWatch::Verdict> Run(SchedulerWatch& watch, FakeClock& clock, milliseconds total) {
  std::vector<SchedulerWatch::Verdict> seen;
  while (total > milliseconds(0)) {
    const milliseconds step = std::min(total, milliseconds(50));
    clock.Advance(step);
    total -= step;
    const SchedulerWatch::Verdict v = watch.Check();
    if (v != SchedulerWatch::Verdict::kAlive) seen.push_back(v);
  }
  return seen;
}

using V = SchedulerWatch::Verdict;
using Verdicts = std::vector<SchedulerWatch::Verdict>;

}  // namespace

TEST_CASE("the scheduler watch reports silence once, redials each timeout, logs recovery, then gives up once",
          "[core][watch]") {
  FakeClock clock;
  SchedulerWatch watch({/*silence_timeout=*/milliseconds(1000), /*give_up_after=*/milliseconds(5000)}, &clock);
  CHECK(watch.Check() == V::kAlive);  // not started: nothing to judge
  watch.Start();
  CHECK(Run(watch, clock, milliseconds(999)).empty());
  CHECK_FALSE(watch.Answered().has_value());  // an answer while alive ends no silence

  CHECK(Run(watch, clock, milliseconds(1000)) == Verdicts{V::kSilent});
  CHECK(watch.silent());
  CHECK(Run(watch, clock, milliseconds(1000)) == Verdicts{V::kRedial});
  std::optional<Duration> silence = watch.Answered();
  REQUIRE(silence.has_value());
  CHECK(ToMillis(*silence) == 2000);
  CHECK_FALSE(watch.silent());

  // A new silence is reported again, redialed each second, and given up at 5 s, once.
  CHECK(Run(watch, clock, milliseconds(5000)) == Verdicts{V::kSilent, V::kRedial, V::kRedial, V::kRedial, V::kGiveUp});
  CHECK(ToMillis(watch.since_answer()) == 5000);
  CHECK(Run(watch, clock, milliseconds(2000)).empty());
}

TEST_CASE("the scheduler watch never gives up before it has judged the scheduler silent", "[core][watch]") {
  FakeClock clock;
  SchedulerWatch watch({/*silence_timeout=*/milliseconds(3000), /*give_up_after=*/milliseconds(1000)}, &clock);
  CHECK(ToMillis(watch.config().give_up_after) == 3000);
  watch.Start();
  CHECK(Run(watch, clock, milliseconds(2999)).empty());
  CHECK(Run(watch, clock, milliseconds(1)) == Verdicts{V::kGiveUp});
}

TEST_CASE("time the member itself did not run does not count as the scheduler's silence", "[core][watch]") {
  FakeClock clock;
  SchedulerWatch watch({/*silence_timeout=*/milliseconds(1000), /*give_up_after=*/milliseconds(5000)}, &clock);
  watch.Start();
  CHECK(Run(watch, clock, milliseconds(500)).empty());
  clock.Advance(seconds(10));  // this process was stopped: the answers wait in its socket
  CHECK(watch.Check() == V::kAlive);
  CHECK(ToMillis(watch.since_answer()) == 500);
  CHECK(Run(watch, clock, milliseconds(450)).empty());
  CHECK(Run(watch, clock, milliseconds(50)) == Verdicts{V::kSilent});
}

}  // namespace pscore::core
