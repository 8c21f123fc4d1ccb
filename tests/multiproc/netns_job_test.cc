// Multi-host on one machine: every process of a demo job on a host of its own. The test
// makes a bridge in the root namespace (10.A.B.1/24, the test's admin client lives there)
// and one network namespace per host, each joined to the bridge by a veth pair and given
// its own address (10.A.B.2 the scheduler, .3 and .4 the servers, .5 and .6 the trainers).
// It runs pscore-train across them, the first trainer asks for one more server at a step,
// and a new host (.7) is created for it mid-run; once the job is READY with 3 servers, one
// server's link is cut, and stays cut. What the system does, asserted: the scheduler
// times the server out (NODE_TIMEOUT); each trainer closes its link to it on that notice,
// so its request in flight there is sent again and given up --recovery_timeout_ms after its
// first send (not after the 60 s request timeout: a cut link closes nothing by itself);
// the trainer reports the error naming the server's address, and the job ends as failed
// (a server lost with replicas=1): trainers and scheduler exit 3.
// A second job runs with --replicas=2 (no scale-out): a server's link is cut for longer
// than the heartbeat timeout, then restored; the trainers' requests in flight to it go to
// its ranges' other replica once the scheduler marks it down, and the job ends as an
// undisturbed run (every trainer exits 0, loss and weights checksum within 1e-6). The same
// job with --replicas=1 has the scheduler's link cut instead: the scheduler takes every
// member's silence for its own isolation and times nobody out, the members redial it, and
// the job ends as undisturbed with every process exiting 0.
// A third job runs with --replicas=2 and a scale-out: once the scheduler is scaling, a
// server's link is cut for good (never restored) before the new server's host is started;
// the scheduler rolls the scale-out back and marks the server down, its ranges' backups
// carry the job on, and it ends as an undisturbed run (trainers, the other server and the
// scheduler exit 0; the server started for the scale-out, dropped by the rollback, exits
// with the job).
// A fourth job (replicas=1) cuts one trainer off from one server only: that server's host
// drops what it sends to the trainer, everyone else hears everyone. The trainer's link to
// the server stops carrying acknowledgements and closes after a heartbeat timeout; the
// scheduler still hears the server, so the trainer sends that server's parts through the
// other server, and once the cut is mended, straight to it again. The job ends as
// undisturbed, every process exiting 0.
// Without the privilege to create namespaces the test WARNs the reason and returns.
// Namespaces, veth pairs and the bridge are removed by RAII guards; every child is
// SIGKILLed by pid, even on failure.
#include <signal.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pscore/node/common/admin_client.h"
#include "multiproc/process.h"
#include "multiproc/train_job.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const char* kIp = "/usr/sbin/ip";

int Run(const std::vector<std::string>& argv, const std::string& log) {
  Process p;
  if (!p.Start(argv, log)) return -1;
  return p.Wait(10s).value_or(-1);
}

// A bridge in the root namespace with the test's own address on it; removed at destruction.
class Bridge {
 public:
  Bridge(const std::string& log) : log_(log) {
    const int pid = static_cast<int>(::getpid());
    name_ = "psb" + std::to_string(pid);
    subnet_ = "10." + std::to_string(200 + pid % 50) + "." + std::to_string((pid / 50) % 250);
    created_ = Run({kIp, "link", "add", name_, "type", "bridge"}, log_) == 0;
    if (created_) {
      up_ = Run({kIp, "addr", "add", Address(1) + "/24", "dev", name_}, log_) == 0 &&
            Run({kIp, "link", "set", name_, "up"}, log_) == 0;
    }
  }
  ~Bridge() {
    if (created_) Run({kIp, "link", "del", name_}, log_);
  }
  Bridge(const Bridge&) = delete;
  Bridge& operator=(const Bridge&) = delete;
  bool ok() const { return created_ && up_; }
  const std::string& name() const { return name_; }
  std::string Address(int host) const { return subnet_ + "." + std::to_string(host); }

 private:
  std::string log_, name_, subnet_;
  bool created_ = false, up_ = false;
};

