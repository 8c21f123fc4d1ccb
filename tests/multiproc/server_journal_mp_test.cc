// Server parameter journal with the real pscore-node binary: two servers with --data_dir,
// an in-process worker pushing +1 to 64 keys; a server is SIGKILLed (while pushes are in
// flight) and restarted with the same --node_id and --data_dir; once the cluster is READY
// again, every key holds at least the acknowledged pushes and at most the sent ones.
// Without --data_dir the restarted server comes back empty (the contrast the journal is
// for). Every child is killed by pid when the test ends.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pscore/node/worker/worker_node.h"
#include "multiproc/process.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kKeys = 64;

std::vector<std::string> Timing() {
  return {"--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=1000", "--connect_timeout_ms=10000"};
}

struct Counts {
  std::vector<int> sent = std::vector<int>(kKeys, 0);
  std::vector<int> acked = std::vector<int>(kKeys, 0);
};

// One round: +1 to every float of every key; counts what was sent and what was acknowledged.
void PushRound(node::WorkerNode& w, const std::vector<uint64_t>& keys, int floats, Counts* c) {
  for (int k = 0; k < kKeys; ++k) ++c->sent[k];
  auto f = w.Push(keys, std::vector<float>(static_cast<size_t>(kKeys) * floats, 1.0f));
  if (f.wait_for(30s) == std::future_status::ready && f.get().ok()) {
    for (int k = 0; k < kKeys; ++k) ++c->acked[k];
  }
}

