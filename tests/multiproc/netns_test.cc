// A job across network namespaces the test creates itself: the scheduler and a worker in
// the root namespace on one end of a veth pair (10.R.S.1/24), a server in a fresh
// namespace on the other end (10.R.S.2/24), started with `ip netns exec`. The test cuts
// the server's link (`ip link set DEV down` inside its namespace), checks that the
// scheduler times the server out, brings the link back and checks that the same server
// process rejoins with its rank and the cluster is READY again. Without the privilege to
// create namespaces the test WARNs and returns. The namespace (and with it the veth pair)
// is deleted by a RAII guard, and every child is SIGKILLed by pid, even on failure.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pscore/node/common/admin_client.h"
#include "multiproc/process.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Runs a command (no shell) and returns its exit code; output goes to log_path.
int Run(const std::vector<std::string>& argv, const std::string& log_path) {
  Process p;
  if (!p.Start(argv, log_path)) return -1;
  std::optional<int> code = p.Wait(10s);
  return code.value_or(-1);
}

// A network namespace and a veth pair (one end in the root namespace), removed at destruction.
class NetNs {
 public:
  NetNs(const std::string& log) : log_(log) {
    const int pid = static_cast<int>(::getpid());
    name_ = "pscore-" + std::to_string(pid);
    root_dev_ = "psr" + std::to_string(pid);  // interface names: at most 15 bytes
    ns_dev_ = "psn" + std::to_string(pid);
    const std::string subnet = "10." + std::to_string(100 + pid % 100) + "." + std::to_string((pid / 100) % 250);
    root_ip_ = subnet + ".1";
    ns_ip_ = subnet + ".2";
    created_ = Run({"/usr/sbin/ip", "netns", "add", name_}, log_) == 0;
  }
  ~NetNs() {
    if (!created_) return;
    Run({"/usr/sbin/ip", "link", "del", root_dev_}, log_);  // also removes the peer end
    Run({"/usr/sbin/ip", "netns", "del", name_}, log_);
  }
  NetNs(const NetNs&) = delete;
  NetNs& operator=(const NetNs&) = delete;

  bool created() const { return created_; }
  // Creates the veth pair, moves one end into the namespace, addresses and brings up both.
  bool Wire() {
    const std::string ip = "/usr/sbin/ip";
    return Run({ip, "link", "add", root_dev_, "type", "veth", "peer", "name", ns_dev_}, log_) == 0 &&
           Run({ip, "link", "set", ns_dev_, "netns", name_}, log_) == 0 &&
           Run({ip, "addr", "add", root_ip_ + "/24", "dev", root_dev_}, log_) == 0 &&
           Run({ip, "link", "set", root_dev_, "up"}, log_) == 0 &&
           Run({ip, "-n", name_, "addr", "add", ns_ip_ + "/24", "dev", ns_dev_}, log_) == 0 &&
           Run({ip, "-n", name_, "link", "set", ns_dev_, "up"}, log_) == 0 &&
           Run({ip, "-n", name_, "link", "set", "lo", "up"}, log_) == 0;
  }
  bool SetLink(bool up) {
    return Run({"/usr/sbin/ip", "-n", name_, "link", "set", ns_dev_, up ? "up" : "down"}, log_) == 0;
  }
  const std::string& name() const { return name_; }
  const std::string& root_ip() const { return root_ip_; }
  const std::string& ns_ip() const { return ns_ip_; }

 private:
  std::string log_, name_, root_dev_, ns_dev_, root_ip_, ns_ip_;
  bool created_ = false;
};

