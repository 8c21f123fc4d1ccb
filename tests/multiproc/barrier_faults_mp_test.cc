// The fault matrix's barrier column for the faults of a server and a frozen scheduler: the
// demo job (pscore-node scheduler with --state_dir, 2 sgd servers, 2 pscore-train workers,
// all real processes) with worker 0 waiting in a barrier of its step when the fault
// strikes (worker 1 is held with SIGSTOP for a moment, well under the heartbeat timeout, so
// worker 0 is in the barrier for sure). Each cell asserts the job's outcome: every trainer
// exits 0 with the loss and weights checksum of an undisturbed run (within 1e-6), and the
// scheduler and every surviving server exit 0. Every child is SIGKILLed by pid when a test
// ends; every wait has a deadline.
#include <signal.h>

#include <chrono>
#include <filesystem>
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
constexpr auto kHold = 300ms;  // worker 1 held: worker 0 reaches the step's barrier

enum class Fault {
  kSchedulerStop,      // SIGSTOP for 3 heartbeat timeouts, then SIGCONT
  kServerStop,         // R=1: SIGSTOP past the heartbeat timeout, then SIGCONT
  kServerRestart,      // R=1: SIGKILL, restarted from its --data_dir
  kServerLost,         // R=2: SIGKILL, its data directory deleted, not restarted
  kServerStopForGood,  // R=2: SIGSTOP, never resumed
};

TrainJobOptions JobFor(Fault fault) {
  TrainJobOptions o;
  o.steps = 30;
  o.heartbeat_timeout_ms = kHeartbeatTimeoutMs;
  o.connect_timeout_ms = 20000;
  o.recovery_timeout_ms = 40000;
  o.state_dir = true;
  o.data_dir = fault == Fault::kServerRestart || fault == Fault::kServerLost;
  o.replicas = fault == Fault::kServerLost || fault == Fault::kServerStopForGood ? 2 : 1;
  return o;
}

void RunCell(Fault fault) {
  const TrainJobOptions o = JobFor(fault);
  const std::vector<TrainFinal> plain = UndisturbedFinals(o);
  TrainJob job(o);
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 240s;
  REQUIRE(job.WaitStep(o.steps / 3, deadline));
  job.trainers[1]->Signal(SIGSTOP);
  std::this_thread::sleep_for(kHold);
  std::vector<int> gone;  // servers that do not end the job
  switch (fault) {
    case Fault::kSchedulerStop:
      job.scheduler.Signal(SIGSTOP);
      std::this_thread::sleep_for(kHold);
      job.trainers[1]->Signal(SIGCONT);
      std::this_thread::sleep_for(std::chrono::milliseconds(3 * kHeartbeatTimeoutMs) - kHold);
      job.scheduler.Signal(SIGCONT);
      break;
    case Fault::kServerStop:
      job.servers[1]->Signal(SIGSTOP);
      std::this_thread::sleep_for(kHold);
      job.trainers[1]->Signal(SIGCONT);
      std::this_thread::sleep_for(std::chrono::milliseconds(kHeartbeatTimeoutMs + 1000) - kHold);
      job.servers[1]->Signal(SIGCONT);
      break;
    case Fault::kServerRestart:
      job.KillServer(1);
      job.StartServer(1, ".restarted");
      job.trainers[1]->Signal(SIGCONT);
      break;
    case Fault::kServerLost:
      job.KillServer(1);
      std::filesystem::remove_all(job.dir.File("server1.data"));
      job.trainers[1]->Signal(SIGCONT);
      gone.push_back(1);
      break;
    case Fault::kServerStopForGood:
      job.servers[1]->Signal(SIGSTOP);
      std::this_thread::sleep_for(kHold);
      job.trainers[1]->Signal(SIGCONT);
      gone.push_back(1);
      break;
  }
  const std::vector<TrainFinal> finals = job.RequireFinished(deadline, gone);
  CheckSameFinals(plain, finals);
  if (fault == Fault::kServerStopForGood) job.servers[1]->Signal(SIGKILL);
}

}  // namespace

TEST_CASE("while a worker waits in a barrier: the scheduler SIGSTOPped for 3 heartbeat timeouts, then SIGCONT - "
          "the demo job ends as undisturbed",
          "[multiproc][net][demo][control]") {
  RunCell(Fault::kSchedulerStop);
}

TEST_CASE("while a worker waits in a barrier: a server SIGSTOPped past its heartbeat timeout, then SIGCONT - "
          "the demo job ends as undisturbed",
          "[multiproc][net][demo][control]") {
  RunCell(Fault::kServerStop);
}

TEST_CASE("while a worker waits in a barrier: a server SIGKILLed and restarted from --data_dir - "
          "the demo job ends as undisturbed",
          "[multiproc][net][demo][control]") {
  RunCell(Fault::kServerRestart);
}

TEST_CASE("replicas=2, while a worker waits in a barrier: a server SIGKILLed for good, its data deleted - "
          "the demo job ends as undisturbed",
          "[multiproc][net][demo][replication]") {
  RunCell(Fault::kServerLost);
}

TEST_CASE("replicas=2, while a worker waits in a barrier: a server SIGSTOPped and never resumed - "
          "the demo job ends as undisturbed",
          "[multiproc][net][demo][replication]") {
  RunCell(Fault::kServerStopForGood);
}

}  // namespace pscore::testing