bool WaitReady(node::WorkerNode& w, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (w.cluster_state() == pb::CLUSTER_READY) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// `kills` times: s0 SIGKILLed during a burst of pushes and restarted as the same node.
// Each key holds `floats` floats; `server_flags` go to both servers.
// s1, never killed, must have reached segment `min_segment` (compactions started).
void RunKillRestart(bool journal, int floats = 1, const std::vector<std::string>& server_flags = {}, int kills = 1,
                    uint64_t min_segment = 1) {
  TempDir dir;
  REQUIRE(dir.ok());
  Process scheduler;
  std::vector<std::string> argv = {NodeBinary(), "--role=scheduler", "--recoverable_roles=worker,server", "--scheduler_port=0", "--worker_num=1",
                                   "--server_num=2", "--port_file=" + dir.File("sched.port")};
  for (auto& f : Timing()) argv.push_back(f);
  REQUIRE(scheduler.Start(argv, dir.File("scheduler.log")));
  const int port = ReadPortFile(dir.File("sched.port"), 10s);
  REQUIRE(port > 0);
  auto server_argv = [&](const std::string& id) {
    std::vector<std::string> a = {NodeBinary(), "--role=server", "--node_id=" + id,
                                  "--scheduler_port=" + std::to_string(port), "--auto_finish=false"};
    if (journal) a.push_back("--data_dir=" + dir.File(id + ".data"));
    for (auto& f : Timing()) a.push_back(f);
    for (auto& f : server_flags) a.push_back(f);
    return a;
  };
  auto s0 = std::make_unique<Process>();
  Process s1;
  REQUIRE(s0->Start(server_argv("s0"), dir.File("s0.log")));
  REQUIRE(s1.Start(server_argv("s1"), dir.File("s1.log")));

  node::NodeOptions o;
  o.node_id = "w0";
  o.scheduler_port = port;
  o.heartbeat_interval = 100ms;
  o.connect_timeout = 10s;
  o.request_timeout = 10s;
  node::WorkerNode worker(o);
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(20s).ok());
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < kKeys; ++k) keys.push_back(k * 7919);

  Counts c;
  for (int i = 0; i < 50; ++i) PushRound(worker, keys, floats, &c);
  REQUIRE(c.acked == c.sent);
  for (int kill = 0; kill < kills; ++kill) {
    // Kill s0 while a burst of pushes is in flight, then restart it as the same node.
    std::vector<std::future<Status>> burst;
    for (int i = 0; i < 20; ++i) {
      for (int k = 0; k < kKeys; ++k) ++c.sent[k];
      burst.push_back(worker.Push(keys, std::vector<float>(static_cast<size_t>(kKeys) * floats, 1.0f)));
    }
    s0->Signal(SIGKILL);
    for (auto& f : burst) {
      REQUIRE(f.wait_for(30s) == std::future_status::ready);
      if (f.get().ok()) {
        for (int k = 0; k < kKeys; ++k) ++c.acked[k];
      }
    }
    s0 = std::make_unique<Process>();
    REQUIRE(s0->Start(server_argv("s0"), dir.File("s0.restarted" + std::to_string(kill) + ".log")));
    // READY again once the restarted s0 registered (it may be seen timed out first); the
    // worker's READY alone may be the one from before the kill.
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (s0->running() && s0->Log().find("registered as rank") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    INFO(s0->Log());
    REQUIRE(s0->Log().find("registered as rank") != std::string::npos);
    REQUIRE(WaitReady(worker, 20s));
    for (int i = 0; i < 30; ++i) {
      // A push may still meet the old link's failure once; it then counts as not acked.
      PushRound(worker, keys, floats, &c);
    }
  }
  auto pulled = worker.Pull(keys);
  REQUIRE(pulled.wait_for(30s) == std::future_status::ready);
  Result<node::PullResult> r = pulled.get();
  REQUIRE(r.ok());
  REQUIRE(r->values.size() == static_cast<size_t>(kKeys) * floats);
  int lost = 0;
  int torn = 0;
  for (int k = 0; k < kKeys; ++k) {
    const float v = r->values[static_cast<size_t>(k) * floats];
    INFO("key " << keys[k] << ": value " << v << ", acked " << c.acked[k] << ", sent " << c.sent[k]);
    if (journal) {
      CHECK(v >= c.acked[k]);
      CHECK(v <= c.sent[k]);
    }
    if (v < c.acked[k]) ++lost;
    for (int i = 1; i < floats; ++i) torn += r->values[static_cast<size_t>(k) * floats + i] != v;
  }
  CHECK(torn == 0);  // a push is applied whole or not at all, also across a restart
  if (journal) {
    CHECK(lost == 0);
    CHECK_THAT(s0->Log(), Catch::Contains("keys restored"));
  } else {
    CHECK(lost > 0);  // s0's keys restarted from zero
  }
  if (journal) {
    // Compactions happened: each moves appends on to the next numbered segment.
    uint64_t newest = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.File("s1.data"))) {
      const std::string name = e.path().filename().string();
      const std::string prefix = "params.journal.";
      if (name.rfind(prefix, 0) == 0 && name.find_first_not_of("0123456789", prefix.size()) == std::string::npos) {
        newest = std::max<uint64_t>(newest, std::stoull(name.substr(prefix.size())));
      }
    }
    INFO("s1's newest journal segment: " << newest);
    CHECK(newest >= min_segment);
  }
  worker.Stop();
  s0->Kill();
  s1.Kill();
  scheduler.Kill();
}

}  // namespace

TEST_CASE("a SIGKILLed server restarted with its --data_dir keeps every acknowledged push",
          "[multiproc][net][journal]") {
  RunKillRestart(/*journal=*/true);
}

TEST_CASE("a server SIGKILLed three times while its journal is compacted in the background keeps every acknowledged push",
          "[multiproc][net][journal]") {
  // 1,024 floats a key (128 KiB a push on each server) and a 1 MiB bound: a compaction
  // starts every few pushes, so the kills land before, during and after them.
  RunKillRestart(/*journal=*/true, 1024, {"--journal_compact_mb=1"}, 3, /*min_segment=*/5);
}

TEST_CASE("without --data_dir a SIGKILLed server comes back empty", "[multiproc][net][journal]") {
  RunKillRestart(/*journal=*/false);
}

}  // namespace pscore::testing
