// Failover of requests in flight to a silent server, with real processes
// (docs/reliability.md, "Requests in flight to a silent server"): the demo job with
// --replicas=2 has a server SIGSTOPped - not killed: its sockets stay open, nothing
// answers - while the trainers push, and kept stopped until the job has ended. The
// scheduler times it out and marks it down; the trainers' parts in flight to it go to the
// promoted replica at once instead of waiting out the 60 s request timeout, so the job
// finishes with exit 0 and the weights of an undisturbed run well within that timeout.
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include "multiproc/train_job.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = TrainJob::Clock;

// The worker library's request timeout (NodeOptions::request_timeout; pscore-train has no
// flag for it). A part that waited it out would end the job later than this.
constexpr auto kRequestTimeout = 60s;

TrainJobOptions ReplicatedJob() {
  TrainJobOptions o;
  o.replicas = 2;
  o.steps = 30;
  o.heartbeat_timeout_ms = 3000;
  o.recovery_timeout_ms = 30000;
  return o;
}

}  // namespace

TEST_CASE("replicas=2: the demo job with a server SIGSTOPped during pushes and never resumed ends as undisturbed "
          "within the request timeout",
          "[multiproc][net][demo][replication][failover]") {
  const TrainJobOptions o = ReplicatedJob();
  const std::vector<TrainFinal> plain = UndisturbedFinals(o);
  for (int victim : {0, 1}) {
    TrainJob job(o);
    job.Start();
    INFO("server" << victim << " stopped; logs in " << job.dir.path());
    // Late in the job: what is left after the failover is short even under sanitizers.
    REQUIRE(job.WaitStep(2 * o.steps / 3, Clock::now() + 120s));
    REQUIRE(job.servers[victim]->running());
    job.servers[victim]->Signal(SIGSTOP);
    const auto stopped_at = Clock::now();
    // From the stop: the heartbeat timeout, one metadata fetch, the failover and the rest
    // of the job (1/3 of its steps). Below the request timeout, generous for sanitizers.
    const auto deadline = stopped_at + kRequestTimeout - 5s;
    const std::vector<TrainFinal> finals = job.RequireTrainersDone(deadline);
    const double took = std::chrono::duration<double>(Clock::now() - stopped_at).count();
    CheckSameFinals(plain, finals);
    // The survivors end as a finished job; the stopped server is told nothing until it
    // runs again, so it is resumed and then ended by the test.
    const int other = 1 - victim;
    INFO(job.servers[other]->Log());
    CHECK(job.servers[other]->Wait(60s) == std::optional<int>(0));
    INFO(job.scheduler.Log());
    CHECK(job.scheduler.Wait(60s) == std::optional<int>(0));
    CHECK_THAT(job.scheduler.Log(), Catch::Contains("scheduler: server server" + std::to_string(victim) + " (rank "));
    job.servers[victim]->Signal(SIGCONT);
    job.servers[victim]->Kill();
    WARN("server" << victim << " stopped: the trainers finished " << took << " s later");
  }
}

}  // namespace pscore::testing
