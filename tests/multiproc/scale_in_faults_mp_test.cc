// Fault-matrix cells of the demo job during a scale-in (real pscore-node and pscore-train
// processes, tests/multiproc/train_job.h; docs/reliability.md, "Fault matrix"). Replicas=1,
// servers with --data_dir, the scheduler with --state_dir. While the trainers run, the test
// asks for a scale-in of server1 (of 2). So that the fault lands while the scale-in runs,
// server1 is paused (SIGSTOP) from just before the request until the fault has struck, far
// under its heartbeat timeout: a slow server, which the cluster does not count as a fault,
// holds the scale-in open. Then one fault:
// - a worker SIGKILLed and restarted with its node id;
// - the scheduler SIGKILLed and restarted from --state_dir;
// - the scheduler SIGSTOPped for 3 heartbeat timeouts, then SIGCONT;
// - the server that stays (server0) SIGKILLed and restarted from --data_dir;
// - the leaving server (server1) SIGKILLed and restarted from --data_dir.
// With replicas=2 and 3 servers, one server lost for good while the scale-in is held open:
// - a server that stays, SIGSTOPped with server1 before the scale starts and never resumed;
// - the leaving server SIGKILLed with its data directory deleted (host loss).
// Each cell asserts the job's outcome: both trainers exit 0 with the loss and weights
// checksum of an undisturbed run within 1e-6 (no acknowledged push lost or applied twice),
// every server (but one lost for good) and the scheduler exit 0, and the scale-in either
// completed or was rolled back as the cell's test states.
// Every child is SIGKILLed by pid when a test ends; every wait has a deadline.
#include <signal.h>

#include <chrono>
#include <filesystem>
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

// How the scale-in ends, from the scheduler's log: done, or rolled back with a reason that
// starts with `who` (a member's label: its rank depends on the order of registration).
struct Ends {
  bool done = false;
  std::string who;
};
const Ends kDone{true, ""};
Ends RolledBack(const std::string& who) { return Ends{false, who}; }

constexpr int kLeaving = 1;

TrainJobOptions ScaleInJob() {
  TrainJobOptions o = FaultJob();
  o.data_dir = true;
  return o;
}

// Once trainer 0 printed step 8, pauses server1 (and the servers `paused_too`) and asks for
// its removal; returns when the scheduler is scaling in (held open: a paused server cannot
// have answered DONE).
Clock::time_point StartHeldScaleIn(TrainJob& job, Clock::time_point deadline, const std::vector<int>& paused_too = {}) {
  REQUIRE(job.WaitStep(8, deadline));
  job.servers[kLeaving]->Signal(SIGSTOP);
  for (int i : paused_too) job.servers[i]->Signal(SIGSTOP);
  const auto paused = Clock::now();
  pb::AdminRequest scale_in;
  scale_in.set_op("scale_in");
  scale_in.add_node_ids("server" + std::to_string(kLeaving));
  REQUIRE(AdminAsk(job.port, scale_in).has_value());
  std::optional<pb::AdminResponse> status = AdminAsk(job.port, "status");
  REQUIRE(status.has_value());
  INFO("last scale: " << status->last_scale_result() << "\nscheduler: " << job.scheduler.Log()
                      << "\ntrainer 0: " << job.trainers[0]->Log());
  REQUIRE(status->cluster_state() == pb::CLUSTER_SCALE_IN);
  return paused;
}

void RunScaleInFault(MidScaleFault fault, const Ends& expected) {
  TrainJobOptions o = ScaleInJob();
  o.state_dir = true;
  const std::vector<TrainFinal> plain = UndisturbedFinals(o);
  TrainJob job(o);
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 240s;
  const auto paused = StartHeldScaleIn(job, deadline);
  // A restarted member's new process registers before server1 runs again (Replace*).
  job.Strike(fault, deadline);
  if (fault.kind != MidScaleFault::kServerKill || fault.server != kLeaving) job.servers[kLeaving]->Signal(SIGCONT);
  const auto pause = Clock::now() - paused;
  INFO("server" << kLeaving << " paused for "
                << std::chrono::duration_cast<std::chrono::milliseconds>(pause).count() << " ms");
  if (fault.kind == MidScaleFault::kSchedulerStop) job.ResumeStalledScheduler();
  std::vector<TrainFinal> finals = job.RequireFinished(deadline);
  CheckSameFinals(plain, finals);
  std::string sched_log = job.scheduler.Log();
  if (fault.kind == MidScaleFault::kSchedulerKill) {
    // The restarted scheduler's log: it does not persist a scale's progress.
    sched_log = ReadFile(job.dir.File("scheduler.restarted.log"));
  }
  INFO(sched_log);
  if (expected.done) {
    CHECK_THAT(sched_log, Catch::Contains("scale operation done: 2 workers, 1 servers"));
  } else {
    CHECK_THAT(sched_log, Catch::Contains("scale operation rolled back: " + expected.who));
    CHECK_THAT(sched_log, Catch::Contains("restarted during scale-in"));
    CHECK_THAT(sched_log, !Catch::Contains("scale operation done"));
  }
}

