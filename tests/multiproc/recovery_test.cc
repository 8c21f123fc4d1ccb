// Scheduler restart recovery with the real pscore-node binary: a scheduler with
// --state_dir is SIGKILLed and restarted on the same port; the servers and workers (never
// restarted) re-register, keep their ranks, the cluster is READY again, server parameters
// and KV entries survive. A damaged state file makes the scheduler exit 1 naming the file
// (or, with --state_reset_on_corrupt, start fresh). Losing a scheduler that runs without
// --state_dir is covered in membership_mp_test.cc. Children are killed by pid at the end.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pscore/core/state_file.h"
#include "pscore/node/worker/worker_node.h"
#include "multiproc/admin_probe.h"
#include "multiproc/process.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kIntervalMs = 100;
constexpr int kTimeoutMs = 3000;          // the restart must fit in it
constexpr int kConnectTimeoutMs = 20000;  // nodes keep retrying this long

std::vector<std::string> Timing(int timeout_ms = kTimeoutMs) {
  return {"--heartbeat_interval_ms=" + std::to_string(kIntervalMs),
          "--heartbeat_timeout_ms=" + std::to_string(timeout_ms),
          "--connect_timeout_ms=" + std::to_string(kConnectTimeoutMs)};
}

std::vector<std::string> SchedulerArgs(int port, const std::string& state_dir, const std::string& port_file,
                                       int timeout_ms = kTimeoutMs) {
  std::vector<std::string> argv = {NodeBinary(), "--role=scheduler", "--recoverable_roles=worker,server", "--scheduler_port=" + std::to_string(port),
                                   "--worker_num=2", "--server_num=2", "--state_dir=" + state_dir,
                                   "--port_file=" + port_file};
  for (auto& f : Timing(timeout_ms)) argv.push_back(f);
  return argv;
}

std::vector<std::string> MemberArgs(const std::string& role, const std::string& id, int port, int timeout_ms) {
  std::vector<std::string> argv = {NodeBinary(), "--role=" + role, "--node_id=" + id,
                                   "--scheduler_port=" + std::to_string(port), "--auto_finish=false"};
  for (auto& f : Timing(timeout_ms)) argv.push_back(f);
  return argv;
}

