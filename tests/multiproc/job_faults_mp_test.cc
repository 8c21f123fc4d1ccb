// Fault-matrix cells of the demo job (real pscore-node and pscore-train processes,
// tests/multiproc/train_job.h) that the other job tests do not cover, each asserted on the
// job's outcome (docs/reliability.md, "Fault matrix"):
// - the partial-push redo: a worker SIGKILLed right after its step's "train/pulled"
//   barrier, its push acknowledged by one server and waiting unread at the other (stopped
//   meanwhile), restarted with its node id: it redoes the push with its predecessor's ids
//   and the job ends as undisturbed;
// - a worker and the scheduler SIGKILLed together, both restarted (the scheduler from its
//   --state_dir): the job ends as undisturbed;
// - during a scale-out (replicas=1: worker rank 0 asks for a third server at a step, the
//   test starts it once the scheduler is scaling): a worker SIGKILLed and restarted, the
//   scheduler SIGKILLed and restarted from --state_dir, a server SIGKILLed and restarted
//   from --data_dir. Each ends as undisturbed (exit 0 everywhere, loss and weights
//   checksum of an undisturbed run within 1e-6) or as the cell's test states;
// - a server whose disk fills for good (a file size limit set on the running process): the
//   job fails loudly, the trainers naming the journal, every process exiting 3.
// Every child is SIGKILLed by pid when a test ends; every wait has a deadline.
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "multiproc/job_admin.h"  // before train_job.h: Catch's CHECK must win over glog's
#include "multiproc/train_job.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = TrainJob::Clock;

// The round of barrier `id` that waits for `missing` alone, if any.
std::optional<pb::BarrierInfo> WaitingFor(int port, const std::string& id, const std::string& missing) {
  std::optional<pb::AdminResponse> r = AdminAsk(port, "barriers");
  if (!r) return std::nullopt;
  for (const pb::BarrierInfo& b : r->barriers()) {
    if (b.id() == id && b.state() == "waiting" && b.missing_size() == 1 && b.missing(0) == missing) return b;
  }
  return std::nullopt;
}

// The step of the weights worker `id` last pulled and kept in the KV store (pscore-train:
// "train/w/<id>" = step u64, then the floats), or 0.
uint64_t PulledStep(int port, const std::string& id) {
  node::AdminClientOptions ao;
  ao.scheduler_port = port;
  ao.timeout = 3s;
  node::AdminClient admin(ao);
  if (!admin.Connect().ok()) return 0;
  Result<std::string> v = admin.KvGet("train/w/" + id, 1s);
  uint64_t step = 0;
  if (v.ok() && v->size() >= sizeof(step)) std::memcpy(&step, v->data(), sizeof(step));
  return step;
}

bool RoundPassed(int port, const std::string& id, uint64_t generation) {
  std::optional<pb::AdminResponse> r = AdminAsk(port, "barriers");
  if (!r) return false;
  for (const pb::BarrierInfo& b : r->barriers()) {
    if (b.id() == id && b.generation() == generation && b.state() == "passed") return true;
  }
  return false;
}

TrainJobOptions BaseJob() {
  TrainJobOptions o = FaultJob();
  o.state_dir = true;
  return o;
}

}  // namespace

TEST_CASE("the demo job with a worker SIGKILLed right after its pulled barrier, its push half applied, restarted: "
          "it redoes the push and the job ends as undisturbed",
          "[multiproc][net][demo][control]") {
  TrainJobOptions o = BaseJob();
  // A step takes milliseconds and the window probed for below is a part of one: the job
  // must not end before the probe catches it.
  o.steps = 150;
  const std::vector<TrainFinal> plain = UndisturbedFinals(o);
  TrainJob job(o);
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 240s;
  REQUIRE(job.WaitStep(5, deadline));
  // Hold worker0 until worker1 waits for it, alone, in a "train/pulled" round, and worker0
  // has pulled that step's weights already (held between its pull and the barrier); other
  // stops are let go and tried again.
  std::optional<pb::BarrierInfo> round;
  for (int attempt = 0; attempt < 200 && !round && Clock::now() < deadline; ++attempt) {
    job.trainers[0]->Signal(SIGSTOP);
    const auto settle = Clock::now() + 2s;
    std::optional<pb::BarrierInfo> step_wait;
    while (Clock::now() < settle && !round && !step_wait) {
      round = WaitingFor(job.port, "train/pulled", "worker0");
      if (!round) step_wait = WaitingFor(job.port, "train/step", "worker0");
      if (!round && !step_wait) std::this_thread::sleep_for(10ms);
    }
    if (round && PulledStep(job.port, "worker0") == round->generation()) break;
    round.reset();
    job.trainers[0]->Signal(SIGCONT);
    std::this_thread::sleep_for(std::chrono::milliseconds(7 * attempt % 50));
  }
  REQUIRE(round.has_value());
  // server1 stops reading: the step's pushes to it wait unread in its socket, those to
  // server0 are applied and acknowledged. worker0 arrives, the round passes, both push.
  job.servers[1]->Signal(SIGSTOP);
  job.trainers[0]->Signal(SIGCONT);
  const auto until = Clock::now() + 20s;
  bool passed = false;
  while (!passed && Clock::now() < until) {
    passed = RoundPassed(job.port, "train/pulled", round->generation());
    if (!passed) std::this_thread::sleep_for(5ms);
  }
  REQUIRE(passed);
  std::this_thread::sleep_for(300ms);  // the pushes go out
  job.KillTrainer(1);
  job.servers[1]->Signal(SIGCONT);  // applies the dead worker's part waiting in its socket
  job.RestartTrainer(1);
  const std::vector<TrainFinal> finals = job.RequireFinished(deadline);
  CheckSameFinals(plain, finals);
  CHECK_THAT(job.trainers[1]->Log(), Catch::Contains("(redoing the push of the next step)"));
}

