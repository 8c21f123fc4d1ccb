// A job's outcome and the scheduler watch with the real pscore-node binary: a worker
// SIGKILLed and never restarted fails the job (scheduler and survivors exit 3 naming it,
// the state file records it); a scheduler stopped for a while is reported lost and back
// by every member and the job still finishes with exit 0; a scheduler stopped for good
// makes every member exit 4 naming it. Every child is stopped by pid when a test ends.
#include <signal.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pscore/core/state_file.h"
#include "multiproc/admin_probe.h"
#include "multiproc/process.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kIntervalMs = 100;
constexpr int kTimeoutMs = 600;           // heartbeat timeout; the scheduler watch: 2 x this
constexpr int kConnectTimeoutMs = 20000;  // longer than any stop below: the watch decides
constexpr auto kSlack = 5s;               // processes to notice, stop and be reaped

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// One job's processes. The scheduler is SIGCONTed before the kill in case it is stopped.
class Job {
 public:
  Job() { REQUIRE(dir_.ok()); }
  ~Job() {
    scheduler_.Signal(SIGCONT);
    scheduler_.Kill();
  }

  int StartScheduler(int workers, int servers) {
    std::vector<std::string> argv = {NodeBinary(), "--role=scheduler", "--recoverable_roles=worker,server", "--scheduler_port=0",
                                     "--worker_num=" + std::to_string(workers),
                                     "--server_num=" + std::to_string(servers), "--state_dir=" + dir_.File("state"),
                                     "--port_file=" + dir_.File("scheduler.port")};
    Timing(&argv);
    REQUIRE(scheduler_.Start(argv, dir_.File("scheduler.log")));
    port_ = ReadPortFile(dir_.File("scheduler.port"), 10s);
    INFO(scheduler_.Log());
    REQUIRE(port_ > 0);
    return port_;
  }

  Process& StartMember(const std::string& role, const std::string& id, bool auto_finish,
                       std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {NodeBinary(), "--role=" + role, "--node_id=" + id,
                                     "--scheduler_port=" + std::to_string(port_),
                                     std::string("--auto_finish=") + (auto_finish ? "true" : "false")};
    Timing(&argv);
    argv.insert(argv.end(), extra.begin(), extra.end());
    members_.push_back(std::make_unique<Process>());
    REQUIRE(members_.back()->Start(argv, dir_.File(id + ".log")));
    return *members_.back();
  }

  // Polls the admin status until `ok` holds; false at the deadline.
  template <typename Pred>
  bool WaitForStatus(Pred ok, std::chrono::milliseconds timeout) {
    AdminProbe admin(port_);
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      Result<pb::AdminResponse> r = admin.Call("status", 2s);
      if (r.ok() && ok(*r)) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  // The state file's last snapshot (read after the scheduler exited).
  Result<pb::PersistedState> State() const { return core::ParseState(ReadFile(dir_.File("state/scheduler.state"))); }

  Process& scheduler() { return scheduler_; }
  std::vector<std::unique_ptr<Process>>& members() { return members_; }
  int port() const { return port_; }
  const TempDir& dir() const { return dir_; }

 private:
  static void Timing(std::vector<std::string>* argv) {
    argv->push_back("--heartbeat_interval_ms=" + std::to_string(kIntervalMs));
    argv->push_back("--heartbeat_timeout_ms=" + std::to_string(kTimeoutMs));
    argv->push_back("--connect_timeout_ms=" + std::to_string(kConnectTimeoutMs));
  }

  TempDir dir_;
  Process scheduler_;
  std::vector<std::unique_ptr<Process>> members_;
  int port_ = 0;
};

}  // namespace