bool WaitForState(AdminProbe& admin, pb::ClusterState state, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    Result<pb::AdminResponse> r = admin.Call("status", 2s);
    if (r.ok() && r->cluster_state() == state) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// Waits until the state file parses and satisfies `ok` (the writer is asynchronous).
bool WaitForPersisted(const std::string& path, const std::function<bool(const pb::PersistedState&)>& ok,
                      std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    Result<pb::PersistedState> st = core::ParseState(ReadFile(path));
    if (st.ok() && ok(*st)) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

bool ReadyWithKey(const pb::PersistedState& st, const std::string& key) {
  if (st.cluster_state() != pb::CLUSTER_READY) return false;
  for (const pb::KvEntry& e : st.kv()) {
    if (e.key() == key) return true;
  }
  return false;
}

std::map<std::string, int> Ranks(const pb::AdminResponse& resp) {
  std::map<std::string, int> out;
  for (const pb::ServersMeta& m : resp.nodes()) out[m.node_id()] = m.rank_id();
  return out;
}

}  // namespace

TEST_CASE("a SIGKILLed scheduler restarted with its --state_dir resumes the job with no node restarted",
          "[multiproc][net]") {
  TempDir dir;
  REQUIRE(dir.ok());
  const std::string state_dir = dir.File("state");
  Process scheduler;
  REQUIRE(scheduler.Start(SchedulerArgs(0, state_dir, dir.File("sched.port")), dir.File("sched1.log")));
  const int port = ReadPortFile(dir.File("sched.port"), 10s);
  INFO(scheduler.Log());
  REQUIRE(port > 0);

  std::vector<std::unique_ptr<Process>> members;
  for (std::string spec : {"server:s0", "server:s1", "worker:w0"}) {
    const std::string role = spec.substr(0, spec.find(':'));
    const std::string id = spec.substr(spec.find(':') + 1);
    members.push_back(std::make_unique<Process>());
    REQUIRE(members.back()->Start(MemberArgs(role, id, port, kTimeoutMs), dir.File(id + ".log")));
  }
  // The second worker runs in this process: it pushes, pulls and uses the KV store.
  node::NodeOptions o;
  o.role = pb::WORKER;
  o.node_id = "w1";
  o.scheduler_port = port;
  o.heartbeat_interval = std::chrono::milliseconds(kIntervalMs);
  o.connect_timeout = std::chrono::milliseconds(kConnectTimeoutMs);
  o.request_timeout = 10s;
  node::WorkerNode worker(o);
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(15s).ok());

  const std::vector<uint64_t> keys = {1, 2, 3, 1000, 1u << 30, 1ull << 40};
  std::vector<float> values;
  for (size_t i = 0; i < keys.size() * 4; ++i) values.push_back(0.5f * static_cast<float>(i));
  REQUIRE(worker.Push(keys, values).get().ok());
  REQUIRE(worker.KvSet("job/config", "lr=0.1").ok());
  REQUIRE(worker.KvSet("job/step", "17").ok());

  // An operator follows the rank table through the restart.
  Process watch;
  REQUIRE(watch.Start({AdminBinary(), "--scheduler_port=" + std::to_string(port), "--reconnect_ms=20000",
                       "watch-ranktable"},
                      dir.File("watch.log")));
  auto lines = [&watch] {
    const std::string log = watch.Log();
    return static_cast<size_t>(std::count(log.begin(), log.end(), '\n'));
  };
  for (int i = 0; i < 400 && lines() == 0; ++i) std::this_thread::sleep_for(25ms);
  REQUIRE(lines() > 0);

  AdminProbe admin1(port);
  Result<pb::AdminResponse> before = admin1.Call("nodes");
  REQUIRE(before.ok());
  REQUIRE(before->nodes_size() == 4);
  REQUIRE(WaitForPersisted(state_dir + "/scheduler.state",
                           [](const pb::PersistedState& st) { return ReadyWithKey(st, "job/step"); }, 5s));

  scheduler.Signal(SIGKILL);
  REQUIRE(scheduler.Wait(5s).has_value());
  Process restarted;
  REQUIRE(restarted.Start(SchedulerArgs(port, state_dir, dir.File("sched2.port")), dir.File("sched2.log")));
  REQUIRE(ReadPortFile(dir.File("sched2.port"), 10s) == port);

  AdminProbe admin2(port);
  INFO(restarted.Log());
  REQUIRE(WaitForState(admin2, pb::CLUSTER_READY, 10s));
  // READY is restored at once; every node re-registers as a harmless retry (same
  // incarnation), and none is reported as restarted.
  for (std::string id : {"s0", "s1", "w0", "w1"}) {
    const auto until = Clock::now() + 10s;
    const std::string line = id + " registered as rank";
    while (Clock::now() < until && restarted.Log().find(line) == std::string::npos) {
      std::this_thread::sleep_for(20ms);
    }
    INFO(id);
    CHECK(restarted.Log().find(line) != std::string::npos);
  }
  CHECK(restarted.Log().find("restored from") != std::string::npos);
  CHECK(restarted.Log().find("restarted (new incarnation)") == std::string::npos);
  Result<pb::AdminResponse> after = admin2.Call("nodes");
  REQUIRE(after.ok());
  CHECK(after->cluster_state() == pb::CLUSTER_READY);
  CHECK(Ranks(*after) == Ranks(*before));
  CHECK(after->epoch() > before->epoch());
  for (std::string id : {"s0", "s1", "w0", "w1"}) {
    const pb::ServersMeta* b = AdminProbe::FindNode(*before, id);
    const pb::ServersMeta* a = AdminProbe::FindNode(*after, id);
    REQUIRE(b != nullptr);
    REQUIRE(a != nullptr);
    CHECK(a->incarnation() == b->incarnation());  // the same processes
    CHECK(a->is_alive());
  }
  for (auto& m : members) CHECK(m->running());  // no worker or server restarted

  // The watcher lost its stream, subscribed again and printed the restored table.
  {
    const auto until = Clock::now() + 10s;
    while (Clock::now() < until && watch.Log().find("stream regained") == std::string::npos) {
      std::this_thread::sleep_for(20ms);
    }
    INFO(watch.Log());
    CHECK(watch.running());
    CHECK(watch.Log().find("stream regained") != std::string::npos);
    const std::string log = watch.Log();
    const size_t last_table = log.rfind("{\"");
    REQUIRE(last_table != std::string::npos);
    CHECK(log.find("\"status\":\"completed\"", last_table) != std::string::npos);
    watch.Signal(SIGTERM);
    std::optional<int> code = watch.Wait(10s);
    REQUIRE(code.has_value());
    CHECK(*code == 0);
  }

  // Parameters and KV entries survived; the data plane still works.
  Result<node::PullResult> pulled = worker.Pull(keys).get();
  REQUIRE(pulled.ok());
  CHECK(pulled->values == values);
  Result<std::string> step = worker.KvTryGet("job/step");
  REQUIRE(step.ok());
  CHECK(*step == "17");
  Result<std::string> cfg = worker.KvTryGet("job/config");
  REQUIRE(cfg.ok());
  CHECK(*cfg == "lr=0.1");
  REQUIRE(worker.Push(keys, values).get().ok());
  pulled = worker.Pull(keys).get();
  REQUIRE(pulled.ok());
  CHECK(pulled->values[1] == 2 * values[1]);
  CHECK(WaitForState(admin2, pb::CLUSTER_READY, 1s));

  worker.Stop();
}

