// Coordination benchmark (scripts/bench.sh coord). A real SchedulerNode on its own loop
// thread; real WorkerNodes sharing a few client loops, driven through the blocking Node
// API (one round trip per call) from many threads. Figures:
//   kv_small_pairs_per_s   KvSet + KvGet of 100-byte values, --clients nodes, each with
//                          --threads_per_client threads (one call in flight per thread);
//   kv_small_shared_*      the same threads, --shared_threads_per_node of them sharing one
//                          node (and its link to the scheduler);
//   kv_small_async_*       --async_depth set+get chains per client through the asynchronous
//                          calls (the baseline of the *_vs_async_ratio figures);
//   kv_1mib_mb_per_s       the same with 1 MiB values: value bytes moved (set + get) per s;
//   kv_rtt_median_us       one KvTryGet at a time from one client;
//   kv_small_raw_*         the same threads on raw blocking sockets to one epoll thread that
//                          answers each request at once (raw_blocking.h): two round trips
//                          per pair, no protocol;
//   *_via_loop_*           blocking calls with NodeOptions::direct_control_calls off: each
//                          handed to the node's loop thread and answered back through it;
//   barrier64_release_*    64 nodes, 63 arrive and wait; then the last arrives: from just
//                          before its call to the last of the 64 calls returning, per round;
//   barrier64_raw_*        the same release on raw blocking sockets (raw_blocking.h);
//   barrier64_async_*      the same rounds through BarrierAsync (callbacks on the client
//                          loops): from just before the last call to the last callback;
//   barrier64_loop_*       the same protocol without user threads: 64 connections on one
//                          client loop send BARRIER for w0..w63; from the last request's
//                          send to the last answer handled on that loop (no thread wake-ups);
//   error_fanout_*         one node reports an error; from just before the call to the
//                          last of --fanout_nodes other nodes' on_cluster_event callbacks.
// Prints `name value unit` lines, then the targets of issue 6 as ratios.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/worker/worker_node.h"

#include "bench/bench_util.h"
#include "bench/raw_blocking.h"

namespace pscore::bench {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using node::Node;
using node::WorkerNode;

struct Config {
  std::string mode = "all";  // all | kv | kvbig | barrier | fanout
  int clients = 32;
  int threads_per_client = 1;
  int shared_threads_per_node = 8;  // kv_small_shared: threads sharing one node
  int async_depth = 8;  // kv_small_async: set+get pairs in flight per client
  int client_loops = 2;
  double duration_s = 3;
  int rounds = 100;
  int fanout_nodes = 256;
  int fanout_reps = 20;
};

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }
void Print(const char* name, double value, const char* unit) { std::printf("%s %.3f %s\n", name, value, unit); }

void RaiseFdLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// A scheduler expecting `n` workers, and those workers on `loops` shared client loops.
class Job {
 public:
  Job(int n, int loops, Duration interval, const std::function<void(int, Node::Callbacks*)>& cb = {},
      bool direct_calls = true) {
    node::SchedulerOptions so;
    so.worker_num = n;
    so.server_num = 0;
    so.heartbeat_interval = interval;
    so.heartbeat_timeout = 60s;
    so.max_kv_value_bytes = 4u << 20;
    sched_ = std::make_unique<node::SchedulerNode>(so);
    if (!sched_->Start().ok()) Die("scheduler start");
    for (int i = 0; i < loops; ++i) {
      loops_.push_back(std::make_unique<comm::EventLoop>("clients" + std::to_string(i)));
      if (!loops_.back()->Start().ok()) Die("client loop start");
    }
    for (int i = 0; i < n; ++i) {
      node::NodeOptions o;
      o.role = pb::WORKER;
      o.scheduler_port = sched_->port();
      o.node_id = "w" + std::to_string(i);
      o.heartbeat_interval = interval;
      o.connect_timeout = 30s;
      o.handler_threads = 0;
      o.direct_control_calls = direct_calls;
      nodes_.push_back(std::make_unique<WorkerNode>(o, loops_[i % loops].get()));
      Node::Callbacks callbacks;
      if (cb) cb(i, &callbacks);
      nodes_.back()->SetCallbacks(callbacks);
    }
    for (auto& w : nodes_) {
      if (!w->Start().ok()) Die("node start");
    }
    for (auto& w : nodes_) {
      if (!w->WaitForReady(120s).ok()) Die("ready");
    }
  }
  ~Job() {
    for (auto& w : nodes_) w->Stop();
    sched_->Stop();
    for (auto& l : loops_) l->Stop().IgnoreError();
  }
  Node& node(int i) { return *nodes_[i]; }
  node::SchedulerNode& sched() { return *sched_; }

