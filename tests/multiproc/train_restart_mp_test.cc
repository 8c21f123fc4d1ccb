// The demo job (pscore-node scheduler, 2 sgd servers with --data_dir, 2 pscore-train
// workers, all real processes) survives a server SIGKILLed mid-training and restarted with
// its --data_dir (on a new port): every process exits 0 and synchronous SGD ends with the
// weights of an undisturbed run (loss and weights checksum within 1e-6: the servers' float
// additions may only differ in their order). A server killed for good, its data directory
// deleted and never restarted, ends the trainers non-zero within their recovery timeout
// (after the dial that found it gone, at most --connect_timeout_ms), the first to meet the
// loss with a message naming the server. Every child is SIGKILLed by pid when a test ends.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "multiproc/train_job.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = TrainJob::Clock;

constexpr int kRecoveryMs = 4000;

TrainJobOptions RestartJob() {
  TrainJobOptions o;
  o.steps = 40;
  o.heartbeat_timeout_ms = 3000;
  o.connect_timeout_ms = 10000;
  o.recovery_timeout_ms = kRecoveryMs;
  o.data_dir = true;
  return o;
}

enum class Fault { kKillRestart, kKillGone };

std::vector<TrainFinal> RunJob(Fault fault) {
  TrainJob job(RestartJob());
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 150s;
  REQUIRE(job.WaitStep(job.options().steps / 2, deadline));
  job.KillServer(1);
  if (fault == Fault::kKillRestart) {
    job.StartServer(1, ".restarted");  // on a new port, with its --data_dir
    std::vector<TrainFinal> finals = job.RequireFinished(deadline, {}, 30s);
    CHECK_THAT(job.servers[1]->Log(), Catch::Contains("keys restored"));
    return finals;
  }
  std::filesystem::remove_all(job.dir.File("server1.data"));
  const auto killed_at = Clock::now();
  TrainJob::Outcome out = job.WaitTrainers(killed_at + std::chrono::milliseconds(kRecoveryMs) + 30s);
  int named = 0;  // trainers whose error names the lost server
  for (size_t i = 0; i < out.codes.size(); ++i) {
    INFO(out.logs[i]);
    REQUIRE(out.codes[i].has_value());
    CHECK(*out.codes[i] != 0);
    // The part's retries end at recovery_timeout; the message names the server and the
    // tries. A trainer that was waiting in a barrier for the other one instead fails
    // there, once the scheduler has timed out the trainer that exited.
    const bool names_server = out.logs[i].find("server server1 (127.0.0.1:") != std::string::npos &&
                              out.logs[i].find("recovery_timeout " + std::to_string(kRecoveryMs) + " ms") !=
                                  std::string::npos;
    named += names_server;
    CHECK((names_server || out.logs[i].find("pscore-train: worker ") != std::string::npos));
  }
  CHECK(named >= 1);
  INFO("trainers ended " << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed_at).count()
                         << " ms after the kill");
  return {};
}

}  // namespace

TEST_CASE("the demo job with a server SIGKILLed mid-training and restarted from its --data_dir ends as undisturbed",
          "[multiproc][net][demo][retry]") {
  const std::vector<TrainFinal> plain = UndisturbedFinals(RestartJob());
  CheckSameFinals(plain, RunJob(Fault::kKillRestart));
}

TEST_CASE("the demo job with a server SIGKILLed for good - its data deleted - ends the trainers non-zero naming it",
          "[multiproc][net][demo][retry]") {
  RunJob(Fault::kKillGone);
}

}  // namespace pscore::testing
