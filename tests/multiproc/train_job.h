// The demo job with real processes, for fault tests: a pscore-node scheduler, sgd servers
// (pscore-node) and pscore-train workers, each with its argv kept so a test can restart it;
// waiting for a trainer's step; the trainers' outcome; and the comparison with an
// undisturbed run of the same job (loss and weights checksum within 1e-6: the servers'
// float additions may only differ in their order). Every child is SIGKILLed by pid when
// the job is destroyed (Process); every wait has a deadline.
#pragma once

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "pscore/core/state_file.h"
#include "multiproc/process.h"
#include "multiproc/train_log.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {

struct TrainJobOptions {
  int workers = 2;
  int servers = 2;
  int replicas = 1;
  int steps = 30;
  int heartbeat_interval_ms = 200;
  int heartbeat_timeout_ms = 3000;
  int connect_timeout_ms = 10000;
  int recovery_timeout_ms = 30000;
  bool state_dir = false;  // scheduler --state_dir (restartable)
  bool data_dir = false;   // servers --data_dir (restartable with their parameters)
  bool recoverable = true;  // --recoverable_roles=worker,server
  std::vector<std::string> trainer_flags;  // e.g. --scale_out_at=10
  std::vector<std::string> scheduler_flags;
};

// The demo job as the fault cells run it: connect and recovery timeouts (20 s, 40 s) with
// room for a restarted scheduler or server under load. Callers add directories and flags.
inline TrainJobOptions FaultJob() {
  TrainJobOptions o;
  o.connect_timeout_ms = 20000;
  o.recovery_timeout_ms = 40000;
  return o;
}

// One fault struck while a scale is under way (the scale cells of the fault matrix).
struct MidScaleFault {
  enum Kind { kTrainerKill, kSchedulerKill, kSchedulerStop, kServerKill };
  Kind kind;
  int server = 0;  // kServerKill: which server
};

class TrainJob {
 public:
  using Clock = std::chrono::steady_clock;

  explicit TrainJob(TrainJobOptions o) : o_(std::move(o)) {}

  const TrainJobOptions& options() const { return o_; }
  TempDir dir;
  Process scheduler;
  std::vector<std::unique_ptr<Process>> servers;
  std::vector<std::unique_ptr<Process>> trainers;
  int port = 0;

  std::vector<std::string> Timing() const {
    return {"--heartbeat_interval_ms=" + std::to_string(o_.heartbeat_interval_ms),
            "--heartbeat_timeout_ms=" + std::to_string(o_.heartbeat_timeout_ms),
            "--connect_timeout_ms=" + std::to_string(o_.connect_timeout_ms),
            "--recovery_timeout_ms=" + std::to_string(o_.recovery_timeout_ms)};
  }
  // With port 0 the scheduler picks a free one (written to sched.port).
  std::vector<std::string> SchedulerArgv(int p) const {
    std::vector<std::string> a = {NodeBinary(), "--role=scheduler", "--worker_num=" + std::to_string(o_.workers),
                                  "--server_num=" + std::to_string(o_.servers),
                                  "--replicas=" + std::to_string(o_.replicas),
                                  "--scheduler_port=" + std::to_string(p), "--port_file=" + dir.File("sched.port")};
    if (o_.recoverable) a.push_back("--recoverable_roles=worker,server");
    if (o_.state_dir) a.push_back("--state_dir=" + dir.File("state"));
    a.insert(a.end(), o_.scheduler_flags.begin(), o_.scheduler_flags.end());
    return Append(a, Timing());
  }
  std::vector<std::string> ServerArgv(int i) const {
    const std::string id = "server" + std::to_string(i);
    std::vector<std::string> a = {NodeBinary(), "--role=server", "--node_id=" + id,
                                  "--scheduler_port=" + std::to_string(port), "--update_rule=sgd",
                                  "--learning_rate=2"};
    if (o_.data_dir) a.push_back("--data_dir=" + dir.File(id + ".data"));
    return Append(a, Timing());
  }
  std::vector<std::string> TrainerArgv(int i) const {
    std::vector<std::string> a = {std::string(PSCORE_BIN_DIR) + "/pscore-train", "--node_id=worker" + std::to_string(i),
                                  "--scheduler_port=" + std::to_string(port), "--steps=" + std::to_string(o_.steps)};
    a.insert(a.end(), o_.trainer_flags.begin(), o_.trainer_flags.end());
    return Append(a, Timing());
  }

