// The demo job (tests/multiproc/train_job.h) left with the default scale and request
// timeouts: worker rank 0 asks for a third server at step 10 and none is ever started.
// The scale-out holds every push and pull until the scheduler's --scale_timeout_ms rolls it
// back; the defaults must release those calls before the workers' --request_timeout_ms
// fails them, so the job ends as undisturbed. Every child is SIGKILLed by pid when the test
// ends; every wait has a deadline.
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

TEST_CASE("with the default timeouts, a scale-out whose new server never starts rolls back before the held calls "
          "fail - the job ends as undisturbed",
          "[multiproc][net][demo][scale]") {
  TrainJobOptions o = FaultJob();
  o.trainer_flags = {"--scale_out_at=10"};  // and no --scale_timeout_ms, --request_timeout_ms
  const std::vector<TrainFinal> plain = UndisturbedFinals(o);
  TrainJob job(o);
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 240s;
  REQUIRE(WaitState(job.port, pb::CLUSTER_SCALE_OUT, deadline));
  const auto held = Clock::now();
  CheckSameFinals(plain, job.RequireTrainersDone(deadline));
  INFO("the trainers ended " << std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - held).count()
                             << " s after the scale-out began");
  INFO(job.scheduler.Log());
  CHECK(job.scheduler.Wait(60s) == std::optional<int>(0));
  for (size_t i = 0; i < job.servers.size(); ++i) {
    INFO("server " << i << ": " << job.servers[i]->Log());
    CHECK(job.servers[i]->Wait(60s) == std::optional<int>(0));
  }
  CHECK_THAT(job.scheduler.Log(), Catch::Contains("scale operation rolled back: scale-out timed out after 30000 ms"));
  for (auto& t : job.trainers) CHECK_THAT(t->Log(), !Catch::Contains("held past its deadline"));
}

}  // namespace
}  // namespace pscore::testing
