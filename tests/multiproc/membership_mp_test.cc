// Multi-process membership tests with the real pscore-node binary: a job of 1 + 2 + 2
// processes finishes with exit code 0; a SIGKILLed server is reported to the others and
// takes its rank back when restarted; a SIGKILLed scheduler makes every node exit
// non-zero within its connect timeout. Results are read through the admin command and
// an in-process worker's callbacks; every child is killed by pid when the test ends.
#include <chrono>
#include <condition_variable>
#include <optional>
#include <thread>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pscore/node/worker/worker_node.h"
#include "multiproc/admin_probe.h"
#include "multiproc/process.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kIntervalMs = 100;
constexpr int kTimeoutMs = 600;
constexpr int kConnectTimeoutMs = 1500;

std::vector<std::string> Timing() {
  return {"--heartbeat_interval_ms=" + std::to_string(kIntervalMs),
          "--heartbeat_timeout_ms=" + std::to_string(kTimeoutMs),
          "--connect_timeout_ms=" + std::to_string(kConnectTimeoutMs)};
}

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// One job's processes and their logs. Children die with the object.
class Job {
 public:
  Job() { REQUIRE(dir_.ok()); }

  // Starts the scheduler and returns its port (read from --port_file).
  int StartScheduler(int workers, int servers) {
    std::vector<std::string> argv = {NodeBinary(), "--role=scheduler", "--recoverable_roles=worker,server", "--scheduler_port=0",
                                     "--worker_num=" + std::to_string(workers),
                                     "--server_num=" + std::to_string(servers),
                                     "--port_file=" + dir_.File("scheduler.port")};
    for (auto& f : Timing()) argv.push_back(f);
    REQUIRE(scheduler_.Start(argv, dir_.File("scheduler.log")));
    port_ = ReadPortFile(dir_.File("scheduler.port"), 10s);
    INFO(scheduler_.Log());
    REQUIRE(port_ > 0);
    return port_;
  }

  // Starts a worker or server process; returns its index in members().
  size_t StartMember(const std::string& role, const std::string& node_id, bool auto_finish) {
    std::vector<std::string> argv = {NodeBinary(), "--role=" + role, "--node_id=" + node_id,
                                     "--scheduler_port=" + std::to_string(port_),
                                     std::string("--auto_finish=") + (auto_finish ? "true" : "false")};
    for (auto& f : Timing()) argv.push_back(f);
    members_.push_back(std::make_unique<Process>());
    REQUIRE(members_.back()->Start(argv, dir_.File(node_id + "." + std::to_string(members_.size()) + ".log")));
    return members_.size() - 1;
  }

  // Polls the admin "status" until the cluster is in `state`; false at the deadline.
  bool WaitForState(AdminProbe& admin, pb::ClusterState state, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      Result<pb::AdminResponse> r = admin.Call("status", 2s);
      if (r.ok() && r->cluster_state() == state) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  Process& scheduler() { return scheduler_; }
  Process& member(size_t i) { return *members_[i]; }
  size_t size() const { return members_.size(); }
  int port() const { return port_; }

 private:
  TempDir dir_;
  Process scheduler_;
  std::vector<std::unique_ptr<Process>> members_;
  int port_ = 0;
};

// Collects the cluster events seen by an in-process node (any thread).
class EventLog {
 public:
  void Add(const pb::ClusterEventMessage& ev) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back({ev, Clock::now()});
    cv_.notify_all();
  }
  // Waits for an event of `kind` about node_id; the time it arrived, or nullopt.
  std::optional<Clock::time_point> Wait(pb::ClusterEventMessage::Kind kind, const std::string& node_id,
                                        std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<Clock::time_point> at;
    cv_.wait_for(lock, timeout, [&] {
      for (auto& [ev, t] : events_) {
        if (ev.kind() == kind && ev.node_id() == node_id) at = t;
      }
      return at.has_value();
    });
    return at;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<pb::ClusterEventMessage, Clock::time_point>> events_;
};

}  // namespace