  static void Die(const char* what) {
    std::fprintf(stderr, "coord_bench: %s failed\n", what);
    std::exit(1);
  }

 private:
  std::unique_ptr<node::SchedulerNode> sched_;
  std::vector<std::unique_ptr<comm::EventLoop>> loops_;  // outlive the nodes on them
  std::vector<std::unique_ptr<Node>> nodes_;
};

// What the whole process spent in a measured window (every thread: the callers, the client
// loops and the scheduler's), per pair: CPU time and context switches. On a loaded machine
// these move less than a rate does.
struct Cost {
  double cpu_us = 0;
  double switches = 0;
};

class CostMeter {
 public:
  CostMeter() { getrusage(RUSAGE_SELF, &start_); }
  Cost PerPair(uint64_t pairs) const {
    rusage end{};
    getrusage(RUSAGE_SELF, &end);
    auto us = [](const timeval& t) { return t.tv_sec * 1e6 + t.tv_usec; };
    const double cpu = us(end.ru_utime) - us(start_.ru_utime) + us(end.ru_stime) - us(start_.ru_stime);
    const double sw = (end.ru_nvcsw - start_.ru_nvcsw) + (end.ru_nivcsw - start_.ru_nivcsw);
    const double n = pairs == 0 ? 1 : static_cast<double>(pairs);
    return Cost{cpu / n, sw / n};
  }

 private:
  rusage start_{};
};

void PrintCost(const std::string& name, const Cost& c) {
  Print((name + "_cpu_us_per_pair").c_str(), c.cpu_us, "us");
  Print((name + "_switches_per_pair").c_str(), c.switches, "switches");
}

// Set+get pairs per second with values of `bytes`, every thread on its own key: the
// clients x threads_per_client threads, each on node t / `threads_per_node` (0: thread
// t of client c on node c).
double KvPairsPerSecond(const Config& cfg, Job& job, size_t bytes, const char* prefix, int threads_per_node = 0,
                        Cost* cost = nullptr) {
  const std::string value(bytes, 'v');
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> pairs{0}, errors{0};
  std::vector<std::thread> threads;
  const CostMeter meter;
  const auto start = Clock::now();
  for (int c = 0; c < cfg.clients; ++c) {
    for (int t = 0; t < cfg.threads_per_client; ++t) {
      const int index = c * cfg.threads_per_client + t;
      threads.emplace_back([&, c, t, index] {
        Node& n = job.node(threads_per_node > 0 ? index / threads_per_node : c);
        const std::string key = std::string(prefix) + "/c" + std::to_string(c) + "/t" + std::to_string(t);
        while (!stop.load(std::memory_order_relaxed)) {
          Status st = n.KvSet(key, value);
          Result<std::string> got = n.KvGet(key, 5s);
          if (!st.ok() || !got.ok() || got->size() != bytes) {
            ++errors;
            continue;
          }
          pairs.fetch_add(1, std::memory_order_relaxed);
        }
      });
    }
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(cfg.duration_s));
  stop = true;
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  if (cost != nullptr) *cost = meter.PerPair(pairs.load());
  if (errors.load() != 0) std::fprintf(stderr, "coord_bench: %llu failed pairs\n", (unsigned long long)errors.load());
  return pairs.load() / secs;
}

