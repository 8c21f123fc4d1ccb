// Fault-matrix cells of the demo job scaling out with --replicas=2 (real pscore-node and
// pscore-train processes, tests/multiproc/train_job.h; docs/reliability.md, "Fault
// matrix"): worker rank 0 asks for a third server at step 10, and once the scheduler is
// scaling one of the two servers is lost before the test starts the new one:
// - SIGSTOPped and never resumed (its sockets stay open; it is SIGKILLed by pid when the
//   test ends);
// - SIGKILLed with its data directory deleted (host loss), never restarted.
// The scheduler times the server out and rolls the scale-out back; the metadata marks the
// server down and its ranges' backups, promoted, carry the job on. Each cell asserts the
// job's outcome: both trainers exit 0 with the loss and weights checksum of an undisturbed
// run within 1e-6 (no acknowledged push lost or applied twice), the surviving server and
// the scheduler exit 0, and the server started for the scale-out, dropped by the rollback,
// exits with the job.
// Every child is SIGKILLed by pid when a test ends; every wait has a deadline.
#include <signal.h>

#include <chrono>
#include <filesystem>
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

enum class Loss { kStopped, kHostLost };

void RunReplicatedScaleLoss(Loss loss) {
  TrainJobOptions o = FaultJob();
  o.replicas = 2;
  o.data_dir = true;
  o.trainer_flags = {"--scale_out_at=10"};
  const std::vector<TrainFinal> plain = UndisturbedFinals(o);
  TrainJob job(o);
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 240s;
  REQUIRE(WaitState(job.port, pb::CLUSTER_SCALE_OUT, deadline));
  constexpr int kVictim = 1;
  if (loss == Loss::kStopped) {
    job.servers[kVictim]->Signal(SIGSTOP);
  } else {
    job.KillServer(kVictim);
    std::error_code ec;
    std::filesystem::remove_all(job.dir.File("server" + std::to_string(kVictim) + ".data"), ec);
    REQUIRE(!ec);
  }
  job.StartServer(2, "");
  CheckSameFinals(plain, job.RequireTrainersDone(deadline));
  INFO(job.scheduler.Log());
  CHECK(job.scheduler.Wait(60s) == std::optional<int>(0));
  CHECK_THAT(job.scheduler.Log(), Catch::Contains("scale operation rolled back: server server1 (rank "));
  {
    INFO("server 0: " << job.servers[0]->Log());
    CHECK(job.servers[0]->Wait(60s) == std::optional<int>(0));
  }
  // Dropped by the rollback, the added server leaves with the job: refused at once when it
  // registers after the rollback (non-zero), else told that the job ended (0).
  INFO("server 2: " << job.servers[2]->Log());
  CHECK(job.servers[2]->Wait(60s).has_value());
  job.servers[kVictim]->Kill();  // stopped: told nothing, it would wait for good
}

}  // namespace

TEST_CASE("replicas=2 during a scale-out: a server SIGSTOPped and never resumed - the job ends as undisturbed",
          "[multiproc][net][demo][scale][replication][failover]") {
  RunReplicatedScaleLoss(Loss::kStopped);
}

TEST_CASE("replicas=2 during a scale-out: a server SIGKILLed with its data directory deleted - the job ends as "
          "undisturbed",
          "[multiproc][net][demo][scale][replication]") {
  RunReplicatedScaleLoss(Loss::kHostLost);
}

}  // namespace pscore::testing