// One host: a namespace whose eth0 is a veth pair's end, the other end on the bridge.
class Host {
 public:
  Host(const Bridge& bridge, int index, const std::string& log) : log_(log) {
    const int pid = static_cast<int>(::getpid());
    ns_ = "pscore-" + std::to_string(pid) + "-h" + std::to_string(index);
    dev_ = "pv" + std::to_string(pid) + "h" + std::to_string(index);  // at most 15 bytes
    ip_ = bridge.Address(index);
    created_ = Run({kIp, "netns", "add", ns_}, log_) == 0;
    if (!created_) return;
    wired_ = Run({kIp, "link", "add", dev_, "type", "veth", "peer", "name", "eth0", "netns", ns_}, log_) == 0 &&
             Run({kIp, "link", "set", dev_, "master", bridge.name()}, log_) == 0 &&
             Run({kIp, "link", "set", dev_, "up"}, log_) == 0 &&
             Run({kIp, "-n", ns_, "addr", "add", ip_ + "/24", "dev", "eth0"}, log_) == 0 &&
             Run({kIp, "-n", ns_, "link", "set", "eth0", "up"}, log_) == 0 &&
             Run({kIp, "-n", ns_, "link", "set", "lo", "up"}, log_) == 0;
  }
  ~Host() {
    if (!created_) return;
    Run({kIp, "link", "del", dev_}, log_);  // also removes eth0 in the namespace
    Run({kIp, "netns", "del", ns_}, log_);
  }
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;
  bool created() const { return created_; }
  bool ok() const { return created_ && wired_; }
  const std::string& ip() const { return ip_; }
  // argv run inside this host's namespace.
  std::vector<std::string> Exec(std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {kIp, "netns", "exec", ns_});
    return argv;
  }
  bool SetLink(bool up) { return Run({kIp, "-n", ns_, "link", "set", "eth0", up ? "up" : "down"}, log_) == 0; }
  // Drops (or, with on = false, stops dropping) what this host sends to `ip`: a peer there
  // hears this host fall silent, everyone else still hears it.
  bool Blackhole(const std::string& ip, bool on) {
    return Run({kIp, "-n", ns_, "route", on ? "add" : "del", "blackhole", ip + "/32"}, log_) == 0;
  }

 private:
  std::string log_, ns_, dev_, ip_;
  bool created_ = false, wired_ = false;
};

// Hosts 2..n+1 on `bridge`, their `ip` commands logged to `iplog`; false, after a WARN that
// says why, when this machine does not let the test create the bridge or a namespace.
bool MakeHosts(const Bridge& bridge, int n, const std::string& iplog, std::vector<std::unique_ptr<Host>>* hosts) {
  if (!bridge.ok()) {
    WARN("netns job test skipped: cannot create a bridge (needs root / CAP_NET_ADMIN): " << ReadFile(iplog));
    return false;
  }
  for (int i = 2; i <= n + 1; ++i) {
    hosts->push_back(std::make_unique<Host>(bridge, i, iplog));
    if (!hosts->back()->created()) {
      WARN("netns job test skipped: `ip netns add` failed (needs root / CAP_SYS_ADMIN): " << ReadFile(iplog));
      return false;
    }
    INFO(ReadFile(iplog));
    REQUIRE(hosts->back()->ok());
  }
  return true;
}

std::string TrainBinary() { return std::string(PSCORE_BIN_DIR) + "/pscore-train"; }

std::string StateLine(node::AdminClient& admin) {
  Result<pb::AdminResponse> r = admin.Admin("status");
  if (!r.ok()) return "";
  return pb::ClusterState_Name(r->cluster_state()) + " servers " + std::to_string(r->registered_servers()) + "/" +
         std::to_string(r->server_num());
}

// Both trainers exit 0 within 120 s, each with the final loss and weights of `plain` (the
// same job run undisturbed).
void CheckTrainersUndisturbed(Process (&trainers)[2], const std::vector<TrainFinal>& plain) {
  std::vector<TrainFinal> finals;
  for (int i = 0; i < 2; ++i) {
    std::optional<int> code = trainers[i].Wait(120s);
    INFO("worker" << i << ":\n" << trainers[i].Log());
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    finals.push_back(ParseTrainFinal(trainers[i].Log()));
    REQUIRE(finals.back().found);
  }
  CheckSameFinals(plain, finals);
}

// A job whose processes each run on a host of their own with the same timing flags: the
// scheduler on `sched_host`, servers (the sgd rule, learning rate 2) and trainers started
// on theirs, each logging to <id>.log in `dir`; and admin clients from the root namespace.
class HostJob {
 public:
  HostJob(const TempDir& dir, const Host& sched_host, std::vector<std::string> timing)
      : dir_(dir), sched_host_(sched_host), timing_(std::move(timing)) {}

