// Fault-matrix cells of the demo job while a scale-out moves parameters (real pscore-node
// and pscore-train processes, tests/multiproc/train_job.h; docs/reliability.md, "Fault
// matrix"). Replicas=1, servers with --data_dir, the scheduler with --state_dir. Worker
// rank 0 asks for a third server at step 10; once the scheduler is scaling, the test pauses
// server1 (SIGSTOP) and starts server2. Its registration completes the membership, and the
// old servers start moving what server2 now owns; the paused server1 cannot finish, which
// holds the scale-out in that phase while one fault strikes (the pause stays far under the
// heartbeat timeout: a slow server, not a fault):
// - a worker SIGKILLed and restarted with its node id;
// - the scheduler SIGKILLed and restarted from --state_dir;
// - the scheduler SIGSTOPped for 3 heartbeat timeouts, then SIGCONT;
// - server0 (old, not paused) SIGKILLed and restarted from --data_dir;
// - server2 (new) SIGKILLed and restarted from --data_dir;
// - server1 (old, paused) SIGKILLed and restarted from --data_dir.
// Each cell asserts the job's outcome: both trainers exit 0 with the loss and weights
// checksum of an undisturbed run within 1e-6 (no acknowledged push lost or applied twice),
// the old servers and the scheduler exit 0, and the scale-out either completed (server2
// exits 0) or was rolled back (server2, dropped, exits with the job) as the cell states.
// Every child is SIGKILLed by pid when a test ends; every wait has a deadline.
#include <signal.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "multiproc/job_admin.h"  // before train_job.h: Catch's CHECK must win over glog's
#include "multiproc/train_job.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = TrainJob::Clock;

constexpr int kPaused = 1;

void RunMovingFault(MidScaleFault fault, bool completes) {
  TrainJobOptions o = FaultJob();
  o.state_dir = true;
  o.data_dir = true;
  o.trainer_flags = {"--scale_out_at=10"};
  const std::vector<TrainFinal> plain = UndisturbedFinals(o);
  TrainJob job(o);
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 240s;
  REQUIRE(WaitState(job.port, pb::CLUSTER_SCALE_OUT, deadline));
  job.servers[kPaused]->Signal(SIGSTOP);
  job.StartServer(2, "");
  REQUIRE(TrainJob::WaitLog([&] { return job.scheduler.Log(); }, "scheduler: server server2 registered as rank 2",
                            deadline));
  // A restarted member's new process registers before server1 runs again (Replace*).
  job.Strike(fault, deadline);
  if (fault.kind != MidScaleFault::kServerKill || fault.server != kPaused) job.servers[kPaused]->Signal(SIGCONT);
  if (fault.kind == MidScaleFault::kSchedulerStop) job.ResumeStalledScheduler();
  CheckSameFinals(plain, job.RequireTrainersDone(deadline));
  INFO(job.scheduler.Log());
  CHECK(job.scheduler.Wait(60s) == std::optional<int>(0));
  for (int i = 0; i < 2; ++i) {
    INFO("server " << i << ": " << job.servers[i]->Log());
    CHECK(job.servers[i]->Wait(60s) == std::optional<int>(0));
  }
  const std::optional<int> new_server = job.servers[2]->Wait(60s);
  INFO("server 2: " << job.servers[2]->Log());
  REQUIRE(new_server.has_value());
  std::string sched_log = job.scheduler.Log();
  if (fault.kind == MidScaleFault::kSchedulerKill) sched_log = ReadFile(job.dir.File("scheduler.restarted.log"));
  INFO(sched_log);
  if (completes) {
    CHECK(*new_server == 0);
    CHECK_THAT(sched_log, Catch::Contains("scale operation done: 2 workers, 3 servers"));
  } else {
    CHECK_THAT(sched_log, Catch::Contains("scale operation rolled back"));
  }
}

}  // namespace

TEST_CASE("while a scale-out moves parameters: a worker SIGKILLed and restarted - the job ends as undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunMovingFault({MidScaleFault::kTrainerKill}, /*completes=*/true);
}

TEST_CASE("while a scale-out moves parameters: the scheduler SIGKILLed and restarted from --state_dir - the job ends "
          "as undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunMovingFault({MidScaleFault::kSchedulerKill}, /*completes=*/false);
}

TEST_CASE("while a scale-out moves parameters: the scheduler SIGSTOPped for 3 heartbeat timeouts, then SIGCONT - the "
          "job ends as undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunMovingFault({MidScaleFault::kSchedulerStop}, /*completes=*/true);
}

TEST_CASE("while a scale-out moves parameters: an old server SIGKILLed and restarted from --data_dir - the job ends "
          "as undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunMovingFault({MidScaleFault::kServerKill, 0}, /*completes=*/true);
}

TEST_CASE("while a scale-out moves parameters: the new server SIGKILLed and restarted from --data_dir - the job ends "
          "as undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunMovingFault({MidScaleFault::kServerKill, 2}, /*completes=*/true);
}

TEST_CASE("while a scale-out moves parameters: the paused old server SIGKILLed and restarted from --data_dir - the "
          "job ends as undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunMovingFault({MidScaleFault::kServerKill, kPaused}, /*completes=*/true);
}

}  // namespace pscore::testing
