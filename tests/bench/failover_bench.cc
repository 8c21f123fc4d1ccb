// failover_bench: how long a push waits when the primary of its key's range is lost, with
// real processes. Per run a fresh job: a pscore-node scheduler with --replicas=2 and two
// pscore-node servers (ranks 0 and 1) as child processes, one worker in this process. The
// worker pushes a key (links warm), then the range's primary is SIGKILLed (or SIGSTOPped:
// silent, its sockets open) and a push of that key is issued at once. The figure is the
// time from the signal to that push's acknowledgement, which only the promoted replica can
// give; the median of --runs runs is printed with the minimum and maximum, and, as the
// baseline of the same run, the heartbeat timeout that the promotion waits for by design
// (`*_over_timeout`: the median minus it).
//   failover_bench [--runs=5] [--heartbeat_interval_ms=100] [--heartbeat_timeout_ms=1000]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "pscore/core/key_range.h"
#include "pscore/node/worker/worker_node.h"
#include "bench/bench_util.h"

namespace {

using namespace pscore;
using namespace std::chrono_literals;
using BenchClock = std::chrono::steady_clock;

using bench::IntFlag;
using bench::SelfDir;

pid_t Spawn(std::vector<std::string> args, const std::string& log) {
  pid_t pid = ::fork();
  CHECK(pid >= 0) << "fork";
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    FILE* f = std::freopen(log.c_str(), "a", stderr);
    (void)f;
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

void Reap(pid_t pid) {
  ::kill(pid, SIGCONT);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
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

struct Timing {
  int hb_ms;
  int timeout_ms;
};

// One run: milliseconds from `sig` to the promoted replica's acknowledgement.
double FailoverMs(const std::string& dir, const Timing& t, int sig) {
  const std::string node = SelfDir() + "/pscore-node";
  const std::vector<std::string> timing = {"--heartbeat_interval_ms=" + std::to_string(t.hb_ms),
                                           "--heartbeat_timeout_ms=" + std::to_string(t.timeout_ms)};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), timing.begin(), timing.end());
    return a;
  };
  std::filesystem::remove(dir + "/port");
  pid_t sched = Spawn(with({node, "--role=scheduler", "--worker_num=1", "--server_num=2", "--replicas=2",
                            "--scheduler_port=0", "--port_file=" + dir + "/port"}),
                      dir + "/scheduler.log");
  const int port = ReadPort(dir + "/port");
  pid_t servers[2];
  for (int i = 0; i < 2; ++i) {
    servers[i] = Spawn(with({node, "--role=server", "--node_id=s" + std::to_string(i), "--rank=" + std::to_string(i),
                             "--scheduler_port=" + std::to_string(port), "--update_rule=sum"}),
                       dir + "/server" + std::to_string(i) + ".log");
  }
  node::NodeOptions o;
  o.node_id = "w0";
  o.scheduler_port = port;
  o.heartbeat_interval = std::chrono::milliseconds(t.hb_ms);
  o.heartbeat_timeout = std::chrono::milliseconds(t.timeout_ms);
  o.recovery_timeout = 30s;
  node::WorkerNode worker(o);
  CHECK(worker.Start().ok());
  Status ready = worker.WaitForReady(30s);
  CHECK(ready.ok()) << ready;
  const uint64_t key = 1;
  const std::vector<float> values(1024, 1.0f);
  Status st = worker.Push({key}, values).get();
  CHECK(st.ok()) << st;
  const pid_t primary = servers[core::ServerForKey(key, 2)];
  const auto lost = BenchClock::now();
  ::kill(primary, sig);
  st = worker.Push({key}, values).get();
  const double ms = std::chrono::duration<double, std::milli>(BenchClock::now() - lost).count();
  CHECK(st.ok()) << st;
  worker.Stop();
  for (pid_t s : servers) Reap(s);
  Reap(sched);
  return ms;
}

void Figures(const std::string& name, std::vector<double> ms, const Timing& t) {
  const double median = bench::Quantile(&ms, 0.5);
  bench::Print(name + "_p50", median, "ms", 1);
  bench::Print(name + "_min", bench::Quantile(&ms, 0), "ms", 1);
  bench::Print(name + "_max", bench::Quantile(&ms, 1), "ms", 1);
  bench::Print(name + "_over_timeout", median - t.timeout_ms, "ms", 1);
}

}  // namespace

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_minloglevel = std::getenv("PSCORE_BENCH_LOG") != nullptr ? 0 : 2;
  const int runs = std::max(1, IntFlag(argc, argv, "runs", 5));
  Timing t;
  t.hb_ms = std::max(10, IntFlag(argc, argv, "heartbeat_interval_ms", 100));
  t.timeout_ms = std::max(t.hb_ms * 2, IntFlag(argc, argv, "heartbeat_timeout_ms", 1000));
  char tmpl[] = "/tmp/pscore-failover-XXXXXX";
  CHECK(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const std::string tag = "_replicas2_hb" + std::to_string(t.timeout_ms) + "ms";
  bench::Print("heartbeat_timeout", t.timeout_ms, "ms", 0);
  for (auto [name, sig] : {std::make_pair("failover_sigkill", SIGKILL), std::make_pair("failover_sigstop", SIGSTOP)}) {
    std::vector<double> ms;
    for (int r = 0; r < runs; ++r) ms.push_back(FailoverMs(dir, t, sig));
    Figures(name + tag, ms, t);
  }
  bench::Print("failover_runs", runs, "runs", 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