  // The scheduler, with `flags` besides its host, port file and timing.
  void StartScheduler(std::vector<std::string> flags) {
    flags.insert(flags.begin(), {NodeBinary(), "--role=scheduler", "--host=" + sched_host_.ip(),
                                 "--scheduler_port=0", "--port_file=" + dir_.File("sched.port")});
    REQUIRE(scheduler.Start(sched_host_.Exec(Timed(std::move(flags))), dir_.File("scheduler.log")));
    port_ = ReadPortFile(dir_.File("sched.port"), 10s);
    INFO(scheduler.Log());
    REQUIRE(port_ > 0);
  }
  bool StartServer(Process* p, const Host& host, const std::string& id) const {
    return p->Start(host.Exec(Timed({NodeBinary(), "--role=server", "--node_id=" + id, "--host=" + host.ip(),
                                     "--scheduler_host=" + sched_host_.ip(),
                                     "--scheduler_port=" + std::to_string(port_), "--update_rule=sgd",
                                     "--learning_rate=2"})),
                    dir_.File(id + ".log"));
  }
  bool StartTrainer(Process* p, const Host& host, const std::string& id, std::vector<std::string> flags) const {
    flags.insert(flags.begin(), {TrainBinary(), "--node_id=" + id, "--host=" + host.ip(),
                                 "--scheduler_host=" + sched_host_.ip(), "--scheduler_port=" + std::to_string(port_)});
    return p->Start(host.Exec(Timed(std::move(flags))), dir_.File(id + ".log"));
  }
  // An admin client of the scheduler, connected.
  std::unique_ptr<node::AdminClient> Admin() const {
    node::AdminClientOptions o;
    o.scheduler_host = sched_host_.ip();  // the root namespace reaches it over the bridge
    o.scheduler_port = port_;
    o.timeout = 5s;
    auto admin = std::make_unique<node::AdminClient>(o);
    REQUIRE(admin->Connect().ok());
    return admin;
  }

  Process scheduler;

 private:
  std::vector<std::string> Timed(std::vector<std::string> argv) const {
    argv.insert(argv.end(), timing_.begin(), timing_.end());
    return argv;
  }

  const TempDir& dir_;
  const Host& sched_host_;
  const std::vector<std::string> timing_;
  int port_ = 0;
};

// A job of two servers and two trainers (`steps` steps), each process on a host of its own
// (the scheduler, the servers, the trainers), started with `timing` and the scheduler's
// `flags`; `before_trainers`, if given, runs once the servers run and before the trainers
// start. `plain` holds the finals of the same job run undisturbed. ok() is false, after a
// WARN, where the test may not create namespaces.
class TwoByTwoJob {
  // First: destroyed last, after every process of the job has been stopped.
  TempDir dir_;
  const std::string iplog_;
  Bridge bridge_;
  std::vector<std::unique_ptr<Host>> hosts_;
  std::unique_ptr<HostJob> job_;  // the scheduler

 public:
  TwoByTwoJob(int steps, std::vector<std::string> timing, std::vector<std::string> flags,
              const std::function<void(TwoByTwoJob&)>& before_trainers = nullptr)
      : iplog_(dir_.File("ip.log")), bridge_(iplog_) {
    REQUIRE(dir_.ok());
    if (!MakeHosts(bridge_, 5, iplog_, &hosts_)) return;
    TrainJobOptions plain_job;
    plain_job.steps = steps;
    plain = UndisturbedFinals(plain_job);
    job_ = std::make_unique<HostJob>(dir_, *hosts_[0], std::move(timing));
    flags.insert(flags.begin(), {"--worker_num=2", "--server_num=2"});
    job_->StartScheduler(std::move(flags));
    for (int i = 0; i < 2; ++i) REQUIRE(job_->StartServer(&servers[i], server_host(i), "server" + std::to_string(i)));
    if (before_trainers) before_trainers(*this);
    for (int i = 0; i < 2; ++i) {
      REQUIRE(job_->StartTrainer(&trainers[i], worker_host(i), "worker" + std::to_string(i),
                                 {"--steps=" + std::to_string(steps)}));
    }
    ok_ = true;
  }
  bool ok() const { return ok_; }
  Host& sched_host() { return *hosts_[0]; }
  Host& server_host(int i) { return *hosts_[1 + i]; }
  Host& worker_host(int i) { return *hosts_[3 + i]; }
  Process& scheduler() { return job_->scheduler; }