// Set+get pairs per second through the asynchronous client: each client keeps `depth`
// chains in flight (set, then get of the same key, then the next set), issued from the
// callbacks on its loop thread; no user thread waits per call.
double KvAsyncPairsPerSecond(const Config& cfg, Job& job, size_t bytes, const char* prefix, Cost* cost) {
  const std::string value(bytes, 'v');
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> pairs{0}, errors{0};
  std::atomic<int> chains{0};
  std::mutex mu;
  std::condition_variable cv;
  // One chain: set, get, count, again until stopped.
  struct Chain {
    Node* node;
    std::string key;
  };
  std::vector<std::unique_ptr<Chain>> all;
  std::function<void(Chain*)> step = [&](Chain* c) {
    if (stop.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(mu);
      if (--chains == 0) cv.notify_all();
      return;
    }
    c->node->KvSetAsync(c->key, value, true, [&, c](Status st) {
      if (!st.ok()) {
        ++errors;
        step(c);
        return;
      }
      c->node->KvGetAsync(c->key, 5s, [&, c](Result<std::string> got) {
        if (!got.ok() || got->size() != bytes) {
          ++errors;
        } else {
          pairs.fetch_add(1, std::memory_order_relaxed);
        }
        step(c);
      });
    });
  };
  for (int c = 0; c < cfg.clients; ++c) {
    for (int d = 0; d < cfg.async_depth; ++d) {
      all.push_back(std::make_unique<Chain>(
          Chain{&job.node(c), std::string(prefix) + "/c" + std::to_string(c) + "/d" + std::to_string(d)}));
    }
  }
  chains = static_cast<int>(all.size());
  const CostMeter meter;
  const auto start = Clock::now();
  for (auto& c : all) step(c.get());
  std::this_thread::sleep_for(std::chrono::duration<double>(cfg.duration_s));
  stop = true;
  const uint64_t counted = pairs.load();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, 30s, [&] { return chains.load() == 0; })) Job::Die("async chains did not end");
  }
  *cost = meter.PerPair(pairs.load());
  if (errors.load() != 0) std::fprintf(stderr, "coord_bench: %llu failed async pairs\n", (unsigned long long)errors.load());
  return counted / secs;
}

double KvRttMedianUs(Job& job) {
  std::vector<double> rtt;
  if (!job.node(0).KvSet("rtt", "x").ok()) Job::Die("kv set");
  for (int i = 0; i < 2000; ++i) {
    const auto t0 = Clock::now();
    if (!job.node(0).KvTryGet("rtt").ok()) Job::Die("kv try-get");
    rtt.push_back(Us(Clock::now() - t0));
  }
  return Median(rtt);
}

// The blocking calls through the loop thread (direct_control_calls off), and raw blocking
// sockets with as many threads: the baselines of the blocking figures.
void RunKvBaselines(const Config& cfg, double pairs, double rtt) {
  const int threads = cfg.clients * cfg.threads_per_client;
  {
    Job via_loop(cfg.clients, cfg.client_loops, 1s, {}, /*direct_calls=*/false);
    const double loop_rtt = KvRttMedianUs(via_loop);
    const double loop_pairs = KvPairsPerSecond(cfg, via_loop, 100, "loop");
    Print("kv_rtt_via_loop_median_us", loop_rtt, "us");
    Print("kv_small_via_loop_pairs_per_s", loop_pairs, "pairs/s");
    Print("kv_rtt_direct_vs_loop_ratio", rtt / loop_rtt, "x");
    Print("kv_small_direct_vs_loop_ratio", pairs / loop_pairs, "x");
  }
  const double raw_pairs = RawBlockingCallsPerSecond(threads, 100, cfg.duration_s) / 2;
  Print("kv_small_raw_pairs_per_s", raw_pairs, "pairs/s");
  Print("kv_small_vs_raw_ratio", pairs / raw_pairs, "x");
}

void RunKv(const Config& cfg, bool small, bool big) {
  Job job(cfg.clients, cfg.client_loops, 1s);
  if (small) {
    const double rtt = KvRttMedianUs(job);
    Print("kv_rtt_median_us", rtt, "us");
    Cost own, shared_cost, async_cost;
    const double pairs = KvPairsPerSecond(cfg, job, 100, "small", 0, &own);
    Print("kv_small_pairs_per_s", pairs, "pairs/s");
    std::printf("target kv_small_pairs_per_s >= 100000: %.2fx\n", pairs / 100000);
    const int threads = cfg.clients * cfg.threads_per_client;
    const int per_node = std::min(cfg.shared_threads_per_node, threads);
    const double shared = KvPairsPerSecond(cfg, job, 100, "shared", per_node, &shared_cost);
    std::printf("kv_small_shared_pairs_per_s %.3f pairs/s (%d threads on %d nodes)\n", shared, threads,
                (threads + per_node - 1) / per_node);
    std::printf("target kv_small_shared_pairs_per_s >= 100000: %.2fx\n", shared / 100000);
    const double async_pairs = KvAsyncPairsPerSecond(cfg, job, 100, "async", &async_cost);
    std::printf("kv_small_async_pairs_per_s %.3f pairs/s (%d clients, %d pairs in flight each)\n", async_pairs,
                cfg.clients, cfg.async_depth);
    std::printf("target kv_small_async_pairs_per_s >= 100000: %.2fx\n", async_pairs / 100000);
    // The blocking calls against the asynchronous ones of the same run (1.0: no cost for
    // the waiting threads).
    Print("kv_small_blocking_vs_async_ratio", pairs / async_pairs, "x");
    Print("kv_small_shared_vs_async_ratio", shared / async_pairs, "x");
    PrintCost("kv_small", own);
    PrintCost("kv_small_shared", shared_cost);
    PrintCost("kv_small_async", async_cost);
    RunKvBaselines(cfg, pairs, rtt);
  }
  if (big) {
    const double pairs = KvPairsPerSecond(cfg, job, 1u << 20, "big");
    const double mb = pairs * 2 * (1u << 20) / 1e6;  // a pair moves the value twice
    Print("kv_1mib_pairs_per_s", pairs, "pairs/s");
    Print("kv_1mib_mb_per_s", mb, "MB/s");
    std::printf("target kv_1mib_mb_per_s >= 2500: %.2fx\n", mb / 2500);
  }
}

