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
#include <cmath>
#include <cstdlib>
#include <filesystem>
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

constexpr int kSteps = 40;
constexpr int kRecoveryMs = 4000;
const std::vector<std::string> kTiming = {"--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=3000",
                                          "--connect_timeout_ms=10000"};

std::vector<std::string> With(std::vector<std::string> args) {
  args.insert(args.end(), kTiming.begin(), kTiming.end());
  return args;
}

using Final = testing::TrainFinal;
constexpr auto ParseFinal = testing::ParseTrainFinal;

enum class Fault { kNone, kKillRestart, kKillGone };

struct Job {
  TempDir dir;
  Process scheduler;
  std::vector<std::unique_ptr<Process>> servers;
  std::vector<std::unique_ptr<Process>> trainers;
  int port = 0;

  std::vector<std::string> ServerArgv(int i) {
    const std::string id = "server" + std::to_string(i);
    return With({NodeBinary(), "--role=server", "--node_id=" + id, "--scheduler_port=" + std::to_string(port),
                 "--update_rule=sgd", "--learning_rate=2", "--data_dir=" + dir.File(id + ".data")});
  }
  void Start() {
    REQUIRE(dir.ok());
    REQUIRE(scheduler.Start(With({NodeBinary(), "--role=scheduler", "--recoverable_roles=worker,server", "--worker_num=2", "--server_num=2",
                                  "--scheduler_port=0", "--port_file=" + dir.File("sched.port")}),
                            dir.File("scheduler.log")));
    port = ReadPortFile(dir.File("sched.port"), 10s);
    REQUIRE(port > 0);
    for (int i = 0; i < 2; ++i) {
      servers.push_back(std::make_unique<Process>());
      REQUIRE(servers.back()->Start(ServerArgv(i), dir.File("server" + std::to_string(i) + ".log")));
    }
    for (int i = 0; i < 2; ++i) {
      trainers.push_back(std::make_unique<Process>());
      REQUIRE(trainers.back()->Start(
          With({std::string(PSCORE_BIN_DIR) + "/pscore-train", "--node_id=worker" + std::to_string(i),
                "--scheduler_port=" + std::to_string(port), "--steps=" + std::to_string(kSteps),
                "--recovery_timeout_ms=" + std::to_string(kRecoveryMs)}),
          dir.File("worker" + std::to_string(i) + ".log")));
    }
  }
  // Waits until trainer 0 printed step `step` (false at the deadline or if it exited).
  bool WaitStep(int step, Clock::time_point deadline) {
    char want[32];
    std::snprintf(want, sizeof want, "step %3d ", step);
    while (Clock::now() < deadline && trainers[0]->running()) {
      if (trainers[0]->Log().find(want) != std::string::npos) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

std::vector<Final> RunJob(Fault fault) {
  Job job;
  job.Start();
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 150s;
  if (fault != Fault::kNone) {
    REQUIRE(job.WaitStep(kSteps / 2, deadline));
    job.servers[1]->Signal(SIGKILL);
    REQUIRE(job.servers[1]->Wait(10s).has_value());
    if (fault == Fault::kKillRestart) {
      job.servers[1] = std::make_unique<Process>();
      REQUIRE(job.servers[1]->Start(job.ServerArgv(1), job.dir.File("server1.restarted.log")));
    } else {
      std::filesystem::remove_all(job.dir.File("server1.data"));
    }
  }
  std::vector<Final> finals;
  int named = 0;  // trainers whose error names the lost server
  const auto killed_at = Clock::now();
  for (auto& t : job.trainers) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    std::optional<int> code = t->Wait(fault == Fault::kKillGone ? std::chrono::milliseconds(kRecoveryMs) + 30s : left);
    const std::string log = t->Log();
    INFO(log);
    REQUIRE(code.has_value());
    if (fault == Fault::kKillGone) {
      CHECK(*code != 0);
      // The part's retries end at recovery_timeout; the message names the server and the
      // tries. A trainer that was waiting in a barrier for the other one instead fails
      // there, once the scheduler has timed out the trainer that exited.
      const bool names_server = log.find("server server1 (127.0.0.1:") != std::string::npos &&
                                log.find("recovery_timeout " + std::to_string(kRecoveryMs) + " ms") != std::string::npos;
      named += names_server;
      CHECK((names_server || log.find("pscore-train: worker ") != std::string::npos));
      continue;
    }
    CHECK(*code == 0);
    finals.push_back(ParseFinal(log));
    REQUIRE(finals.back().found);
  }
  if (fault == Fault::kKillGone) {
    CHECK(named >= 1);
    INFO("trainers ended " << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed_at).count()
                           << " ms after the kill");
    return finals;
  }
  for (auto& s : job.servers) {
    INFO(s->Log());
    CHECK(s->Wait(30s) == std::optional<int>(0));
  }
  CHECK(job.scheduler.Wait(30s) == std::optional<int>(0));
  if (fault == Fault::kKillRestart) CHECK_THAT(job.servers[1]->Log(), Catch::Contains("keys restored"));
  return finals;
}

}  // namespace

TEST_CASE("the demo job with a server SIGKILLed mid-training and restarted from its --data_dir ends as undisturbed",
          "[multiproc][net][demo][retry]") {
  std::vector<Final> plain = RunJob(Fault::kNone);
  REQUIRE(plain.size() == 2);
  std::vector<Final> restarted = RunJob(Fault::kKillRestart);
  REQUIRE(restarted.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    INFO("trainer " << i << ": loss " << plain[i].loss << " vs " << restarted[i].loss << ", checksum "
                    << plain[i].checksum << " vs " << restarted[i].checksum);
    CHECK(std::fabs(plain[i].loss - restarted[i].loss) <= 1e-6);
    CHECK(std::fabs(plain[i].checksum - restarted[i].checksum) <= 1e-6);
  }
}

TEST_CASE("the demo job with a server SIGKILLed for good - its data deleted - ends the trainers non-zero naming it",
          "[multiproc][net][demo][retry]") {
  RunJob(Fault::kKillGone);
}

}  // namespace pscore::testing