  // The trainers end as undisturbed, then the scheduler and servers exit 0, and the
  // scheduler timed nobody out.
  void CheckEndsWithNobodyLost() {
    CheckTrainersUndisturbed(trainers, plain);
    INFO(scheduler().Log());
    CHECK(scheduler().Wait(60s) == std::optional<int>(0));
    CHECK(scheduler().Log().find("timed out") == std::string::npos);
    for (Process& server : servers) {
      INFO(server.Log());
      CHECK(server.Wait(60s) == std::optional<int>(0));
    }
  }

  std::vector<TrainFinal> plain;
  Process servers[2];
  Process trainers[2];

 private:
  bool ok_ = false;
};

// Whether `p` logged `what` within `timeout` (false as soon as it exits without).
bool Logged(Process& p, const std::string& what, std::chrono::seconds timeout = 120s) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline && p.running() && p.Log().find(what) == std::string::npos) {
    std::this_thread::sleep_for(5ms);
  }
  return p.Log().find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("a demo job with every process on a host of its own: scale-out to a new host, then a server's link cut",
          "[multiproc][net][netns]") {
  TempDir dir;
  REQUIRE(dir.ok());
  const std::string iplog = dir.File("ip.log");
  Bridge bridge(iplog);
  std::vector<std::unique_ptr<Host>> hosts;
  if (!MakeHosts(bridge, 6, iplog, &hosts)) return;
  Host& sched_host = *hosts[0];
  Host* server_hosts[3] = {hosts[1].get(), hosts[2].get(), hosts[5].get()};
  Host* worker_hosts[2] = {hosts[3].get(), hosts[4].get()};

  HostJob job(dir, sched_host,
              {"--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=2000", "--connect_timeout_ms=30000"});
  job.StartScheduler({"--worker_num=2", "--server_num=2"});
  Process& scheduler = job.scheduler;
  Process servers[3];
  for (int i = 0; i < 2; ++i) REQUIRE(job.StartServer(&servers[i], *server_hosts[i], "s" + std::to_string(i)));
  Process trainers[2];
  for (int i = 0; i < 2; ++i) {
    // Many steps: the job is still training when the link is cut. Rank 0 asks for a third
    // server at step 5. A lost server is retried for 3 s before the call fails.
    REQUIRE(job.StartTrainer(&trainers[i], *worker_hosts[i], "w" + std::to_string(i),
                             {"--steps=100000", "--scale_out_at=5", "--recovery_timeout_ms=3000"}));
  }
  std::unique_ptr<node::AdminClient> admin_client = job.Admin();
  node::AdminClient& admin = *admin_client;

  // The scale-out: the third server starts on its new host once the scheduler asks for it.
  auto deadline = Clock::now() + 90s;
  std::string st;
  while (Clock::now() < deadline && trainers[0].running()) {
    st = StateLine(admin);
    if (st.rfind("CLUSTER_SCALE_OUT", 0) == 0) break;
    std::this_thread::sleep_for(50ms);
  }
  INFO(trainers[0].Log());
  REQUIRE(st.rfind("CLUSTER_SCALE_OUT", 0) == 0);
  REQUIRE(job.StartServer(&servers[2], *server_hosts[2], "s2"));
  while (Clock::now() < deadline && st != "CLUSTER_READY servers 3/3") {
    std::this_thread::sleep_for(50ms);
    st = StateLine(admin);
  }
  INFO(servers[2].Log());
  REQUIRE(st == "CLUSTER_READY servers 3/3");
  Result<pb::AdminResponse> nodes = admin.Admin("nodes");
  REQUIRE(nodes.ok());
  bool s2_on_its_host = false;
  for (const pb::ServersMeta& m : nodes->nodes()) {
    if (m.node_id() == "s2") s2_on_its_host = m.ip() == server_hosts[2]->ip() && m.is_alive();
  }
  CHECK(s2_on_its_host);
  // Training goes on with three servers.
  std::this_thread::sleep_for(1s);
  REQUIRE(trainers[0].running());
  REQUIRE(trainers[1].running());

  // Cut server s1's host off, and leave it off. The scheduler times it out within its
  // heartbeat timeout and tells every member; a trainer closes its link to s1 then (the
  // TCP connection itself is not broken: nothing resets it), sends its request in flight
  // there again, and gives it up --recovery_timeout_ms after the first send; it then
  // reports the error naming the server's address and finishes, and the job ends as
  // failed: every trainer and the scheduler exit 3 (docs/operations.md, exit codes).
  REQUIRE(server_hosts[1]->SetLink(false));
  const auto cut_at = Clock::now();
  std::optional<int> codes[2];
  for (int i = 0; i < 2; ++i) codes[i] = trainers[i].Wait(180s);
  const auto ended_in = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - cut_at);
  const std::optional<int> sched_code = scheduler.Wait(60s);
  INFO("w0:\n" << trainers[0].Log() << "\nw1:\n" << trainers[1].Log() << "\nscheduler:\n" << scheduler.Log());
  const std::string s1_addr = server_hosts[1]->ip() + ":";
  for (int i = 0; i < 2; ++i) {
    REQUIRE(codes[i].has_value());
    CHECK(*codes[i] == 3);
    CHECK(trainers[i].Log().find("final loss") == std::string::npos);
    CHECK_THAT(trainers[i].Log(), Catch::Contains("pscore-train: worker ") && Catch::Contains(s1_addr));
  }
  // Bound: heartbeat timeout (2 s) + recovery timeout (3 s) + the failed finish, far
  // below the 60 s request timeout that a request waiting on the cut link would take.
  CHECK(ended_in < 45s);
  REQUIRE(sched_code.has_value());
  CHECK(*sched_code == 3);
  CHECK_THAT(scheduler.Log(), Catch::Contains("server s1 (rank ") && Catch::Contains(") timed out"));
  CHECK_THAT(scheduler.Log(), Catch::Contains("pscore-node: job failed: "));
  // The other servers are still alive when the job fails; they leave with it.
  CHECK(servers[0].Wait(30s).has_value());
}