TEST_CASE("a worker SIGKILLed and never restarted fails the job: every survivor exits 3 naming it",
          "[multiproc][net]") {
  Job job;
  job.StartScheduler(/*workers=*/2, /*servers=*/1);
  Process& s0 = job.StartMember("server", "s0", true);
  Process& w0 = job.StartMember("worker", "w0", true);
  Process& w1 = job.StartMember("worker", "w1", false);  // never finishes: it dies first
  REQUIRE(job.WaitForStatus(
      [](const pb::AdminResponse& r) {
        return r.cluster_state() == pb::CLUSTER_READY && r.job_result() == "running";
      },
      15s));
  const auto killed = Clock::now();
  w1.Signal(SIGKILL);
  REQUIRE(w1.Wait(10s).has_value());

  const auto bound = std::chrono::milliseconds(kTimeoutMs) + kSlack;
  std::optional<int> code = job.scheduler().Wait(bound);
  const std::string log = job.scheduler().Log();
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 3);
  CHECK(log.find("job failed: worker w1 lost (no heartbeat for ") != std::string::npos);
  CHECK(log.find("every node finished") == std::string::npos);
  for (Process* p : {&s0, &w0}) {
    std::optional<int> member = p->Wait(bound - std::chrono::milliseconds(MsSince(killed)) + 1s);
    INFO(p->Log());
    REQUIRE(member.has_value());
    CHECK(*member == 3);
    CHECK(p->Log().find("job failed: worker w1 lost (no heartbeat for ") != std::string::npos);
  }
  Result<pb::PersistedState> state = job.State();
  REQUIRE(state.ok());
  CHECK(state->job_result() == "failed");
  CHECK(state->job_failure().find("worker w1 lost") == 0);
  REQUIRE(state->failed_nodes_size() == 1);
  CHECK(state->failed_nodes(0) == "w1");
}

TEST_CASE("a scheduler stopped for 4 heartbeat timeouts is reported lost and back once by every member, and the "
          "job then finishes with exit 0",
          "[multiproc][net]") {
  Job job;
  const int port = job.StartScheduler(/*workers=*/2, /*servers=*/1);
  job.StartMember("server", "s0", true);
  job.StartMember("worker", "w0", true);
  // Both registered; the job waits for w1, which joins only after the stop.
  REQUIRE(job.WaitForStatus(
      [](const pb::AdminResponse& r) { return r.registered_servers() == 1 && r.registered_workers() == 1; }, 15s));
  job.scheduler().Signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(4 * kTimeoutMs));
  job.scheduler().Signal(SIGCONT);

  const std::string lost = "the scheduler at 127.0.0.1:" + std::to_string(port) + " has not answered for ";
  const std::string back = "the scheduler at 127.0.0.1:" + std::to_string(port) + " answers again after ";
  const auto deadline = Clock::now() + 10s;
  for (auto& p : job.members()) {
    while (Clock::now() < deadline && p->Log().find(back) == std::string::npos) std::this_thread::sleep_for(20ms);
  }
  job.StartMember("worker", "w1", true);
  for (auto& p : job.members()) {
    std::optional<int> code = p->Wait(20s);
    const std::string log = p->Log();
    INFO(log);
    REQUIRE(code.has_value());
    CHECK(*code == 0);
  }
  for (size_t i = 0; i < 2; ++i) {  // s0 and w0 saw the stop
    const std::string log = job.members()[i]->Log();
    INFO(log);
    CHECK(Count(log, lost) == 1);
    CHECK(Count(log, back) == 1);
  }
  std::optional<int> code = job.scheduler().Wait(10s);
  INFO(job.scheduler().Log());
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

TEST_CASE("a scheduler stopped for good makes every member exit 4 within the recovery timeout, naming it",
          "[multiproc][net]") {
  constexpr int kRecoveryMs = 2500;
  Job job;
  const int port = job.StartScheduler(/*workers=*/2, /*servers=*/1);
  const std::vector<std::string> recovery = {"--recovery_timeout_ms=" + std::to_string(kRecoveryMs)};
  job.StartMember("server", "s0", true, recovery);
  job.StartMember("worker", "w0", true, recovery);
  REQUIRE(job.WaitForStatus(
      [](const pb::AdminResponse& r) { return r.registered_servers() == 1 && r.registered_workers() == 1; }, 15s));
  const auto stopped = Clock::now();
  job.scheduler().Signal(SIGSTOP);

  const std::string gave_up = "gave up on the scheduler at 127.0.0.1:" + std::to_string(port) + ": no answer for ";
  const auto bound = std::chrono::milliseconds(kRecoveryMs) + kSlack;
  for (auto& p : job.members()) {
    std::optional<int> code = p->Wait(bound - std::chrono::milliseconds(MsSince(stopped)));
    const std::string log = p->Log();
    INFO(log);
    REQUIRE(code.has_value());  // no hang
    CHECK(*code == 4);
    CHECK(Count(log, gave_up) >= 1);
    CHECK(log.find("(recovery timeout " + std::to_string(kRecoveryMs) + " ms)") != std::string::npos);
  }
  CHECK(job.scheduler().running());  // still stopped; the Job stops it by pid
}

}  // namespace pscore::testing