const pb::ServersMeta* Find(const pb::AdminResponse& r, const std::string& id) {
  for (const pb::ServersMeta& m : r.nodes()) {
    if (m.node_id() == id) return &m;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("a server in another network namespace: a cut link is detected, the server rejoins when it is back",
          "[multiproc][net]") {
  TempDir dir;
  REQUIRE(dir.ok());
  NetNs ns(dir.File("ip.log"));
  if (!ns.created()) {
    WARN("netns test skipped: `ip netns add` failed (needs CAP_SYS_ADMIN / root): " << ReadFile(dir.File("ip.log")));
    return;
  }
  INFO(ReadFile(dir.File("ip.log")));
  REQUIRE(ns.Wire());

  const std::vector<std::string> timing = {"--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=1000",
                                           "--connect_timeout_ms=30000"};
  Process scheduler;
  std::vector<std::string> argv = {NodeBinary(), "--role=scheduler", "--host=" + ns.root_ip(), "--scheduler_port=0",
                                    "--worker_num=1", "--server_num=1", "--port_file=" + dir.File("sched.port")};
  argv.insert(argv.end(), timing.begin(), timing.end());
  REQUIRE(scheduler.Start(argv, dir.File("scheduler.log")));
  const int port = ReadPortFile(dir.File("sched.port"), 10s);
  INFO(scheduler.Log());
  REQUIRE(port > 0);

  Process server, worker;
  argv = {"/usr/sbin/ip", "netns", "exec", ns.name(), NodeBinary(), "--role=server", "--node_id=s0",
          "--host=" + ns.ns_ip(), "--scheduler_host=" + ns.root_ip(), "--scheduler_port=" + std::to_string(port),
          "--auto_finish=false"};
  argv.insert(argv.end(), timing.begin(), timing.end());
  REQUIRE(server.Start(argv, dir.File("server.log")));
  argv = {NodeBinary(), "--role=worker", "--node_id=w0", "--host=" + ns.root_ip(),
          "--scheduler_host=" + ns.root_ip(), "--scheduler_port=" + std::to_string(port), "--auto_finish=false"};
  argv.insert(argv.end(), timing.begin(), timing.end());
  REQUIRE(worker.Start(argv, dir.File("worker.log")));

  node::AdminClientOptions o;
  o.scheduler_host = ns.root_ip();
  o.scheduler_port = port;
  o.timeout = 5s;
  node::AdminClient admin(o);
  REQUIRE(admin.Connect().ok());
  INFO(server.Log());
  REQUIRE(admin.WaitForReady(15s).ok());
  Result<pb::AdminResponse> before = admin.Admin("nodes");
  REQUIRE(before.ok());
  const pb::ServersMeta* s0 = Find(*before, "s0");
  REQUIRE(s0 != nullptr);
  CHECK(s0->ip() == ns.ns_ip());  // it really lives in the other namespace
  const int rank = s0->rank_id();

  // Cut the link: the scheduler times the server out.
  REQUIRE(ns.SetLink(false));
  const auto cut = Clock::now();
  bool timed_out = false;
  while (!timed_out && Clock::now() - cut < 10s) {
    Result<pb::AdminResponse> r = admin.Admin("nodes");
    const pb::ServersMeta* m = r.ok() ? Find(*r, "s0") : nullptr;
    timed_out = m != nullptr && !m->is_alive() && r->cluster_state() == pb::NODE_TIMEOUT;
    if (!timed_out) std::this_thread::sleep_for(50ms);
  }
  REQUIRE(timed_out);
  std::this_thread::sleep_for(500ms);
  CHECK(server.running());  // it keeps retrying (connect timeout 30 s)

  // Bring it back: the same process rejoins with its rank.
  REQUIRE(ns.SetLink(true));
  const auto back = Clock::now();
  bool ready = false;
  Result<pb::AdminResponse> after = Status(Code::kTimeout, "");
  while (!ready && Clock::now() - back < 20s) {
    after = admin.Admin("nodes");
    const pb::ServersMeta* m = after.ok() ? Find(*after, "s0") : nullptr;
    ready = m != nullptr && m->is_alive() && after->cluster_state() == pb::CLUSTER_READY;
    if (!ready) std::this_thread::sleep_for(50ms);
  }
  INFO(server.Log());
  REQUIRE(ready);
  const pb::ServersMeta* a = Find(*after, "s0");
  CHECK(a->rank_id() == rank);
  CHECK(a->incarnation() == s0->incarnation());  // no restart: the same process
  CHECK(server.running());
  CHECK(worker.running());
  CHECK(scheduler.Log().find("s0 (rank " + std::to_string(rank) + ") timed out") != std::string::npos);
}

}  // namespace pscore::testing
