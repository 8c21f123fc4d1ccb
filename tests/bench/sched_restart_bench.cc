// sched_restart_bench: how long a job's control plane is stopped by a scheduler crash. A
// pscore-node scheduler with --state_dir runs as a child process; two members (in this
// process) pass a barrier round, then the scheduler is SIGKILLed and started again on its
// port at once, and both members call the next round of the barrier right after the kill
// (their calls wait parked, then are re-issued once they registered again). The figure is
// the time from the SIGKILL to the barrier's completion on both members; the median of
// --runs runs is printed (and the minimum and maximum).
//   sched_restart_bench [--runs=5] [--heartbeat_interval_ms=100]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pscore/node/common/node.h"
#include "bench/bench_util.h"

namespace {

using namespace pscore;
using namespace std::chrono_literals;
using BenchClock = std::chrono::steady_clock;

using bench::IntFlag;
using bench::SelfDir;

pid_t StartScheduler(const std::string& dir, int port, int hb_ms) {
  const std::string node = SelfDir() + "/pscore-node";
  std::vector<std::string> args = {node,
                                   "--role=scheduler",
                                   "--worker_num=2",
                                   "--server_num=0",
                                   "--scheduler_port=" + std::to_string(port),
                                   "--port_file=" + dir + "/port",
                                   "--state_dir=" + dir + "/state",
                                   "--heartbeat_interval_ms=" + std::to_string(hb_ms),
                                   "--heartbeat_timeout_ms=" + std::to_string(hb_ms * 30)};
  pid_t pid = ::fork();
  CHECK(pid >= 0) << "fork";
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = dir + "/scheduler.log";
    FILE* f = std::freopen(log.c_str(), "a", stderr);
    (void)f;
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int ReadPort(const std::string& path) {
  const auto deadline = BenchClock::now() + 30s;
  while (BenchClock::now() < deadline) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(10ms);
  }
  LOG(FATAL) << "no port in " << path;
  return 0;
}

// Both members call round `id` at once; returns when both passed (aborts on an error).
void BothPass(node::Node* a, node::Node* b, const std::string& id) {
  auto other = std::async(std::launch::async, [b, &id] { return b->Barrier(id, 60s); });
  Status sa = a->Barrier(id, 60s);
  Status sb = bench::Wait(other);
  CHECK(sa.ok()) << sa;
  CHECK(sb.ok()) << sb;
}

}  // namespace

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_minloglevel = std::getenv("PSCORE_BENCH_LOG") != nullptr ? 0 : 2;
  const int runs = std::max(1, IntFlag(argc, argv, "runs", 5));
  const int hb_ms = std::max(10, IntFlag(argc, argv, "heartbeat_interval_ms", 100));
  char tmpl[] = "/tmp/pscore-sched-restart-XXXXXX";
  CHECK(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  pid_t sched = StartScheduler(dir, 0, hb_ms);
  const int port = ReadPort(dir + "/port");

  std::vector<std::unique_ptr<node::Node>> members;
  std::vector<std::future<Status>> started;
  for (int i = 0; i < 2; ++i) {
    node::NodeOptions o;
    o.role = pb::WORKER;
    o.node_id = "m" + std::to_string(i);
    o.scheduler_port = port;
    o.heartbeat_interval = std::chrono::milliseconds(hb_ms);
    o.heartbeat_timeout = std::chrono::milliseconds(hb_ms * 30);
    o.request_timeout = 10s;
    o.connect_timeout = 30s;
    o.recovery_timeout = 30s;
    members.push_back(std::make_unique<node::Node>(o, nullptr));
    node::Node* m = members.back().get();
    started.push_back(std::async(std::launch::async, [m] {
      Status st = m->Start();
      return st.ok() ? m->WaitForReady(30s) : st;
    }));
  }
  for (auto& f : started) {
    Status st = bench::Wait(f);
    CHECK(st.ok()) << st;
  }
  BothPass(members[0].get(), members[1].get(), "bench/warm");

  std::vector<double> ms;
  for (int r = 0; r < runs; ++r) {
    // The state file holds the last round once the writer is idle: give it a moment.
    std::this_thread::sleep_for(std::chrono::milliseconds(hb_ms * 2));
    const auto killed = BenchClock::now();
    ::kill(sched, SIGKILL);
    ::waitpid(sched, nullptr, 0);
    auto other = std::async(std::launch::async, [&] { return members[1]->Barrier("bench/round", 60s); });
    sched = StartScheduler(dir, port, hb_ms);
    Status sa = members[0]->Barrier("bench/round", 60s);
    Status sb = bench::Wait(other);
    CHECK(sa.ok()) << sa;
    CHECK(sb.ok()) << sb;
    ms.push_back(std::chrono::duration<double, std::milli>(BenchClock::now() - killed).count());
  }
  bench::Print("sched_kill_to_barrier_median", bench::Quantile(&ms, 0.5), "ms", 1);
  bench::Print("sched_kill_to_barrier_min", bench::Quantile(&ms, 0), "ms", 1);
  bench::Print("sched_kill_to_barrier_max", bench::Quantile(&ms, 1), "ms", 1);
  bench::Print("sched_kill_runs", runs, "runs", 0);
  for (auto& m : members) m->Stop();
  ::kill(sched, SIGKILL);
  ::waitpid(sched, nullptr, 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
