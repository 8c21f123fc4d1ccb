// Scale-out benchmark: time from the admin command to READY for S -> 2S servers holding
// 64 MiB, 256 MiB and 1 GiB of parameters (keys of 256 KiB), and the rate at which the
// parameters that change owner move, against the data-plane Push rate of the same run:
// one Push of the same total size through the same worker and servers, measured first
// (once creating the keys, then twice adding into them). In-process nodes, each on its own
// loop thread; the new servers are started right after the admin command, as an operator
// would. Each case runs PSCORE_SCALE_REPS (default 3) fresh jobs. One figure per line:
// `name value unit`. Run through `scripts/bench.sh scale [quick | smoke | FROM TO MIB]`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pscore/core/key_range.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"
#include "bench/bench_job.h"
#include "bench/bench_util.h"

namespace pscore::node {
namespace {

using Clock = std::chrono::steady_clock;
using bench::Print;
using bench::Seconds;
using bench::Wait;
using namespace std::chrono_literals;

constexpr size_t kKeyBytes = 256u << 10;
constexpr size_t kKeyFloats = kKeyBytes / sizeof(float);

// A scheduler, `servers` servers and one worker in this process; servers may be added.
class Job {
 public:
  explicit Job(int servers) {
    SchedulerOptions so;
    so.worker_num = 1;
    so.server_num = servers;
    so.max_message_bytes = bench::kJobMaxMessageBytes;
    so.heartbeat_interval = 200ms;
    so.heartbeat_timeout = 30s;  // a loop copying a large batch must not look dead
    so.scale_timeout = std::chrono::minutes(10);
    sched_ = std::make_unique<SchedulerNode>(so);
    CHECK(sched_->Start().ok());
    for (int i = 0; i < servers; ++i) AddServer();
    worker_ = std::make_unique<WorkerNode>(Opts("w0"));
    CHECK(worker_->Start().ok());
    CHECK(worker_->WaitForReady(60s).ok());
  }
  ~Job() {
    worker_->Stop();
    for (auto& s : servers_) s->Stop();
    sched_->Stop();
  }

  void AddServer() {
    core::ParamStore::Options store;
    store.rule = core::UpdateRule::kSum;
    servers_.push_back(std::make_unique<ServerNode>(Opts("s" + std::to_string(servers_.size())), store));
    CHECK(servers_.back()->Start().ok());
  }

  // Admin command, new servers started, READY at the scheduler: seconds end to end.
  double ScaleOutTo(int servers) {
    pb::AdminRequest req;
    req.set_op("scale_out");
    req.set_worker_num(1);
    req.set_server_num(servers);
    std::promise<Status> accepted;
    const Clock::time_point start = Clock::now();
    sched_->loop()->Post([&] {
      sched_->Admin(req, [&](Status st, pb::AdminResponse) { accepted.set_value(st); });
    });
    Status st = accepted.get_future().get();
    CHECK(st.ok()) << st;
    while (static_cast<int>(servers_.size()) < servers) AddServer();
    while (sched_->cluster_state() != pb::CLUSTER_READY) {
      CHECK(Clock::now() - start < std::chrono::minutes(10)) << "scale-out did not finish";
      std::this_thread::sleep_for(200us);
    }
    return Seconds(Clock::now() - start);
  }

  WorkerNode& worker() { return *worker_; }

 private:
  NodeOptions Opts(const std::string& id) { return bench::JobNodeOptions(sched_->port(), id); }