// The restarted scheduler keeps each barrier's newest ended round, not the rounds each node
// joined: the restarted worker is told the restored rounds and resumes from them.
TEST_CASE("the demo job with a worker and the scheduler SIGKILLed together, both restarted, ends as undisturbed",
          "[multiproc][net][demo][control]") {
  const TrainJobOptions o = BaseJob();
  const std::vector<TrainFinal> plain = UndisturbedFinals(o);
  TrainJob job(o);
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 240s;
  REQUIRE(job.WaitStep(o.steps / 3, deadline));
  job.trainers[1]->Signal(SIGKILL);
  job.KillScheduler();
  REQUIRE(job.trainers[1]->Wait(20s).has_value());
  job.RestartScheduler();
  job.RestartTrainer(1);
  const std::vector<TrainFinal> finals = job.RequireFinished(deadline);
  CheckSameFinals(plain, finals);
  CHECK_THAT(job.trainers[1]->Log(), Catch::Contains("restarted: resumes after step"));
}

TEST_CASE("the demo job with a server whose disk fills mid-training fails loudly: the trainers name the journal, every "
          "process exits 3",
          "[multiproc][net][journal]") {
  TrainJobOptions o = BaseJob();
  o.data_dir = true;
  o.steps = 400;  // still training when the disk fills
  o.recovery_timeout_ms = 3000;  // how long a trainer sends a refused push again
  TrainJob job(o);
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 120s;
  REQUIRE(job.WaitStep(3, deadline));
  // server0's disk is full: no file of it grows any more (its journal; its log too).
  rlimit full = {};
  REQUIRE(::prlimit(job.servers[0]->pid(), RLIMIT_FSIZE, nullptr, &full) == 0);
  full.rlim_cur = 1;
  REQUIRE(::prlimit(job.servers[0]->pid(), RLIMIT_FSIZE, &full, nullptr) == 0);
  TrainJob::Outcome out = job.WaitTrainers(deadline);
  bool named = false;
  for (size_t i = 0; i < out.codes.size(); ++i) {
    INFO("trainer " << i << ": " << out.logs[i]);
    REQUIRE(out.codes[i].has_value());
    CHECK(*out.codes[i] == 3);
    CHECK_FALSE(out.finals[i].found);
    named = named || out.logs[i].find("server server0 cannot journal the change") != std::string::npos;
  }
  CHECK(named);
  INFO(job.scheduler.Log());
  CHECK(job.scheduler.Wait(60s) == std::optional<int>(3));
  // Not killed by SIGXFSZ (exit 128 + 25): the refused writes were errors it handled.
  for (int i = 0; i < 2; ++i) {
    INFO("server " << i << ": " << job.servers[i]->Log());
    CHECK(job.servers[i]->Wait(60s) == std::optional<int>(3));
  }
}

namespace {

// The job scales out at step 10 (worker0 asks for a third server); `fault` strikes while
// the scheduler is scaling, before the new server is started.
void RunScaleFault(MidScaleFault fault) {
  TrainJobOptions o = BaseJob();
  o.data_dir = true;
  o.trainer_flags = {"--scale_out_at=10"};
  const std::vector<TrainFinal> plain = UndisturbedFinals(o);
  TrainJob job(o);
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 240s;
  REQUIRE(WaitState(job.port, pb::CLUSTER_SCALE_OUT, deadline));
  job.Strike(fault, deadline);
  if (fault.kind == MidScaleFault::kSchedulerStop) job.ResumeStalledScheduler();
  job.StartServer(2, "");
  CheckSameFinals(plain, job.RequireTrainersDone(deadline));
  INFO(job.scheduler.Log());
  CHECK(job.scheduler.Wait(60s) == std::optional<int>(0));
  const std::string sched_log = job.scheduler.Log();
  for (int i = 0; i < 2; ++i) {
    INFO("server " << i << ": " << job.servers[i]->Log());
    CHECK(job.servers[i]->Wait(60s) == std::optional<int>(0));
  }
  const std::optional<int> new_server = job.servers[2]->Wait(60s);
  INFO("server 2: " << job.servers[2]->Log());
  REQUIRE(new_server.has_value());
  if (fault.kind == MidScaleFault::kSchedulerKill) {
    // The restarted scheduler rolled the scale-out back (its progress is not persisted):
    // the job trained on with 2 servers and the third was refused.
    CHECK(*new_server != 0);
  } else {
    CHECK(*new_server == 0);
  }
}

}  // namespace

TEST_CASE("during a scale-out: a worker SIGKILLed and restarted - the job ends as undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunScaleFault({MidScaleFault::kTrainerKill});
}

TEST_CASE("during a scale-out: the scheduler SIGKILLed and restarted from --state_dir - the job ends as undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunScaleFault({MidScaleFault::kSchedulerKill});
}

// The scale-out completes once the scheduler runs again and the third server joins.
TEST_CASE("during a scale-out: the scheduler SIGSTOPped for 3 heartbeat timeouts, then SIGCONT - the job ends as "
          "undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunScaleFault({MidScaleFault::kSchedulerStop});
}

// The restarted server registers while the scale-out runs; the metadata's old server count
// tells it that it was a member before, so it moves its restored range as the others do.
TEST_CASE("during a scale-out: a server SIGKILLed and restarted from --data_dir - the job ends as undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunScaleFault({MidScaleFault::kServerKill, 1});
}

}  // namespace pscore::testing