// Arrived count of the waiting round of barrier `id` (read on the scheduler's loop).
int Arrived(node::SchedulerNode& sched, const std::string& id) {
  auto p = std::make_shared<std::promise<int>>();
  auto f = p->get_future();
  sched.loop()->Post([&sched, id, p] {
    pb::AdminRequest req;
    req.set_op("barriers");
    sched.Admin(req, [id, p](Status, pb::AdminResponse resp) {
      int arrived = 0;
      for (const pb::BarrierInfo& b : resp.barriers()) {
        if (b.id() == id && b.state() == "waiting") arrived = b.arrived();
      }
      p->set_value(arrived);
    });
  });
  return f.get();
}

// The barrier protocol alone: 64 connections on one client loop claim node ids w0..w63
// (a BARRIER request names its node) of an already registered job, so the time from the
// last arrival to the last answer includes the scheduler and both loops, but no thread
// wake-ups of blocked callers.
std::vector<double> LoopBarrierRounds(const Config& cfg, Job& job, int nodes) {
  comm::EventLoop loop("raw");
  if (!loop.Start().ok()) Job::Die("raw loop");
  comm::Messenger messenger(&loop, comm::TransportOptions(), comm::Messenger::Handlers());
  std::vector<comm::ConnId> conns(nodes);
  {
    auto all = std::make_shared<std::promise<void>>();
    auto left = std::make_shared<int>(nodes);
    loop.Post([&, all, left] {
      for (int i = 0; i < nodes; ++i) {
        messenger.transport().Connect("127.0.0.1", job.sched().port(), comm::ConnectOptions(),
                                      [&conns, i, all, left](Result<comm::ConnId> c) {
                                        if (!c.ok()) Job::Die("raw connect");
                                        conns[i] = *c;
                                        if (--*left == 0) all->set_value();
                                      });
      }
    });
    all->get_future().wait();
  }
  int answered = 0;  // loop thread
  Clock::time_point last;
  std::shared_ptr<std::promise<void>> round_done;
  auto send = [&](int i) {
    pb::BarrierRequest req;
    req.set_id("release_loop");
    req.set_timeout_ms(30000);
    req.set_node_id("w" + std::to_string(i));
    messenger.Call(conns[i], node::MakeMeta(pb::BARRIER, pb::WORKER, i), node::ToBuffer(req), 30s,
                   [&, nodes](Result<comm::Frame> r) {
                     if (!r.ok()) Job::Die("raw barrier");
                     last = Clock::now();
                     if (++answered == nodes) round_done->set_value();
                   });
  };
  std::vector<double> out;
  for (int r = 0; r < cfg.rounds; ++r) {
    auto done = std::make_shared<std::promise<void>>();
    auto fut = done->get_future();
    loop.Post([&, done] {
      answered = 0;
      round_done = done;
      for (int i = 0; i < nodes - 1; ++i) send(i);
    });
    while (Arrived(job.sched(), "release_loop") < nodes - 1) std::this_thread::sleep_for(200us);
    auto t0 = std::make_shared<Clock::time_point>();
    loop.Post([&, t0] {
      *t0 = Clock::now();
      send(nodes - 1);
    });
    if (fut.wait_for(30s) != std::future_status::ready) Job::Die("raw barrier round");
    std::promise<double> took;
    loop.Post([&] { took.set_value(Us(last - *t0)); });
    out.push_back(took.get_future().get());
  }
  std::promise<void> shut;
  loop.Post([&] {
    messenger.Shutdown();
    shut.set_value();
  });
  shut.get_future().wait();
  loop.Stop().IgnoreError();
  return out;
}

