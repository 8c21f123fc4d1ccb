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
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "multiproc/process.h"
#include "multiproc/train_log.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kSteps = 30;
constexpr int kHeartbeatTimeoutMs = 3000;
constexpr int kRecoveryMs = 40000;
const std::vector<std::string> kTiming = {"--heartbeat_interval_ms=200",
                                          "--heartbeat_timeout_ms=" + std::to_string(kHeartbeatTimeoutMs),
                                          "--connect_timeout_ms=20000"};

std::vector<std::string> With(std::vector<std::string> args) {
  args.insert(args.end(), kTiming.begin(), kTiming.end());
  return args;
}

enum class Fault { kNone, kSchedulerKillPushing, kSchedulerKillBarrier, kSchedulerStop, kServerStop, kWorkerKill };

struct Job {
  TempDir dir;
  Process scheduler;
  std::vector<std::unique_ptr<Process>> servers;
  std::vector<std::unique_ptr<Process>> trainers;
  int port = 0;

  std::vector<std::string> SchedulerArgv(int p) {
    // Restarted workers rejoin: their role is declared recoverable (docs/coordination.md).
    return With({NodeBinary(), "--role=scheduler", "--worker_num=2", "--server_num=2",
                 "--recoverable_roles=worker,server",
                 "--scheduler_port=" + std::to_string(p), "--port_file=" + dir.File("sched.port"),
                 "--state_dir=" + dir.File("state")});
  }
  std::vector<std::string> TrainerArgv(int i) {
    return With({std::string(PSCORE_BIN_DIR) + "/pscore-train", "--node_id=worker" + std::to_string(i),
                 "--scheduler_port=" + std::to_string(port), "--steps=" + std::to_string(kSteps),
                 "--recovery_timeout_ms=" + std::to_string(kRecoveryMs)});
  }
  void Start() {
    REQUIRE(dir.ok());
    REQUIRE(scheduler.Start(SchedulerArgv(0), dir.File("scheduler.log")));
    port = ReadPortFile(dir.File("sched.port"), 20s);
    REQUIRE(port > 0);
    for (int i = 0; i < 2; ++i) {
      const std::string id = "server" + std::to_string(i);
      servers.push_back(std::make_unique<Process>());
      REQUIRE(servers.back()->Start(
          With({NodeBinary(), "--role=server", "--node_id=" + id, "--scheduler_port=" + std::to_string(port),
                "--update_rule=sgd", "--learning_rate=2", "--recovery_timeout_ms=" + std::to_string(kRecoveryMs)}),
          dir.File(id + ".log")));
    }
    for (int i = 0; i < 2; ++i) {
      trainers.push_back(std::make_unique<Process>());
      REQUIRE(trainers.back()->Start(TrainerArgv(i), dir.File("worker" + std::to_string(i) + ".log")));
    }
  }
  // Waits until trainer 0 printed step `step` (false at the deadline or if it exited).
  bool WaitStep(int step, Clock::time_point deadline) {
    char want[32];
    std::snprintf(want, sizeof want, "step %3d ", step);
    while (Clock::now() < deadline && trainers[0]->running()) {
      if (trainers[0]->Log().find(want) != std::string::npos) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
  void RestartScheduler() {
    scheduler.Signal(SIGKILL);
    REQUIRE(scheduler.Wait(20s).has_value());
    REQUIRE(scheduler.Start(SchedulerArgv(port), dir.File("scheduler.restarted.log")));
  }
};

struct Outcome {
  std::vector<TrainFinal> finals;
};

Outcome RunJob(Fault fault) {
  Job job;
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 240s;
  if (fault != Fault::kNone) REQUIRE(job.WaitStep(kSteps / 3, deadline));
  switch (fault) {
    case Fault::kNone:
      break;
    case Fault::kSchedulerKillPushing:
      job.RestartScheduler();
      break;
    case Fault::kSchedulerKillBarrier:
      // Worker 1 held: worker 0 reaches a barrier of this step and waits in it.
      job.trainers[1]->Signal(SIGSTOP);
      std::this_thread::sleep_for(300ms);
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
      job.trainers[1]->Signal(SIGKILL);
      REQUIRE(job.trainers[1]->Wait(20s).has_value());
      job.trainers[1] = std::make_unique<Process>();
      REQUIRE(job.trainers[1]->Start(job.TrainerArgv(1), job.dir.File("worker1.restarted.log")));
      break;
  }
  Outcome out;
  for (auto& t : job.trainers) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    std::optional<int> code = t->Wait(left);
    const std::string log = t->Log();
    INFO(log);
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    out.finals.push_back(ParseTrainFinal(log));
    REQUIRE(out.finals.back().found);
  }
  for (auto& s : job.servers) {
    INFO(s->Log());
    CHECK(s->Wait(60s) == std::optional<int>(0));
  }
  INFO(job.scheduler.Log());
  CHECK(job.scheduler.Wait(60s) == std::optional<int>(0));
  if (fault == Fault::kWorkerKill) {
    CHECK_THAT(job.trainers[1]->Log(), Catch::Contains("restarted: resumes after step"));
  }
  return out;
}

void CompareWithUndisturbed(Fault fault) {
  Outcome plain = RunJob(Fault::kNone);
  REQUIRE(plain.finals.size() == 2);
  Outcome faulted = RunJob(fault);
  REQUIRE(faulted.finals.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    INFO("trainer " << i << ": loss " << plain.finals[i].loss << " vs " << faulted.finals[i].loss << ", checksum "
                    << plain.finals[i].checksum << " vs " << faulted.finals[i].checksum);
    CHECK(std::fabs(plain.finals[i].loss - faulted.finals[i].loss) <= 1e-6);
    CHECK(std::fabs(plain.finals[i].checksum - faulted.finals[i].checksum) <= 1e-6);
  }
}

}  // namespace

TEST_CASE("the demo job with a worker SIGKILLed for good fails: the other trainer exits 3 naming it, within a bound",
          "[multiproc][net][demo][control]") {
  Job job;
  job.Start();
  INFO("logs in " << job.dir.path());
  REQUIRE(job.WaitStep(kSteps / 3, Clock::now() + 120s));
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
          "[multiproc][net][demo][control]") {
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
          "[multiproc][net][demo][control]") {
  CompareWithUndisturbed(Fault::kWorkerKill);
}

}  // namespace pscore::testing