namespace {

enum class Cut { kServer1, kScheduler };

// Each process on a host of its own: server1's link (replicas=2) or the scheduler's
// (replicas=1) is cut for twice the heartbeat timeout while the workers train, or
// (`in_barrier`) while worker 0 waits in a barrier of its step (worker 1 held with SIGSTOP
// for 300 ms around the cut's start).
void LinkCutJob(bool in_barrier, Cut cut = Cut::kServer1) {
  constexpr int kHeartbeatTimeoutMs = 2000;
  TwoByTwoJob job(40,
                  {"--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=" + std::to_string(kHeartbeatTimeoutMs),
                   "--connect_timeout_ms=30000", "--recovery_timeout_ms=30000"},
                  {cut == Cut::kServer1 ? "--replicas=2" : "--replicas=1", "--recoverable_roles=worker,server"});
  if (!job.ok()) return;
  Process& scheduler = job.scheduler();
  Process(&servers)[2] = job.servers;
  Process(&trainers)[2] = job.trainers;
  // Training, then the cut: the host is off for twice the heartbeat timeout.
  Host& cut_host = cut == Cut::kServer1 ? job.server_host(1) : job.sched_host();
  {
    INFO(trainers[0].Log());
    REQUIRE(Logged(trainers[0], "step  10 "));
  }
  // Both trainers pause while the link goes down, so that the cut lands in the middle of
  // training however slowly this machine runs the test; then they train on against it.
  // In the barrier case trainer 0 goes on first and waits in the step's barrier for
  // trainer 1, which is held until after the cut.
  constexpr auto kHold = 300ms;
  trainers[0].Signal(SIGSTOP);
  trainers[1].Signal(SIGSTOP);
  if (in_barrier) {
    trainers[0].Signal(SIGCONT);
    std::this_thread::sleep_for(kHold);
  }
  REQUIRE(cut_host.SetLink(false));
  if (in_barrier) std::this_thread::sleep_for(kHold);
  trainers[0].Signal(SIGCONT);
  trainers[1].Signal(SIGCONT);
  std::this_thread::sleep_for(std::chrono::milliseconds(2 * kHeartbeatTimeoutMs) - (in_barrier ? kHold : 0ms));
  REQUIRE(cut_host.SetLink(true));
  CheckTrainersUndisturbed(trainers, job.plain);
  INFO(scheduler.Log());
  CHECK(scheduler.Wait(60s) == std::optional<int>(0));
  if (cut == Cut::kServer1) CHECK_THAT(scheduler.Log(), Catch::Contains("scheduler: server server1 (rank "));
  for (int i = 0; i < (cut == Cut::kServer1 ? 1 : 2); ++i) {
    INFO(servers[i].Log());
    CHECK(servers[i].Wait(60s) == std::optional<int>(0));
  }
}

}  // namespace