void RunBarrier(const Config& cfg) {
  constexpr int kNodes = 64;
  Job job(kNodes, cfg.client_loops, 1s);
  std::mutex mu;
  // Two condition variables: a returning thread wakes only the main thread, not the threads
  // already back and waiting for the next round (their wake-ups would compete for the CPU
  // with the threads still being released, inside the measured window).
  std::condition_variable start_cv, done_cv;
  int round = -1, done = 0, failed = 0;
  std::vector<std::vector<Clock::time_point>> released(cfg.rounds, std::vector<Clock::time_point>(kNodes));
  std::vector<std::thread> threads;
  for (int i = 0; i < kNodes - 1; ++i) {
    threads.emplace_back([&, i] {
      for (int r = 0; r < cfg.rounds; ++r) {
        {
          std::unique_lock<std::mutex> lock(mu);
          start_cv.wait(lock, [&] { return round >= r; });
        }
        Status st = job.node(i).Barrier("release", 30s);
        const auto t = Clock::now();
        std::lock_guard<std::mutex> lock(mu);
        released[r][i] = t;
        failed += st.ok() ? 0 : 1;
        if (++done == (r + 1) * (kNodes - 1)) done_cv.notify_one();
      }
    });
  }
  std::vector<double> last, first;
  for (int r = 0; r < cfg.rounds; ++r) {
    {
      std::lock_guard<std::mutex> lock(mu);
      round = r;
    }
    start_cv.notify_all();
    const auto deadline = Clock::now() + 30s;
    while (Arrived(job.sched(), "release") < kNodes - 1) {
      if (Clock::now() > deadline) Job::Die("barrier arrivals");
      std::this_thread::sleep_for(200us);
    }
    const auto t0 = Clock::now();
    if (!job.node(kNodes - 1).Barrier("release", 30s).ok()) ++failed;
    released[r][kNodes - 1] = Clock::now();
    std::unique_lock<std::mutex> lock(mu);
    done_cv.wait(lock, [&] { return done == (r + 1) * (kNodes - 1); });
    auto [lo, hi] = std::minmax_element(released[r].begin(), released[r].end());
    first.push_back(Us(*lo - t0));
    last.push_back(Us(*hi - t0));
  }
  for (auto& t : threads) t.join();
  if (failed != 0) std::fprintf(stderr, "coord_bench: %d barrier calls failed\n", failed);
  Print("barrier64_release_first_median_us", Median(first), "us");
  Print("barrier64_release_median_us", Median(last), "us");
  Print("barrier64_release_max_us", *std::max_element(last.begin(), last.end()), "us");
  std::printf("target barrier64_release_median_us <= 500: %.2fx\n", 500 / Median(last));
  const std::vector<double> raw = RawBlockingReleaseUs(kNodes, cfg.rounds);
  Print("barrier64_raw_release_median_us", Median(raw), "us");
  Print("barrier64_release_vs_raw_ratio", Median(last) / Median(raw), "x");
  // The same rounds through BarrierAsync: each node's answer is handled by a callback on
  // its client loop (no user thread per node to wake).
  std::vector<double> async_last;
  for (int r = 0; r < cfg.rounds; ++r) {
    std::vector<Clock::time_point> at(kNodes);
    int answered = 0;
    auto arrive = [&](int i) {
      job.node(i).BarrierAsync("async_release", 30s, {}, [&, i](Status st) {
        const auto t = Clock::now();
        std::lock_guard<std::mutex> lock(mu);
        at[i] = t;
        failed += st.ok() ? 0 : 1;
        ++answered;
        done_cv.notify_all();
      });
    };
    for (int i = 0; i < kNodes - 1; ++i) arrive(i);
    const auto deadline = Clock::now() + 30s;
    while (Arrived(job.sched(), "async_release") < kNodes - 1) {
      if (Clock::now() > deadline) Job::Die("async barrier arrivals");
      std::this_thread::sleep_for(200us);
    }
    const auto t0 = Clock::now();
    arrive(kNodes - 1);
    std::unique_lock<std::mutex> lock(mu);
    if (!done_cv.wait_for(lock, 30s, [&] { return answered == kNodes; })) Job::Die("async barrier release");
    async_last.push_back(Us(*std::max_element(at.begin(), at.end()) - t0));
  }
  if (failed != 0) std::fprintf(stderr, "coord_bench: %d barrier calls failed\n", failed);
  Print("barrier64_async_release_median_us", Median(async_last), "us");
  Print("barrier64_async_release_max_us", *std::max_element(async_last.begin(), async_last.end()), "us");
  std::printf("target barrier64_async_release_median_us <= 500: %.2fx\n", 500 / Median(async_last));
  // Blocking release time over asynchronous release time of the same run (1.0: waking the
  // blocked threads costs nothing).
  Print("barrier64_release_vs_async_ratio", Median(last) / Median(async_last), "x");
  std::vector<double> loop_rounds = LoopBarrierRounds(cfg, job, kNodes);
  Print("barrier64_loop_release_median_us", Median(loop_rounds), "us");
  Print("barrier64_loop_release_max_us", *std::max_element(loop_rounds.begin(), loop_rounds.end()), "us");
}