  void Start() {
    REQUIRE(dir.ok());
    REQUIRE(scheduler.Start(SchedulerArgv(0), dir.File("scheduler.log")));
    port = ReadPortFile(dir.File("sched.port"), std::chrono::seconds(20));
    REQUIRE(port > 0);
    for (int i = 0; i < o_.servers; ++i) StartServer(i, "");
    for (int i = 0; i < o_.workers; ++i) {
      trainers.push_back(std::make_unique<Process>());
      REQUIRE(trainers.back()->Start(TrainerArgv(i), dir.File("worker" + std::to_string(i) + ".log")));
    }
  }
  // A server `server<i>` (a new one when i == servers.size()); `tag` names its log.
  void StartServer(int i, const std::string& tag) {
    if (i == static_cast<int>(servers.size())) servers.push_back(nullptr);
    servers[i] = std::make_unique<Process>();
    REQUIRE(servers[i]->Start(ServerArgv(i), dir.File("server" + std::to_string(i) + tag + ".log")));
  }

  // Waits until trainer `t` printed step `step` (false at the deadline or if it exited).
  bool WaitStep(int step, Clock::time_point deadline, int t = 0) {
    char want[32];
    std::snprintf(want, sizeof want, "step %3d ", step);
    while (Clock::now() < deadline && trainers[t]->running()) {
      if (trainers[t]->Log().find(want) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  // Waits until `log_of()` contains `text` (false at the deadline).
  template <typename LogOf>
  static bool WaitLog(LogOf log_of, const std::string& text, Clock::time_point deadline) {
    while (Clock::now() < deadline) {
      if (log_of().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  // Waits until the scheduler's state file (--state_dir) records a scale operation under
  // way, so that a restart finds it (the file is written off the loop thread, a moment
  // after the change). False at the deadline.
  bool WaitStateHoldsScale(Clock::time_point deadline) const {
    while (Clock::now() < deadline) {
      Result<pb::PersistedState> st = core::ParseState(ReadFile(dir.File("state/scheduler.state")));
      if (st.ok() && st->has_scale()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  void KillScheduler() {
    scheduler.Signal(SIGKILL);
    REQUIRE(scheduler.Wait(std::chrono::seconds(20)).has_value());
  }
  // On its port, from its --state_dir.
  void RestartScheduler(const std::string& tag = ".restarted") {
    REQUIRE(scheduler.Start(SchedulerArgv(port), dir.File("scheduler" + tag + ".log")));
  }
  // During a scale: once the state file records it, SIGKILLs the scheduler and restarts it
  // (which then finds the scale under way and rolls it back).
  void ReplaceSchedulerMidScale(Clock::time_point deadline) {
    REQUIRE(WaitStateHoldsScale(deadline));
    KillScheduler();
    RestartScheduler();
  }
  void KillTrainer(int i) {
    trainers[i]->Signal(SIGKILL);
    REQUIRE(trainers[i]->Wait(std::chrono::seconds(20)).has_value());
  }
  // With its node id: it resumes its step.
  void RestartTrainer(int i, const std::string& tag = ".restarted") {
    trainers[i] = std::make_unique<Process>();
    REQUIRE(trainers[i]->Start(TrainerArgv(i), dir.File("worker" + std::to_string(i) + tag + ".log")));
  }
  void KillServer(int i) {
    servers[i]->Signal(SIGKILL);
    REQUIRE(servers[i]->Wait(std::chrono::seconds(20)).has_value());
  }
  // Waits until the scheduler admitted a new process of member `id` (false at the deadline).
  bool WaitRestarted(const std::string& id, Clock::time_point deadline) {
    return WaitLog([this] { return scheduler.Log(); }, "scheduler: " + id + " restarted (new incarnation)", deadline);
  }
  // SIGKILLs trainer / server i, starts it again with its node id (a server from its
  // --data_dir), and returns once the scheduler admitted the new process.
  void ReplaceTrainer(int i, Clock::time_point deadline) {
    KillTrainer(i);
    RestartTrainer(i);
    REQUIRE(WaitRestarted("worker" + std::to_string(i), deadline));
  }
  void ReplaceServer(int i, Clock::time_point deadline) {
    KillServer(i);
    StartServer(i, ".restarted");
    REQUIRE(WaitRestarted("server" + std::to_string(i), deadline));
  }
  // Strikes `f`: trainer 1 or the server SIGKILLed and replaced (Replace*), the scheduler
  // SIGKILLed and restarted once its state file holds the scale, or the scheduler SIGSTOPped
  // (ResumeStalledScheduler sends the SIGCONT).
  void Strike(MidScaleFault f, Clock::time_point deadline) {
    switch (f.kind) {
      case MidScaleFault::kTrainerKill:
        ReplaceTrainer(1, deadline);
        break;
      case MidScaleFault::kSchedulerKill:
        ReplaceSchedulerMidScale(deadline);
        break;
      case MidScaleFault::kSchedulerStop:
        scheduler.Signal(SIGSTOP);
        break;
      case MidScaleFault::kServerKill:
        ReplaceServer(f.server, deadline);
        break;
    }
  }
  // After 3 heartbeat timeouts of a SIGSTOPped scheduler, SIGCONT: it then sees its own
  // stall and counts it against no heartbeat and not against a scale's deadline.
  void ResumeStalledScheduler() {
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * o_.heartbeat_timeout_ms));
    scheduler.Signal(SIGCONT);
  }

  // Every trainer's exit code (nullopt: still running at the deadline) and final line.
  struct Outcome {
    std::vector<std::optional<int>> codes;
    std::vector<TrainFinal> finals;
    std::vector<std::string> logs;
  };
  Outcome WaitTrainers(Clock::time_point deadline) {
    Outcome out;
    for (auto& t : trainers) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      out.codes.push_back(t->Wait(std::max(left, std::chrono::milliseconds(1))));
      out.logs.push_back(t->Log());
      out.finals.push_back(ParseTrainFinal(out.logs.back()));
    }
    return out;
  }
  // Every trainer exited 0 with its final line; their finals.
  std::vector<TrainFinal> RequireTrainersDone(Clock::time_point deadline) {
    Outcome out = WaitTrainers(deadline);
    for (size_t i = 0; i < out.codes.size(); ++i) {
      INFO("trainer " << i << ": " << out.logs[i]);
      REQUIRE(out.codes[i].has_value());
      CHECK(*out.codes[i] == 0);
      REQUIRE(out.finals[i].found);
    }
    return out.finals;
  }
  // The trainers exited 0 with their final lines; then servers (but `except`) and the
  // scheduler exit 0 too, each within `exit_wait`.
  std::vector<TrainFinal> RequireFinished(Clock::time_point deadline, std::vector<int> except = {},
                                          std::chrono::seconds exit_wait = std::chrono::seconds(60)) {
    std::vector<TrainFinal> finals = RequireTrainersDone(deadline);
    for (size_t i = 0; i < servers.size(); ++i) {
      if (std::find(except.begin(), except.end(), static_cast<int>(i)) != except.end()) continue;
      INFO("server " << i << ": " << servers[i]->Log());
      CHECK(servers[i]->Wait(exit_wait) == std::optional<int>(0));
    }
    INFO(scheduler.Log());
    CHECK(scheduler.Wait(exit_wait) == std::optional<int>(0));
    return finals;
  }

 private:
  static std::vector<std::string> Append(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  TrainJobOptions o_;
};

// The finals of an undisturbed run with o's worker and step counts: 2 servers, no
// replication, no scale-out (none of which changes synchronous SGD's result), run once
// per test process and kept.
inline std::vector<TrainFinal> UndisturbedFinals(const TrainJobOptions& o) {
  static std::map<std::pair<int, int>, std::vector<TrainFinal>> runs;
  const auto key = std::make_pair(o.workers, o.steps);
  auto it = runs.find(key);
  if (it != runs.end()) return it->second;
  TrainJobOptions plain;
  plain.workers = o.workers;
  plain.steps = o.steps;
  TrainJob job(plain);
  job.Start();
  INFO("undisturbed run, logs in " << job.dir.path());
  std::vector<TrainFinal> finals = job.RequireFinished(TrainJob::Clock::now() + std::chrono::seconds(240));
  runs[key] = finals;
  return finals;
}

// Both runs ended with the same loss and weights checksum, trainer by trainer, within 1e-6.
inline void CheckSameFinals(const std::vector<TrainFinal>& plain, const std::vector<TrainFinal>& disturbed) {
  REQUIRE(plain.size() == disturbed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    INFO("trainer " << i << ": loss " << plain[i].loss << " vs " << disturbed[i].loss << ", checksum "
                    << plain[i].checksum << " vs " << disturbed[i].checksum);
    CHECK(std::fabs(plain[i].loss - disturbed[i].loss) <= 1e-6);
    CHECK(std::fabs(plain[i].checksum - disturbed[i].checksum) <= 1e-6);
  }
}

}  // namespace pscore::testing