TEST_CASE("pscore-node refuses bad flags with one line and exit code 2 - help exits 0", "[multiproc]") {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--role=nope"}, "--role must be scheduler, worker or server (got 'nope')"},
      {{"--role=scheduler", "--server_num=70000"}, "--worker_num and --server_num must be in [0, 65536]"},
      {{"--role=scheduler", "--worker_num=-1"}, "--worker_num and --server_num must be in [0, 65536]"},
      {{"--role=scheduler", "--worker_num=two"}, "bad value 'two' for --worker_num (int32)"},
      {{"--role=scheduler", "--worker_num", "two"}, "bad value 'two' for --worker_num (int32)"},
      {{"--role=worker", "--heartbeat_interval_ms=1.5"}, "bad value '1.5' for --heartbeat_interval_ms (int32)"},
      {{"--role=worker", "--scheduler_port=70000"}, "--scheduler_port must be in [0, 65535] (got 70000)"},
      {{"--role=scheduler", "--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=50"},
       "--heartbeat_timeout_ms (50) must be greater than --heartbeat_interval_ms (100)"},
      {{"--role=worker", "--no_such_flag=1"}, "unknown flag --no_such_flag=1 (see --help)"},
      {{"--role=server", "--stream_spare_mb=2000000"}, "--stream_spare_mb must be <= 1048576"},
      {{"--role=scheduler", "--max_kv_value_bytes=0"}, "--max_kv_value_bytes must be in [1, --max_message_bytes]"},
      {{"--role=scheduler", "--max_message_bytes=4096", "--max_kv_value_bytes=8192"},
       "--max_kv_value_bytes must be in [1, --max_message_bytes]"},
      {{"--role=scheduler", "--max_kv_total_mb=2000000000"}, "--max_kv_total_mb must be <= 1073741824"},
      {{"--role=scheduler", "--scale_timeout_ms=0"}, "--scale_timeout_ms must be > 0"},
      {{"--role=scheduler", "--recoverable_roles=worker,chief"}, "--recoverable_roles: unknown role 'chief' (worker, server)"},
      {{"--role=server", "--handler_threads=100000"}, "--handler_threads must be in [0, 1024]"},
      {{"--role=worker", "--poll_spin_us=100001"}, "--poll_spin_us must be in [0, 100000]"},
      {{"--role=server", "--poll_spin_us=-1"}, "--poll_spin_us must be in [0, 100000]"},
      // A negative value after a space is the flag's value, not a flag (before: "unknown flag -5").
      {{"--role=worker", "--rank", "-5"}, "--rank must be >= -1"},
      // A deadline of now + 2^63 ms would overflow the steady clock.
      {{"--role=worker", "--finish_timeout_ms=9223372036854775807"},
       "--finish_timeout_ms must be in [1, 4398046511104] (got 9223372036854775807)"},
  };
  TempDir dir;
  REQUIRE(dir.ok());
  int n = 0;
  for (const Case& c : cases) {
    std::vector<std::string> argv = {NodeBinary()};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    Process p;
    const std::string log = dir.File("bad" + std::to_string(n++) + ".log");
    REQUIRE(p.Start(argv, log));
    std::optional<int> code = p.Wait(10s);
    INFO(c.says);
    REQUIRE(code.has_value());
    CHECK(*code == 2);
    CHECK(p.Log() == "pscore-node: " + c.says + "\n");
  }
  Process help;
  REQUIRE(help.Start({NodeBinary(), "--help"}, dir.File("help.log")));
  std::optional<int> code = help.Wait(10s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  const std::string text = help.Log();
  CHECK(text.find("-heartbeat_timeout_ms") != std::string::npos);
  CHECK(text.find("-logtostderr") == std::string::npos);  // glog's flags only with --helpfull
}

TEST_CASE("1 scheduler + 2 servers + 2 workers as processes reach READY and all exit 0", "[multiproc][net][tlspass]") {
  Job job;
  job.StartScheduler(2, 2);
  job.StartMember("server", "s0", true);
  job.StartMember("server", "s1", true);
  job.StartMember("worker", "w0", true);
  job.StartMember("worker", "w1", true);
  // Each member joins the finish barrier once READY, so every exit code 0 means the job
  // reached READY and passed the barrier.
  for (size_t i = 0; i < job.size(); ++i) {
    std::optional<int> code = job.member(i).Wait(20s);
    INFO(job.member(i).Log());
    REQUIRE(code.has_value());
    CHECK(*code == 0);
  }
  std::optional<int> code = job.scheduler().Wait(10s);
  INFO(job.scheduler().Log());
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(job.scheduler().Log().find("cluster state CLUSTER_READY") != std::string::npos);
}

