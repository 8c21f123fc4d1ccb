// Server replication with real processes (docs/reliability.md): the demo job (pscore-node
// scheduler with --replicas=2, 2 sgd servers with --data_dir, 2 pscore-train workers)
// loses a server for good mid-training - SIGKILLed, its data directory deleted, never
// restarted - and still ends as an undisturbed run: every trainer, the surviving server and
// the scheduler exit 0, and synchronous SGD ends with the same weights (loss and weights
// checksum within 1e-6: the servers' float additions may only differ in their order), so
// no acknowledged push was lost. The same when the lost server is restarted empty and
// rebuilt from its ranges' primaries while the job runs (it resyncs), and then the other
// server is SIGKILLed: the rebuilt copy alone carries the job to the same weights; and when
// the job scales out to 3 servers first (every new range's chain filled) and then loses a
// server; and when a server's disk fills for good (a file size limit of 1 byte set on it):
// it steps down (exit 1) at its first refused journal write. Every child is SIGKILLed by
// pid when a test ends.
#include <signal.h>
#include <sys/resource.h>

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
const std::vector<std::string> kTiming = {"--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=3000",
                                          "--connect_timeout_ms=10000"};

std::vector<std::string> With(std::vector<std::string> args) {
  args.insert(args.end(), kTiming.begin(), kTiming.end());
  return args;
}

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
  void Start(const std::vector<std::string>& trainer_extra = {}) {
    REQUIRE(dir.ok());
    REQUIRE(scheduler.Start(With({NodeBinary(), "--role=scheduler", "--worker_num=2", "--server_num=2",
                                  "--replicas=2", "--recoverable_roles=server", "--scheduler_port=0",
                                  "--port_file=" + dir.File("sched.port")}),
                            dir.File("scheduler.log")));
    port = ReadPortFile(dir.File("sched.port"), 10s);
    REQUIRE(port > 0);
    for (int i = 0; i < 2; ++i) {
      servers.push_back(std::make_unique<Process>());
      REQUIRE(servers.back()->Start(ServerArgv(i), dir.File("server" + std::to_string(i) + ".log")));
    }
    for (int i = 0; i < 2; ++i) {
      trainers.push_back(std::make_unique<Process>());
      // The recovery timeout spans the scheduler's heartbeat timeout with room to spare:
      // a push meets the lost server until the new epoch marks it down.
      std::vector<std::string> argv = {std::string(PSCORE_BIN_DIR) + "/pscore-train", "--node_id=worker" + std::to_string(i),
                                       "--scheduler_port=" + std::to_string(port), "--steps=" + std::to_string(kSteps),
                                       "--recovery_timeout_ms=30000"};
      argv.insert(argv.end(), trainer_extra.begin(), trainer_extra.end());
      REQUIRE(trainers.back()->Start(With(argv), dir.File("worker" + std::to_string(i) + ".log")));
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

enum class Fault {
  kNone,
  kLost,     // `victim` SIGKILLed at step kSteps/2, its data directory deleted
  kRebuilt,  // the same, restarted empty and rebuilt; then the other server SIGKILLed
  kScaled,   // a scale-out to 3 servers at step kSteps/4, then `victim` lost as in kLost
  kDiskFull,  // `victim`'s disk full for good at step kSteps/2 (no file of it grows): it steps down
};

// Waits until the scheduler's log holds `line` (false at the deadline).
bool WaitSchedulerLog(Job& job, const std::string& line, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    if (job.scheduler.Log().find(line) != std::string::npos) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

void KillServer(Job& job, int i) {
  REQUIRE(job.servers[i]->running());
  job.servers[i]->Signal(SIGKILL);
  REQUIRE(job.servers[i]->Wait(10s).has_value());
  std::filesystem::remove_all(job.dir.File("server" + std::to_string(i) + ".data"));
}

// Restarts server `victim` empty while the trainers push, waits until the scheduler has
// it as a replica again (its ranges copied), then loses the other server. Trainer 1 is
// held (SIGSTOP, well under the heartbeat timeout) from a few steps after the restart to
// the second kill, so that the job is still running when it comes.
void RebuildThenLoseOther(Job& job, int victim, Clock::time_point deadline) {
  REQUIRE(job.servers[victim]->Start(job.ServerArgv(victim), job.dir.File("server" + std::to_string(victim) + ".log")));
  REQUIRE(job.WaitStep(kSteps / 2 + 3, deadline));
  job.trainers[1]->Signal(SIGSTOP);
  const std::string done = "server" + std::to_string(victim) + " (rank ";
  bool resynced = false;
  const auto until = std::min(deadline, Clock::now() + 20s);
  while (!resynced && Clock::now() < until) {
    const std::string log = job.scheduler.Log();
    for (size_t at = log.find(done); at != std::string::npos && !resynced; at = log.find(done, at + 1)) {
      const size_t eol = log.find('\n', at);
      resynced = log.substr(at, eol - at).find("resynced: a replica of its key ranges again") != std::string::npos;
    }
    if (!resynced) std::this_thread::sleep_for(10ms);
  }
  REQUIRE(resynced);
  REQUIRE(job.trainers[0]->running());
  KillServer(job, 1 - victim);
  job.trainers[1]->Signal(SIGCONT);
}

// Runs the job with `fault` on server `victim`.
std::vector<TrainFinal> RunJob(Fault fault, int victim) {
  Job job;
  if (fault == Fault::kScaled) {
    job.Start({"--scale_out_at=" + std::to_string(kSteps / 4)});
  } else {
    job.Start();
  }
  INFO("logs in " << job.dir.path());
  const auto deadline = Clock::now() + 240s;
  const bool kill = fault != Fault::kNone;
  if (fault == Fault::kScaled) {
    // Trainer 0 asks for a third server; it joins, and every new range's chain is filled
    // before the scale ends. Then a server is lost as in kLost.
    REQUIRE(WaitSchedulerLog(job, "scale-out started: workers 2 -> 2, servers 2 -> 3", deadline));
    job.servers.push_back(std::make_unique<Process>());
    REQUIRE(job.servers.back()->Start(job.ServerArgv(2), job.dir.File("server2.log")));
    REQUIRE(WaitSchedulerLog(job, "scale operation done: 2 workers, 3 servers", deadline));
  }
  if (fault == Fault::kDiskFull) {
    REQUIRE(job.WaitStep(kSteps / 2, deadline));
    rlimit full = {};
    REQUIRE(::prlimit(job.servers[victim]->pid(), RLIMIT_FSIZE, nullptr, &full) == 0);
    full.rlim_cur = 1;
    REQUIRE(::prlimit(job.servers[victim]->pid(), RLIMIT_FSIZE, &full, nullptr) == 0);
  } else if (kill) {
    REQUIRE(job.WaitStep(kSteps / 2, deadline));
    KillServer(job, victim);
  }
  if (fault == Fault::kRebuilt) RebuildThenLoseOther(job, victim, deadline);
  const int gone = fault == Fault::kRebuilt ? 1 - victim : victim;
  std::vector<TrainFinal> finals;
  for (auto& t : job.trainers) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    std::optional<int> code = t->Wait(std::max(left, std::chrono::milliseconds(1000)));
    const std::string log = t->Log();
    INFO(log);
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    finals.push_back(ParseTrainFinal(log));
    REQUIRE(finals.back().found);
  }
  if (fault == Fault::kDiskFull) {
    // It left on its own at its first refused write (exit 1; its log cannot grow either).
    CHECK(job.servers[victim]->Wait(60s) == std::optional<int>(1));
  }
  for (size_t i = 0; i < job.servers.size(); ++i) {
    if (kill && static_cast<int>(i) == gone) continue;
    INFO(job.servers[i]->Log());
    CHECK(job.servers[i]->Wait(60s) == std::optional<int>(0));
  }
  INFO(job.scheduler.Log());
  CHECK(job.scheduler.Wait(60s) == std::optional<int>(0));
  if (kill) {
    // The kill landed while the job ran: the scheduler timed the server out before every
    // node had finished.
    const std::string log = job.scheduler.Log();
    const size_t lost = log.find("scheduler: server server" + std::to_string(gone) + " (rank ");
    const size_t ended = log.find("every node finished");
    CHECK(lost != std::string::npos);
    CHECK(ended != std::string::npos);
    CHECK(lost < ended);
  }
  return finals;
}

void Compare(const std::vector<TrainFinal>& plain, const std::vector<TrainFinal>& disturbed) {
  REQUIRE(plain.size() == 2);
  REQUIRE(disturbed.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    INFO("trainer " << i << ": loss " << plain[i].loss << " vs " << disturbed[i].loss << ", checksum "
                    << plain[i].checksum << " vs " << disturbed[i].checksum);
    CHECK(std::fabs(plain[i].loss - disturbed[i].loss) <= 1e-6);
    CHECK(std::fabs(plain[i].checksum - disturbed[i].checksum) <= 1e-6);
  }
}

}  // namespace

TEST_CASE("replicas=2: the demo job with a server SIGKILLed for good - its data deleted - ends as undisturbed",
          "[multiproc][net][demo][replication][tlspass]") {
  std::vector<TrainFinal> plain = RunJob(Fault::kNone, 0);
  // Either server: rank order of arrival is free, so both the primary of range 0 and of
  // range 1 are lost in one of the two runs.
  for (int victim : {0, 1}) {
    INFO("server" << victim << " killed");
    Compare(plain, RunJob(Fault::kLost, victim));
  }
}

TEST_CASE("replicas=2: the demo job with a server's disk full for good mid-training ends as undisturbed - the server "
          "steps down",
          "[multiproc][net][demo][replication][journal]") {
  std::vector<TrainFinal> plain = RunJob(Fault::kNone, 0);
  for (int victim : {0, 1}) {
    INFO("server" << victim << "'s disk full");
    Compare(plain, RunJob(Fault::kDiskFull, victim));
  }
}

TEST_CASE("replicas=2: the demo job scaled out to 3 servers, then a server SIGKILLed with its data, ends as undisturbed",
          "[multiproc][net][demo][replication][scale]") {
  std::vector<TrainFinal> plain = RunJob(Fault::kNone, 0);
  Compare(plain, RunJob(Fault::kScaled, 1));
}

TEST_CASE("replicas=2: a server SIGKILLed, its data deleted, restarted empty and rebuilt, then the other one "
          "SIGKILLed - the demo job ends as undisturbed",
          "[multiproc][net][demo][replication][resync]") {
  std::vector<TrainFinal> plain = RunJob(Fault::kNone, 0);
  for (int victim : {0, 1}) {
    INFO("server" << victim << " rebuilt, then server" << 1 - victim << " killed");
    Compare(plain, RunJob(Fault::kRebuilt, victim));
  }
}

}  // namespace pscore::testing