TEST_CASE("replicas=2: a demo job with every process on a host of its own rides through a server's link cut "
          "past its heartbeat timeout and ends as undisturbed",
          "[multiproc][net][netns][replication][failover]") {
  LinkCutJob(/*in_barrier=*/false);
}

TEST_CASE("replicas=2: a demo job with every process on a host of its own rides through a server's link cut "
          "while a worker waits in a barrier and ends as undisturbed",
          "[multiproc][net][netns][replication][failover]") {
  LinkCutJob(/*in_barrier=*/true);
}

TEST_CASE("a demo job with every process on a host of its own rides through the scheduler's link cut past the "
          "heartbeat timeout and ends as undisturbed",
          "[multiproc][net][netns][control]") {
  LinkCutJob(/*in_barrier=*/false, Cut::kScheduler);
}

TEST_CASE("a demo job with every process on a host of its own rides through the scheduler's link cut while a "
          "worker waits in a barrier and ends as undisturbed",
          "[multiproc][net][netns][control]") {
  LinkCutJob(/*in_barrier=*/true, Cut::kScheduler);
}

TEST_CASE("replicas=2: a demo job with every process on a host of its own and a server's link cut for good during a "
          "scale-out ends as undisturbed",
          "[multiproc][net][netns][replication][failover][scale]") {
  TempDir dir;
  REQUIRE(dir.ok());
  const std::string iplog = dir.File("ip.log");
  Bridge bridge(iplog);
  std::vector<std::unique_ptr<Host>> hosts;
  if (!MakeHosts(bridge, 6, iplog, &hosts)) return;
  constexpr int kSteps = 30;
  TrainJobOptions plain_job;
  plain_job.steps = kSteps;
  const std::vector<TrainFinal> plain = UndisturbedFinals(plain_job);

  Host& sched_host = *hosts[0];
  Host* server_hosts[3] = {hosts[1].get(), hosts[2].get(), hosts[5].get()};
  Host* worker_hosts[2] = {hosts[3].get(), hosts[4].get()};
  HostJob job(dir, sched_host,
              {"--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=3000", "--connect_timeout_ms=30000",
               "--recovery_timeout_ms=40000"});
  job.StartScheduler({"--worker_num=2", "--server_num=2", "--replicas=2", "--recoverable_roles=worker,server"});
  Process& scheduler = job.scheduler;
  Process servers[3];
  for (int i = 0; i < 2; ++i) REQUIRE(job.StartServer(&servers[i], *server_hosts[i], "server" + std::to_string(i)));
  Process trainers[2];
  for (int i = 0; i < 2; ++i) {
    REQUIRE(job.StartTrainer(&trainers[i], *worker_hosts[i], "worker" + std::to_string(i),
                             {"--steps=" + std::to_string(kSteps), "--scale_out_at=10"}));
  }
  std::unique_ptr<node::AdminClient> admin_client = job.Admin();
  node::AdminClient& admin = *admin_client;
  const auto deadline = Clock::now() + 90s;
  std::string st;
  while (Clock::now() < deadline && trainers[0].running()) {
    st = StateLine(admin);
    if (st.rfind("CLUSTER_SCALE_OUT", 0) == 0) break;
    std::this_thread::sleep_for(20ms);
  }
  INFO(trainers[0].Log());
  REQUIRE(st.rfind("CLUSTER_SCALE_OUT", 0) == 0);
  // server1's host is cut off for good; then the new server's host comes up.
  REQUIRE(server_hosts[1]->SetLink(false));
  REQUIRE(job.StartServer(&servers[2], *server_hosts[2], "server2"));
  CheckTrainersUndisturbed(trainers, plain);
  INFO(scheduler.Log());
  CHECK(scheduler.Wait(60s) == std::optional<int>(0));
  CHECK_THAT(scheduler.Log(), Catch::Contains("scale operation rolled back: server server1 (rank "));
  {
    INFO(servers[0].Log());
    CHECK(servers[0].Wait(60s) == std::optional<int>(0));
  }
  INFO(servers[2].Log());
  CHECK(servers[2].Wait(60s).has_value());  // dropped by the rollback, it leaves with the job
  servers[1].Kill();   // cut off, it hears nothing of the job's end
}