TEST_CASE("a damaged state file stops the scheduler with exit 1 naming the file, unless told to reset",
          "[multiproc][net]") {
  TempDir dir;
  REQUIRE(dir.ok());
  const std::string state_dir = dir.File("state");
  REQUIRE(std::filesystem::create_directories(state_dir));
  const std::string path = state_dir + "/scheduler.state";
  {
    std::ofstream out(path, std::ios::binary);
    out << "PSST this is not a state file";
  }
  Process bad;
  REQUIRE(bad.Start(SchedulerArgs(0, state_dir, dir.File("bad.port")), dir.File("bad.log")));
  std::optional<int> code = bad.Wait(10s);
  INFO(bad.Log());
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK(bad.Log().find(path) != std::string::npos);
  CHECK(bad.Log().find("--state_reset_on_corrupt") != std::string::npos);

  std::vector<std::string> argv = SchedulerArgs(0, state_dir, dir.File("reset.port"));
  argv.push_back("--state_reset_on_corrupt");
  Process reset;
  REQUIRE(reset.Start(argv, dir.File("reset.log")));
  INFO(reset.Log());
  REQUIRE(ReadPortFile(dir.File("reset.port"), 10s) > 0);
  CHECK(std::filesystem::exists(path + ".corrupt"));
  // A fresh, valid file replaced the damaged one.
  const auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline && !core::ParseState(ReadFile(path)).ok()) std::this_thread::sleep_for(10ms);
  Result<pb::PersistedState> fresh = core::ParseState(ReadFile(path));
  REQUIRE(fresh.ok());
  CHECK(fresh->nodes_size() == 0);
  CHECK(fresh->cluster_state() == pb::ClUSTER_STARTING);
}

TEST_CASE("after a scheduler restart, a node that does not come back times out as usual",
          "[multiproc][net]") {
  // kTimeoutMs, not less: the members that live on must register again with the restarted
  // scheduler within it, and a member's redials back off to one a second while it is down.
  TempDir dir;
  REQUIRE(dir.ok());
  const std::string state_dir = dir.File("state");
  Process scheduler;
  REQUIRE(scheduler.Start(SchedulerArgs(0, state_dir, dir.File("s.port"), kTimeoutMs), dir.File("s1.log")));
  const int port = ReadPortFile(dir.File("s.port"), 10s);
  REQUIRE(port > 0);
  std::map<std::string, std::unique_ptr<Process>> members;
  for (std::string spec : {"server:s0", "server:s1", "worker:w0", "worker:w1"}) {
    const std::string role = spec.substr(0, spec.find(':'));
    const std::string id = spec.substr(spec.find(':') + 1);
    members[id] = std::make_unique<Process>();
    REQUIRE(members[id]->Start(MemberArgs(role, id, port, kTimeoutMs), dir.File(id + ".log")));
  }
  AdminProbe admin1(port);
  REQUIRE(WaitForState(admin1, pb::CLUSTER_READY, 15s));
  Result<pb::AdminResponse> before = admin1.Call("nodes");
  REQUIRE(before.ok());
  REQUIRE(WaitForPersisted(
      state_dir + "/scheduler.state",
      [](const pb::PersistedState& st) { return st.cluster_state() == pb::CLUSTER_READY && st.nodes_size() == 4; },
      5s));

  scheduler.Signal(SIGKILL);
  members["w1"]->Signal(SIGKILL);  // dies while the scheduler is down
  REQUIRE(scheduler.Wait(5s).has_value());
  REQUIRE(members["w1"]->Wait(5s).has_value());
  Process restarted;
  REQUIRE(restarted.Start(SchedulerArgs(port, state_dir, dir.File("s2.port"), kTimeoutMs), dir.File("s2.log")));
  REQUIRE(ReadPortFile(dir.File("s2.port"), 10s) == port);
  AdminProbe admin2(port);
  INFO(restarted.Log());
  // Restored READY, then NODE_TIMEOUT once w1's restored heartbeat budget runs out.
  REQUIRE(WaitForState(admin2, pb::NODE_TIMEOUT, 10s));
  Result<pb::AdminResponse> during = admin2.Call("nodes");
  REQUIRE(during.ok());
  for (const pb::ServersMeta& m : during->nodes()) {
    INFO(m.node_id());
    CHECK(m.is_alive() == (m.node_id() != "w1"));
  }
  for (const char* id : {"s0", "s1", "w0"}) CHECK(members[id]->running());

  // w1 restarted with its id: the same rank, READY again.
  members["w1"] = std::make_unique<Process>();
  REQUIRE(members["w1"]->Start(MemberArgs("worker", "w1", port, kTimeoutMs), dir.File("w1b.log")));
  REQUIRE(WaitForState(admin2, pb::CLUSTER_READY, 10s));
  Result<pb::AdminResponse> after = admin2.Call("nodes");
  REQUIRE(after.ok());
  CHECK(Ranks(*after) == Ranks(*before));
}

}  // namespace pscore::testing