enum class Loss { kStayingStopped, kLeavingHostLost };

// Replicas=2, 3 servers: one server is lost for good while the scale-in runs. The scheduler
// times it out and rolls the scale-in back; the metadata marks it down and its ranges'
// backups carry the job on.
void RunReplicatedScaleInLoss(Loss loss) {
  TrainJobOptions o = ScaleInJob();
  o.servers = 3;
  o.replicas = 2;
  const std::vector<TrainFinal> plain = UndisturbedFinals(o);
  TrainJob job(o);
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 240s;
  // The staying victim is paused before the scale starts: paused after, it may have
  // answered the scale's DONE already, and the scale would end before it goes silent.
  const int victim = loss == Loss::kStayingStopped ? 0 : kLeaving;
  StartHeldScaleIn(job, deadline, loss == Loss::kStayingStopped ? std::vector<int>{victim} : std::vector<int>{});
  if (loss == Loss::kStayingStopped) {
    job.servers[kLeaving]->Signal(SIGCONT);
  } else {
    job.KillServer(kLeaving);
    std::error_code ec;
    std::filesystem::remove_all(job.dir.File("server" + std::to_string(kLeaving) + ".data"), ec);
    REQUIRE(!ec);
  }
  std::vector<TrainFinal> finals = job.RequireFinished(deadline, /*except=*/{victim});
  CheckSameFinals(plain, finals);
  const std::string sched_log = job.scheduler.Log();
  INFO(sched_log);
  CHECK_THAT(sched_log, Catch::Contains("scale operation rolled back: server server" + std::to_string(victim) +
                                        " (rank "));
  CHECK_THAT(sched_log, Catch::Contains("timed out during scale-in"));
  job.servers[victim]->Kill();  // a stopped one is told nothing and would wait for good
}

}  // namespace

// No fault: worker rank 0 asks for the scale-in itself after a step's barrier, as
// `pscore-train --scale_in_at` does for an operator.
TEST_CASE("the demo scaled in mid-training (--scale_in_at) ends with the weights of the unscaled run, the "
          "leaving server exits 0",
          "[multiproc][net][demo][scale]") {
  TrainJobOptions o;
  o.steps = 30;
  o.trainer_flags = {"--scale_in_at=12"};
  const std::vector<TrainFinal> plain = UndisturbedFinals(o);
  TrainJob job(o);
  job.Start();
  INFO("logs in " << job.dir.path());
  std::vector<TrainFinal> finals = job.RequireFinished(Clock::now() + 240s);
  CheckSameFinals(plain, finals);
  // Rank 0 is whichever trainer registered first.
  const std::string trainer_logs = job.trainers[0]->Log() + job.trainers[1]->Log();
  INFO(trainer_logs);
  CHECK_THAT(trainer_logs, Catch::Contains("worker 0 asked for a scale-in to 1 servers"));
  const std::string sched_log = job.scheduler.Log();
  INFO(sched_log);
  CHECK_THAT(sched_log, Catch::Contains("scale operation done: 2 workers, 1 servers"));
}

TEST_CASE("during a scale-in: a worker SIGKILLed and restarted - the job ends as undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunScaleInFault({MidScaleFault::kTrainerKill}, RolledBack("worker worker1 (rank "));
}

TEST_CASE("during a scale-in: the scheduler SIGKILLed and restarted from --state_dir - the job ends as undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunScaleInFault({MidScaleFault::kSchedulerKill}, RolledBack("the scheduler"));
}

TEST_CASE("during a scale-in: the scheduler SIGSTOPped for 3 heartbeat timeouts, then SIGCONT - the job ends as "
          "undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunScaleInFault({MidScaleFault::kSchedulerStop}, kDone);
}

TEST_CASE("during a scale-in: the server that stays SIGKILLed and restarted from --data_dir - the job ends as "
          "undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunScaleInFault({MidScaleFault::kServerKill, 0}, RolledBack("server server0 (rank "));
}

TEST_CASE("during a scale-in: the leaving server SIGKILLed and restarted from --data_dir - the job ends as "
          "undisturbed",
          "[multiproc][net][demo][scale][control]") {
  RunScaleInFault({MidScaleFault::kServerKill, kLeaving}, RolledBack("server server1 (rank "));
}

TEST_CASE("replicas=2 during a scale-in: a server that stays SIGSTOPped and never resumed - the job ends as "
          "undisturbed",
          "[multiproc][net][demo][scale][replication]") {
  RunReplicatedScaleInLoss(Loss::kStayingStopped);
}

TEST_CASE("replicas=2 during a scale-in: the leaving server SIGKILLed with its data directory deleted - the job ends "
          "as undisturbed",
          "[multiproc][net][demo][scale][replication]") {
  RunReplicatedScaleInLoss(Loss::kLeavingHostLost);
}

}  // namespace pscore::testing