  std::unique_ptr<SchedulerNode> sched_;
  std::vector<std::unique_ptr<ServerNode>> servers_;
  std::unique_ptr<WorkerNode> worker_;
};

// One Push of every key (all values = v); seconds.
double PushAll(WorkerNode& w, const std::vector<uint64_t>& keys, float v) {
  std::vector<float> values(keys.size() * kKeyFloats, v);
  const Clock::time_point start = Clock::now();
  auto f = w.Push(keys, values);
  Status st = Wait(f);
  CHECK(st.ok()) << st;
  return Seconds(Clock::now() - start);
}

struct Sample {
  double push_create = 0;  // GB/s
  double push = 0;         // GB/s, best of two pushes into existing keys
  double scale_secs = 0;   // admin command to READY
};

Sample RunOnce(int from, int to, const std::vector<uint64_t>& keys) {
  const double bytes = static_cast<double>(keys.size() * kKeyBytes);
  Sample s;
  Job job(from);
  s.push_create = bytes / PushAll(job.worker(), keys, 1.0f) / 1e9;  // creates the keys
  double best = std::min(PushAll(job.worker(), keys, 0.25f), PushAll(job.worker(), keys, 0.25f));
  s.push = bytes / best / 1e9;
  s.scale_secs = job.ScaleOutTo(to);
  // Sanity: a sample of keys holds all three pushes under the new partition.
  std::vector<uint64_t> sample;
  for (size_t k = 0; k < keys.size(); k += 7) sample.push_back(keys[k]);
  auto f = job.worker().Pull(sample);
  Result<PullResult> r = Wait(f);
  CHECK(r.ok()) << r.status();
  CHECK_EQ(job.worker().server_count(), to);
  for (float v : r->values) CHECK_EQ(v, 1.5f) << "a moved parameter lost or doubled an update";
  return s;
}

// `reps` fresh jobs; rates are the best of the repetitions (the machine is shared: the
// best run is the one least disturbed), the time to READY is the median.
void RunCase(int from, int to, size_t mib, int reps) {
  const std::string name = std::to_string(from) + "to" + std::to_string(to) + "_" + std::to_string(mib) + "MiB";
  std::vector<uint64_t> keys((mib << 20) / kKeyBytes);
  for (size_t k = 0; k < keys.size(); ++k) keys[k] = k;
  size_t moved_keys = 0;
  for (uint64_t k : keys) moved_keys += core::ServerForKey(k, from) != core::ServerForKey(k, to) ? 1 : 0;
  const double moved_bytes = static_cast<double>(moved_keys * kKeyBytes);
  std::vector<Sample> runs;
  for (int i = 0; i < reps; ++i) runs.push_back(RunOnce(from, to, keys));
  double create = 0, push = 0, fastest = 1e30;
  std::vector<double> secs;
  for (const Sample& s : runs) {
    create = std::max(create, s.push_create);
    push = std::max(push, s.push);
    fastest = std::min(fastest, s.scale_secs);
    secs.push_back(s.scale_secs);
  }
  const double migrate = moved_bytes / fastest / 1e9;
  Print("push_create_" + name, create, "GB/s");
  Print("push_" + name, push, "GB/s");
  Print("scaleout_" + name + "_to_ready_median", bench::Median(secs) * 1e3, "ms");
  Print("scaleout_" + name + "_to_ready_best", fastest * 1e3, "ms");
  Print("moved_" + name, moved_bytes / (1 << 20), "MiB");
  Print("migrate_" + name, migrate, "GB/s");
  Print("migrate_over_push_" + name, migrate / push, "ratio");
}

int Main(int argc, char** argv) {
  const char* env_reps = std::getenv("PSCORE_SCALE_REPS");
  const int reps = std::max(1, env_reps != nullptr ? std::atoi(env_reps) : 3);
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "smoke") {  // CI: one tiny case, so the code cannot rot
    RunCase(2, 3, 4, 1);
    return 0;
  }
  if (mode == "quick") {
    RunCase(2, 4, 64, 1);
    return 0;
  }
  if (argc == 4) {
    RunCase(std::atoi(argv[1]), std::atoi(argv[2]), std::strtoul(argv[3], nullptr, 10), reps);
    return 0;
  }
  if (argc != 1) {
    std::fprintf(stderr, "usage: scale_bench [quick | smoke | FROM TO MIB]  (PSCORE_SCALE_REPS=3 runs per case)\n");
    return 2;
  }
  for (size_t mib : {64, 256, 1024}) {
    RunCase(2, 4, mib, reps);
    RunCase(4, 8, mib, reps);
  }
  return 0;
}

}  // namespace
}  // namespace pscore::node

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_minloglevel = std::getenv("PSCORE_BENCH_LOG") != nullptr ? 0 : 1;  // INFO lines only on request
  return pscore::node::Main(argc, argv);
}