void RunFanout(const Config& cfg) {
  const int n = cfg.fanout_nodes + 1;  // w0 reports, the others hear
  std::mutex mu;
  std::condition_variable cv;
  std::string expect;
  int heard = 0;
  Clock::time_point first_heard, last_heard;
  auto hook = [&](int i, Node::Callbacks* cb) {
    if (i == 0) return;
    cb->on_cluster_event = [&](const pb::ClusterEventMessage& ev) {
      if (ev.kind() != pb::ClusterEventMessage::NODE_ERROR || ev.node_id() != "w0") return;
      const auto t = Clock::now();
      std::lock_guard<std::mutex> lock(mu);
      if (ev.message() != expect) return;
      if (heard++ == 0) first_heard = t;
      last_heard = t;
      cv.notify_all();
    };
  };
  Job job(n, std::max(cfg.client_loops, 4), 1s, hook);
  std::vector<double> first, last;
  for (int rep = 0; rep < cfg.fanout_reps; ++rep) {
    const std::string msg = "bench error " + std::to_string(rep);
    {
      std::lock_guard<std::mutex> lock(mu);
      expect = msg;
      heard = 0;
    }
    const auto t0 = Clock::now();
    if (!job.node(0).ReportError(1, msg).ok()) Job::Die("report error");
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, 30s, [&] { return heard == cfg.fanout_nodes; })) Job::Die("fan-out");
    first.push_back(Us(first_heard - t0));
    last.push_back(Us(last_heard - t0));
  }
  Print("error_fanout_first_median_us", Median(first), "us");
  Print("error_fanout_last_median_us", Median(last), "us");
}

}  // namespace
}  // namespace pscore::bench

int main(int argc, char** argv) {
  pscore::bench::Config cfg;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&a]() { return a.substr(a.find('=') + 1); };
    if (a.rfind("--clients=", 0) == 0) cfg.clients = std::stoi(val());
    else if (a.rfind("--shared_threads_per_node=", 0) == 0) cfg.shared_threads_per_node = std::stoi(val());
    else if (a.rfind("--async_depth=", 0) == 0) cfg.async_depth = std::stoi(val());
    else if (a.rfind("--threads_per_client=", 0) == 0) cfg.threads_per_client = std::stoi(val());
    else if (a.rfind("--client_loops=", 0) == 0) cfg.client_loops = std::stoi(val());
    else if (a.rfind("--duration_s=", 0) == 0) cfg.duration_s = std::stod(val());
    else if (a.rfind("--rounds=", 0) == 0) cfg.rounds = std::stoi(val());
    else if (a.rfind("--fanout_nodes=", 0) == 0) cfg.fanout_nodes = std::stoi(val());
    else if (a.rfind("--fanout_reps=", 0) == 0) cfg.fanout_reps = std::stoi(val());
    else if (a.rfind("--", 0) != 0) cfg.mode = a;
    else {
      std::fprintf(stderr, "usage: coord_bench [all|kv|kvbig|barrier|fanout] [--clients=32] [--threads_per_client=1]"
                           " [--shared_threads_per_node=8] [--async_depth=8]"
                           " [--client_loops=2] [--duration_s=3] [--rounds=100] [--fanout_nodes=256] [--fanout_reps=20]\n");
      return 2;
    }
  }
  google::InitGoogleLogging(argv[0]);
  FLAGS_minloglevel = 2;  // no per-node INFO/WARNING lines in the figures
  pscore::bench::RaiseFdLimit();
  const std::string& m = cfg.mode;
  if (m == "all" || m == "kv" || m == "kvbig") pscore::bench::RunKv(cfg, m != "kvbig", m != "kv");
  if (m == "all" || m == "barrier") pscore::bench::RunBarrier(cfg);
  if (m == "all" || m == "fanout") pscore::bench::RunFanout(cfg);
  return 0;
}
