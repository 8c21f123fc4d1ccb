// The demo job (pscore-node scheduler with --state_dir, 2 sgd servers, 2 pscore-train
// workers, all real processes) rides through control-plane faults and ends as an
// undisturbed run: every trainer exits 0 and synchronous SGD ends with the same weights
// (loss and weights checksum within 1e-6: the servers may add two workers' pushes in
// either order). The faults: the scheduler SIGKILLed and restarted on its port from its
// --state_dir while the workers push, and while a worker waits in a barrier (the other
// worker is held with SIGSTOP meanwhile, so one is in the barrier for sure); the scheduler
// SIGSTOPped for 3 heartbeat timeouts, then SIGCONT; a server SIGSTOPped past its
// heartbeat timeout, then SIGCONT (the workers' pushes and pulls to it are retried within
// --recovery_timeout_ms: the job rides through); a worker SIGKILLed and restarted with its
// node id (it resumes its step; the other worker waits in its barrier meanwhile). Every
// child is SIGKILLed by pid when a test ends; every wait has a deadline.
#include <signal.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "multiproc/train_job.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = TrainJob::Clock;

constexpr int kHeartbeatTimeoutMs = 3000;

// Restarted workers rejoin: the scheduler declares their role recoverable
// (docs/coordination.md); it persists its state in --state_dir.
TrainJobOptions ControlJob() {
  TrainJobOptions o;
  o.steps = 30;
  o.heartbeat_timeout_ms = kHeartbeatTimeoutMs;
  o.connect_timeout_ms = 20000;
  o.recovery_timeout_ms = 40000;
  o.state_dir = true;
  return o;
}

enum class Fault { kSchedulerKillPushing, kSchedulerKillBarrier, kSchedulerStop, kServerStop, kWorkerKill };

std::vector<TrainFinal> RunJob(Fault fault) {
  TrainJob job(ControlJob());
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 240s;
  REQUIRE(job.WaitStep(job.options().steps / 3, deadline));
  switch (fault) {
    case Fault::kSchedulerKillPushing:
      job.KillScheduler();
      job.RestartScheduler();
      break;
    case Fault::kSchedulerKillBarrier:
      // Worker 1 held: worker 0 reaches a barrier of this step and waits in it.
      job.trainers[1]->Signal(SIGSTOP);
      std::this_thread::sleep_for(300ms);
      job.KillScheduler();
      job.RestartScheduler();
      std::this_thread::sleep_for(300ms);
      job.trainers[1]->Signal(SIGCONT);
      break;
    case Fault::kSchedulerStop:
      job.scheduler.Signal(SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(3 * kHeartbeatTimeoutMs));
      job.scheduler.Signal(SIGCONT);
      break;
    case Fault::kServerStop:
      job.servers[1]->Signal(SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(kHeartbeatTimeoutMs + 1000));
      job.servers[1]->Signal(SIGCONT);
      break;
    case Fault::kWorkerKill:
      job.KillTrainer(1);
      job.RestartTrainer(1);
      break;
  }
  std::vector<TrainFinal> finals = job.RequireFinished(deadline);
  if (fault == Fault::kWorkerKill) {
    CHECK_THAT(job.trainers[1]->Log(), Catch::Contains("restarted: resumes after step"));
  }
  return finals;
}

void CompareWithUndisturbed(Fault fault) {
  const std::vector<TrainFinal> plain = UndisturbedFinals(ControlJob());
  CheckSameFinals(plain, RunJob(fault));
}

}  // namespace

TEST_CASE("the demo job with a worker SIGKILLed for good fails: the other trainer exits 3 naming it, within a bound",
          "[multiproc][net][demo][control]") {
  TrainJob job(ControlJob());
  job.Start();
  INFO("logs in " << job.dir.path());
  REQUIRE(job.WaitStep(job.options().steps / 3, Clock::now() + 120s));
  job.trainers[1]->Signal(SIGKILL);
  REQUIRE(job.trainers[1]->Wait(20s).has_value());
  // Bound: its heartbeat timeout, then the failed barrier, the error report and the finish
  // barrier (servers finish with the job); generous for sanitizer builds.
  std::optional<int> code = job.trainers[0]->Wait(120s);
  const std::string log = job.trainers[0]->Log();
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 3);
  CHECK_THAT(log, Catch::Contains("worker1"));
  CHECK_THAT(log, Catch::Contains("job failed"));
  INFO(job.scheduler.Log());
  CHECK(job.scheduler.Wait(60s) == std::optional<int>(3));
}

TEST_CASE("the demo job with its scheduler SIGKILLed while workers push, restarted from --state_dir, ends as undisturbed",
          "[multiproc][net][demo][control]") {
  CompareWithUndisturbed(Fault::kSchedulerKillPushing);
}

TEST_CASE("the demo job with its scheduler SIGKILLed while a worker waits in a barrier, restarted from --state_dir, "
          "ends as undisturbed",
          "[multiproc][net][demo][control][tlspass]") {
  CompareWithUndisturbed(Fault::kSchedulerKillBarrier);
}

TEST_CASE("the demo job with its scheduler SIGSTOPped for 3 heartbeat timeouts, then SIGCONT, ends as undisturbed",
          "[multiproc][net][demo][control]") {
  CompareWithUndisturbed(Fault::kSchedulerStop);
}

TEST_CASE("the demo job with a server SIGSTOPped past its heartbeat timeout, then SIGCONT, ends as undisturbed",
          "[multiproc][net][demo][control]") {
  CompareWithUndisturbed(Fault::kServerStop);
}

TEST_CASE("the demo job with a worker SIGKILLed and restarted with its node id resumes the step and ends as undisturbed",
          "[multiproc][net][demo][control][tlspass]") {
  CompareWithUndisturbed(Fault::kWorkerKill);
}

}  // namespace pscore::testing