TEST_CASE("a SIGKILLed server is reported to the others and takes its rank back on restart",
          "[multiproc][net][tlspass]") {
  Job job;
  const int port = job.StartScheduler(2, 2);
  job.StartMember("server", "s0", false);
  const size_t s1 = job.StartMember("server", "s1", false);
  job.StartMember("worker", "w0", false);

  // The second worker runs in this process so the test sees what a node is told.
  EventLog events;
  node::NodeOptions o;
  o.role = pb::WORKER;
  o.node_id = "w1";
  o.tls = TestTlsContext("w1");
  o.scheduler_port = port;
  o.heartbeat_interval = std::chrono::milliseconds(kIntervalMs);
  o.connect_timeout = std::chrono::milliseconds(kConnectTimeoutMs);
  node::WorkerNode worker(o);
  node::Node::Callbacks cb;
  cb.on_cluster_event = [&events](const pb::ClusterEventMessage& ev) { events.Add(ev); };
  worker.SetCallbacks(cb);
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(15s).ok());

  AdminProbe admin(port);
  Result<pb::AdminResponse> before = admin.Call("nodes");
  REQUIRE(before.ok());
  CHECK(before->cluster_state() == pb::CLUSTER_READY);
  REQUIRE(before->nodes_size() == 4);
  const pb::ServersMeta* rec = AdminProbe::FindNode(*before, "s1");
  REQUIRE(rec != nullptr);
  const int rank = rec->rank_id();
  const uint64_t incarnation = rec->incarnation();
  CHECK(rec->is_alive());

  const auto killed = Clock::now();
  job.member(s1).Signal(SIGKILL);
  // Bound: silent for the timeout, plus the scheduler's check period (< one interval),
  // plus slack for process scheduling on a loaded machine.
  const auto bound = std::chrono::milliseconds(kTimeoutMs + kIntervalMs + 400);
  std::optional<Clock::time_point> told = events.Wait(pb::ClusterEventMessage::NODE_TIMED_OUT, "s1", 10s);
  REQUIRE(told.has_value());
  const auto latency = std::chrono::duration_cast<std::chrono::milliseconds>(*told - killed);
  INFO("kill -> NODE_TIMED_OUT at the in-process worker: " << latency.count() << " ms");
  CHECK(latency <= bound);

  Result<pb::AdminResponse> during = admin.Call("nodes");
  REQUIRE(during.ok());
  CHECK(during->cluster_state() == pb::NODE_TIMEOUT);
  rec = AdminProbe::FindNode(*during, "s1");
  REQUIRE(rec != nullptr);
  CHECK_FALSE(rec->is_alive());
  CHECK(rec->state() == pb::NODE_TIMED_OUT);

  // Restart with the same node id: same rank, a new incarnation, the cluster READY again.
  job.StartMember("server", "s1", false);
  REQUIRE(job.WaitForState(admin, pb::CLUSTER_READY, 15s));
  Result<pb::AdminResponse> after = admin.Call("nodes");
  REQUIRE(after.ok());
  rec = AdminProbe::FindNode(*after, "s1");
  REQUIRE(rec != nullptr);
  CHECK(rec->rank_id() == rank);
  CHECK(rec->incarnation() != incarnation);
  CHECK(rec->is_alive());
  CHECK(events.Wait(pb::ClusterEventMessage::NODE_RESTARTED, "s1", 5s).has_value());
  CHECK(events.Wait(pb::ClusterEventMessage::NODE_RECOVERED, "s1", 5s).has_value());
  worker.Stop();
}

TEST_CASE("a SIGKILLed scheduler makes every node exit non-zero within its connect timeout",
          "[multiproc][net]") {
  Job job;
  const int port = job.StartScheduler(2, 2);
  job.StartMember("server", "s0", false);
  job.StartMember("server", "s1", false);
  job.StartMember("worker", "w0", false);
  job.StartMember("worker", "w1", false);
  {
    AdminProbe admin(port);
    REQUIRE(job.WaitForState(admin, pb::CLUSTER_READY, 15s));
  }
  const auto killed = Clock::now();
  job.scheduler().Signal(SIGKILL);
  // Bound: the connect timeout, plus slack for the process to stop and be reaped.
  const auto bound = std::chrono::milliseconds(kConnectTimeoutMs + 2000);
  for (size_t i = 0; i < job.size(); ++i) {
    std::optional<int> code = job.member(i).Wait(bound - std::chrono::milliseconds(MsSince(killed)));
    const std::string log = job.member(i).Log();
    INFO(log);
    REQUIRE(code.has_value());  // no hang
    CHECK(*code == 4);  // the scheduler was lost after the member joined
    CHECK(log.find("cannot reach the scheduler") != std::string::npos);
  }
}

}  // namespace pscore::testing