TEST_CASE("a demo job with one trainer cut off from one server only reaches that server through the other one "
          "and ends as undisturbed",
          "[multiproc][net][netns][partition]") {
  TwoByTwoJob job(300,  // steps take milliseconds here
                  {"--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=2000", "--connect_timeout_ms=30000",
                   "--recovery_timeout_ms=30000"},
                  {"--replicas=1"});
  if (!job.ok()) return;
  Process(&trainers)[2] = job.trainers;
  {
    INFO(trainers[0].Log());
    REQUIRE(Logged(trainers[0], "step  10 "));
  }
  // server1 stops reaching worker0 (its answers and acknowledgements are dropped); the
  // scheduler and the other trainer still hear both.
  Host& cut_host = job.server_host(1);
  const std::string worker0_ip = job.worker_host(0).ip();
  REQUIRE(cut_host.Blackhole(worker0_ip, true));
  {
    INFO("worker0:\n" << trainers[0].Log());
    REQUIRE(Logged(trainers[0], ") while the scheduler still hears it; its requests go through server server0"));
    // Training goes on through the relay for ten steps, then the cut is mended.
    const std::string relayed_at = trainers[0].Log();
    const size_t at = relayed_at.rfind(" step ");
    REQUIRE(at != std::string::npos);
    const int step = std::stoi(relayed_at.substr(at + 6, 4));
    REQUIRE(step < 150);
    char later[32];
    std::snprintf(later, sizeof(later), " step %3d ", step + 10);
    REQUIRE(Logged(trainers[0], later));
  }
  REQUIRE(cut_host.Blackhole(worker0_ip, false));
  {
    // Trainer 1 is held in turns of 1.5 s (under the 2 s heartbeat timeout), so that the
    // job still trains while trainer 0 probes the mended link: a probe started during the
    // cut may take a heartbeat timeout to give up before the next one gets through.
    const std::string back = "is reached directly again; its requests go to it directly";
    for (int turn = 0; turn < 10 && trainers[1].running() && trainers[0].Log().find(back) == std::string::npos;
         ++turn) {
      trainers[1].Signal(SIGSTOP);
      std::this_thread::sleep_for(1500ms);
      trainers[1].Signal(SIGCONT);
      std::this_thread::sleep_for(100ms);
    }
    INFO("worker0:\n" << trainers[0].Log());
    CHECK(Logged(trainers[0], back));
  }
  job.CheckEndsWithNobodyLost();
}

TEST_CASE("a demo job with one trainer cut off from one server from its start reaches that server through the other "
          "one and ends as undisturbed",
          "[multiproc][net][netns][partition]") {
  // server1 drops what it sends to worker0 before the trainers start: worker0's first dial
  // to it never completes. A dial gives up after twice the heartbeat timeout (4 s), well
  // before recovery_timeout, and the part goes through server0.
  std::string worker0_ip;
  TwoByTwoJob job(200,
                  {"--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=2000", "--connect_timeout_ms=30000",
                   "--recovery_timeout_ms=10000"},
                  {"--replicas=1"}, [&worker0_ip](TwoByTwoJob& j) {
                    worker0_ip = j.worker_host(0).ip();
                    REQUIRE(j.server_host(1).Blackhole(worker0_ip, true));
                  });
  if (!job.ok()) return;
  Process(&trainers)[2] = job.trainers;
  {
    INFO("worker0:\n" << trainers[0].Log());
    REQUIRE(Logged(trainers[0], ") while the scheduler still hears it; its requests go through server server0"));
    CHECK(trainers[0].Log().find("no connection within 4000 ms") != std::string::npos);
    REQUIRE(Logged(trainers[0], "step  20 "));
  }
  REQUIRE(job.server_host(1).Blackhole(worker0_ip, false));
  job.CheckEndsWithNobodyLost();
}

}  // namespace pscore::testing
