// pscore-admin against real jobs: a scheduler, servers and workers as pscore-node
// processes (--auto_finish=false, 100 ms heartbeats), every command run as the real
// pscore-admin binary and judged by its exit code and output.
#include <netinet/in.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include "pscore/node/common/admin_client.h"
#include "multiproc/process.h"

#include <catch2/catch.hpp>

namespace pscore {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::TempDir;

const std::vector<std::string> kHeartbeat = {"--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=1000"};

using testing::AdminBinary;

struct AdminRun {
  int code = -1;
  std::string out;  // stdout and stderr together
};

// A job of one scheduler plus the named servers and workers, all killed by pid at the end.
class Job {
 public:
  explicit Job(int servers = 1, int workers = 1, int scale_timeout_ms = 20000) {
    REQUIRE(dir_.ok());
    std::vector<std::string> args = {testing::NodeBinary(), "--role=scheduler",
                                     "--server_num=" + std::to_string(servers),
                                     "--worker_num=" + std::to_string(workers),
                                     "--scale_timeout_ms=" + std::to_string(scale_timeout_ms),
                                     "--port_file=" + dir_.File("sched.port")};
    args.insert(args.end(), kHeartbeat.begin(), kHeartbeat.end());
    REQUIRE(scheduler_.Start(args, dir_.File("scheduler.log")));
    port_ = testing::ReadPortFile(dir_.File("sched.port"), 10s);
    REQUIRE(port_ > 0);
    for (int i = 0; i < servers; ++i) StartNode("server", "s" + std::to_string(i));
    for (int i = 0; i < workers; ++i) StartNode("worker", "w" + std::to_string(i));
    REQUIRE(WaitReady());
  }

  Process& StartNode(const std::string& role, const std::string& id) {
    std::vector<std::string> args = {testing::NodeBinary(), "--role=" + role, "--node_id=" + id,
                                     "--scheduler_port=" + std::to_string(port_), "--auto_finish=false"};
    args.insert(args.end(), kHeartbeat.begin(), kHeartbeat.end());
    nodes_.push_back(std::make_unique<Process>());
    const int incarnation = ++started_[id];  // each process of an id logs to its own file
    const std::string log = incarnation == 1 ? id + ".log" : id + "." + std::to_string(incarnation) + ".log";
    REQUIRE(nodes_.back()->Start(args, dir_.File(log)));
    by_id_[id] = nodes_.back().get();
    return *nodes_.back();
  }

  bool WaitReady() {
    node::AdminClientOptions o;
    o.scheduler_port = port_;
    o.tls = testing::TestTlsContext("admin");
    o.timeout = 5s;
    node::AdminClient client(o);
    if (!client.Connect().ok()) return false;
    return client.WaitForReady(20s).ok();
  }

  bool WaitForState(pb::ClusterState state) {
    node::AdminClientOptions o;
    o.scheduler_port = port_;
    o.tls = testing::TestTlsContext("admin");
    o.timeout = 5s;
    node::AdminClient client(o);
    if (!client.Connect().ok()) return false;
    for (int i = 0; i < 400; ++i) {
      Result<pb::AdminResponse> r = client.Admin("status");
      if (r.ok() && r->cluster_state() == state) return true;
      std::this_thread::sleep_for(25ms);
    }
    return false;
  }

  // Starts pscore-admin with args (the scheduler port comes first); Finish waits for it.
  std::unique_ptr<Process> StartAdmin(std::vector<std::string> args) {
    args.insert(args.begin(), {AdminBinary(), "--scheduler_port=" + std::to_string(port_)});
    auto p = std::make_unique<Process>();
    std::string log = dir_.File("admin" + std::to_string(++admin_runs_) + ".log");
    REQUIRE(p->Start(args, log));
    return p;
  }
  static AdminRun Finish(Process& p) {
    AdminRun run;
    std::optional<int> code = p.Wait(60s);
    REQUIRE(code.has_value());
    run.code = *code;
    run.out = p.Log();
    return run;
  }
  AdminRun Admin(std::vector<std::string> args) {
    auto p = StartAdmin(std::move(args));
    AdminRun run = Finish(*p);
    INFO("pscore-admin output: " << run.out);
    return run;
  }

  Process& node(const std::string& id) { return *by_id_.at(id); }
  Process& scheduler() { return scheduler_; }
  int port() const { return port_; }

  // `stop`, then every process must exit 0.
  void StopAndCheckExits() {
    AdminRun stop = Admin({"stop"});
    CHECK(stop.code == 0);
    CHECK(stop.out.find("stop accepted") != std::string::npos);
    std::optional<int> sched = scheduler_.Wait(15s);
    INFO(scheduler_.Log());
    CHECK(sched == std::optional<int>(0));
    for (auto& [id, p] : by_id_) {
      std::optional<int> code = p->Wait(15s);
      INFO(id << ": " << p->Log());
      CHECK(code == std::optional<int>(0));
    }
  }

 private:
  TempDir dir_;
  Process scheduler_;
  std::vector<std::unique_ptr<Process>> nodes_;
  std::map<std::string, Process*> by_id_;
  std::map<std::string, int> started_;
  int port_ = 0;
  int admin_runs_ = 0;
};

bool Has(const AdminRun& run, const std::string& text) { return run.out.find(text) != std::string::npos; }

// A port that nobody listens on, for as long as this is held: bound, never listening. A
// port closed again at once could be bound by another test's node meanwhile, or taken by
// the dialer itself as its own end (a connection to itself); neither can take a port
// that stays bound.
class ClosedPort {
 public:
  ClosedPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
  }
  ~ClosedPort() { ::close(fd_); }
  ClosedPort(const ClosedPort&) = delete;
  ClosedPort& operator=(const ClosedPort&) = delete;
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

}  // namespace

TEST_CASE("pscore-admin status, nodes, nodes --json, barriers, states and stop", "[multiproc][net][tlspass]") {
  Job job;
  AdminRun status = job.Admin({"status"});
  CHECK(status.code == 0);
  CHECK(Has(status, "cluster CLUSTER_READY"));
  CHECK(Has(status, "workers 1/1, servers 1/1"));

  AdminRun nodes = job.Admin({"nodes"});
  CHECK(nodes.code == 0);
  CHECK(Has(nodes, "NODE ID"));
  CHECK(Has(nodes, "s0"));
  CHECK(Has(nodes, "w0"));

  AdminRun js = job.Admin({"nodes", "--json"});
  REQUIRE(js.code == 0);
  nlohmann::json doc = nlohmann::json::parse(js.out, nullptr, /*allow_exceptions=*/false);
  REQUIRE(!doc.is_discarded());
  CHECK(doc["cluster_state"] == "CLUSTER_READY");
  REQUIRE(doc["nodes"].size() == 2);
  std::map<std::string, nlohmann::json> by_id;
  for (const auto& n : doc["nodes"]) by_id[n["node_id"].get<std::string>()] = n;
  REQUIRE(by_id.count("s0") == 1);
  REQUIRE(by_id.count("w0") == 1);
  CHECK(by_id["s0"]["role"] == "server");
  CHECK(by_id["s0"]["rank"] == 0);
  CHECK(by_id["w0"]["role"] == "worker");
  CHECK(by_id["s0"]["state"] == "NODE_READY");
  CHECK(by_id["s0"]["last_heartbeat_age_ms"].get<int64_t>() >= 0);

  AdminRun barriers = job.Admin({"barriers", "--json"});
  CHECK(barriers.code == 0);
  nlohmann::json blist = nlohmann::json::parse(barriers.out, nullptr, false);
  CHECK(blist.is_array());

  AdminRun disable = job.Admin({"disable"});
  CHECK(disable.code == 0);
  CHECK(Has(disable, "CLUSTER_DISABLE_FLS"));
  AdminRun again = job.Admin({"disable"});
  CHECK(again.code == 1);
  CHECK(Has(again, "needs CLUSTER_READY"));
  AdminRun scale_disabled = job.Admin({"scale-out", "--servers=2"});
  CHECK(scale_disabled.code == 1);
  CHECK(Has(scale_disabled, "cannot scale"));
  CHECK(job.Admin({"enable"}).code == 0);
  AdminRun enable_again = job.Admin({"enable"});
  CHECK(enable_again.code == 1);
  CHECK(Has(enable_again, "not disabled"));
  AdminRun fresh = job.Admin({"new-instance"});
  CHECK(fresh.code == 0);
  CHECK(Has(fresh, "new_instance accepted"));

  job.StopAndCheckExits();
}

TEST_CASE("pscore-admin kv set/get/ls/rm round trip", "[multiproc][net][tlspass]") {
  Job job;
  CHECK(job.Admin({"kv", "set", "cfg/lr", "0.1"}).code == 0);
  CHECK(job.Admin({"kv", "set", "cfg/opt/name", "adam"}).code == 0);
  AdminRun get = job.Admin({"kv", "get", "cfg/lr"});
  CHECK(get.code == 0);
  CHECK(get.out == "0.1\n");
  AdminRun ls = job.Admin({"kv", "ls", "cfg"});
  CHECK(ls.code == 0);
  CHECK(ls.out == "cfg/lr\t0.1\ncfg/opt/name\tadam\n");
  AdminRun ls_json = job.Admin({"kv", "ls", "cfg", "--json"});
  nlohmann::json doc = nlohmann::json::parse(ls_json.out, nullptr, false);
  REQUIRE(doc.is_object());
  CHECK(doc["cfg/opt/name"] == "adam");
  // A value that is not UTF-8 (values are bytes): printed with U+FFFD, not an abort.
  CHECK(job.Admin({"kv", "set", "cfg/bin", "\xff\xfe"}).code == 0);
  AdminRun bin_json = job.Admin({"kv", "ls", "cfg", "--json"});
  CHECK(bin_json.code == 0);
  nlohmann::json bin_doc = nlohmann::json::parse(bin_json.out, nullptr, false);
  REQUIRE(bin_doc.is_object());
  CHECK(bin_doc["cfg/bin"] == "\xef\xbf\xbd\xef\xbf\xbd");
  CHECK(job.Admin({"kv", "rm", "cfg"}).code == 0);
  AdminRun gone = job.Admin({"kv", "get", "cfg/lr"});
  CHECK(gone.code == 1);
  CHECK(Has(gone, "not found"));
  AdminRun empty = job.Admin({"kv", "ls", "cfg"});
  CHECK(empty.code == 0);
  CHECK(empty.out.empty());
  AdminRun bad = job.Admin({"kv", "frobnicate", "x"});
  CHECK(bad.code == 2);
  job.StopAndCheckExits();
}

TEST_CASE("pscore-admin refuses bad commands with a reason and exit code", "[multiproc][net]") {
  Job job;
  AdminRun unknown_node = job.Admin({"scale-in", "--node_ids=nope"});
  CHECK(unknown_node.code == 1);
  CHECK(Has(unknown_node, "unknown node nope"));
  AdminRun shrink = job.Admin({"scale-out", "--workers=0"});
  CHECK(shrink.code == 1);
  CHECK(Has(shrink, "cannot shrink"));
  AdminRun grow = job.Admin({"scale-in", "--servers=3"});
  CHECK(grow.code == 1);
  AdminRun huge = job.Admin({"scale-out", "--servers=1000000"});
  CHECK(huge.code == 1);
  CHECK(Has(huge, "nodes per role"));
  CHECK(job.Admin({"scale-out"}).code == 2);                    // no totals
  CHECK(job.Admin({"scale-out", "--servers=-5"}).code == 2);   // bad flag value
  CHECK(job.Admin({"scale-in", "--node_ids=w0", "--workers=1"}).code == 2);
  AdminRun unknown = job.Admin({"frobnicate"});
  CHECK(unknown.code == 2);
  CHECK(Has(unknown, "unknown command 'frobnicate'"));
  CHECK(job.Admin({}).code == 2);
  CHECK(job.Admin({"status", "--no_such_flag=1"}).code == 2);
  AdminRun forever = job.Admin({"scale-out", "--servers=3", "--wait", "--wait_timeout_ms=9223372036854775807"});
  CHECK(forever.code == 2);  // refused before anything is sent: now + 2^63 ms would overflow
  CHECK(Has(forever, "--wait_timeout_ms must be in [1, 4398046511104]"));
  CHECK(job.Admin({"watch-ranktable", "--reconnect_ms=-1"}).code == 2);
  AdminRun watch_args = job.Admin({"watch-ranktable", "extra"});
  CHECK(watch_args.code == 2);

  Process offline;
  TempDir tmp;
  const ClosedPort closed;
  REQUIRE(offline.Start({AdminBinary(), "--scheduler_port=" + std::to_string(closed.port()), "--timeout_ms=1000", "status"},
                        tmp.File("offline.log")));
  AdminRun unreachable = Job::Finish(offline);
  CHECK(unreachable.code == 3);
  CHECK(Has(unreachable, "scheduler unreachable"));

  job.StopAndCheckExits();
}

TEST_CASE("pscore-admin reset lets a restarted member that is in error register again", "[multiproc][net]") {
  Job job;  // no --recoverable_roles: a worker's new incarnation is an error
  CHECK(job.Admin({"reset"}).code == 2);  // no ids
  AdminRun totals = job.Admin({"reset", "--node_ids=w0", "--workers=1"});
  CHECK(totals.code == 2);
  CHECK(Has(totals, "--workers does not apply"));
  AdminRun ids = job.Admin({"status", "--node_ids=w0"});
  CHECK(ids.code == 2);
  CHECK(Has(ids, "--node_ids does not apply (scale-in, reset)"));
  AdminRun unknown = job.Admin({"reset", "--node_ids=nobody"});
  CHECK(unknown.code == 1);
  CHECK(Has(unknown, "nobody"));

  job.node("w0").Kill();
  REQUIRE(job.node("w0").Wait(15s).has_value());
  Process& refused = job.StartNode("worker", "w0");  // a new process: a new incarnation
  std::optional<int> code = refused.Wait(30s);
  INFO(refused.Log());
  REQUIRE(code.has_value());
  CHECK(*code != 0);
  CHECK(refused.Log().find("pscore-admin reset w0") != std::string::npos);

  AdminRun reset = job.Admin({"reset", "w0"});  // as the refusal's message says
  CHECK(reset.code == 0);
  CHECK(Has(reset, "reset accepted"));
  Process& again = job.StartNode("worker", "w0");
  // The reset alone returns the cluster to READY: wait for the new process itself to register
  // (a stop sent before that would refuse its registration).
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline && again.running() &&
         again.Log().find("registered as rank 0") == std::string::npos) {
    std::this_thread::sleep_for(5ms);
  }
  INFO(again.Log());
  REQUIRE(again.Log().find("registered as rank 0") != std::string::npos);
  CHECK(job.WaitForState(pb::CLUSTER_READY));
  AdminRun nodes = job.Admin({"nodes"});
  CHECK(nodes.code == 0);
  CHECK(Has(nodes, "w0"));
  job.StopAndCheckExits();
}

TEST_CASE("pscore-admin waiting for a scale ends at SIGTERM or SIGINT - not at its wait timeout", "[multiproc][net]") {
  Job job(1, 1, /*scale_timeout_ms=*/3000);  // the new server never comes: rolled back after 3 s
  for (int sig : {SIGTERM, SIGINT}) {
    INFO("signal " << sig);
    auto waiting = job.StartAdmin({"scale-out", "--servers=2", "--wait", "--wait_timeout_ms=60000"});
    std::this_thread::sleep_for(500ms);  // connected and polling (it would poll for 60 s)
    REQUIRE(waiting->running());
    waiting->Signal(sig);
    std::optional<int> code = waiting->Wait(10s);
    REQUIRE(code.has_value());  // before: the signal was caught and ignored
    CHECK(*code == 128 + sig);
    REQUIRE(job.WaitForState(pb::CLUSTER_READY));  // the scale rolled back
  }
  job.StopAndCheckExits();
}

TEST_CASE("pscore-admin scale-out --wait ends at once when the scale rolls back into NODE_TIMEOUT", "[multiproc][net]") {
  Job job(1, 2, /*scale_timeout_ms=*/60000);
  // The new server never comes; w1 dies mid-scale: the scale rolls back and the cluster
  // stays in NODE_TIMEOUT (w1 is gone), which no longer is the admin's operation to wait for.
  auto waiting = job.StartAdmin({"scale-out", "--servers=2", "--wait", "--wait_timeout_ms=120000"});
  REQUIRE(job.WaitForState(pb::CLUSTER_SCALE_OUT));
  job.node("w1").Kill();
  REQUIRE(job.WaitForState(pb::NODE_TIMEOUT));
  std::optional<int> code = waiting->Wait(20s);  // far below its 120 s wait timeout
  REQUIRE(code.has_value());
  const std::string out = waiting->Log();
  INFO(out);
  CHECK(*code == 1);
  CHECK(out.find("scale-out failed: rolled back") != std::string::npos);
  CHECK(out.find("cluster NODE_TIMEOUT") != std::string::npos);
}

TEST_CASE("pscore-admin scale-out waits for the new nodes, scale-in removes them", "[multiproc][net]") {
  Job job;
  auto scale = job.StartAdmin({"scale-out", "--servers=2", "--workers=2"});
  REQUIRE(job.WaitForState(pb::CLUSTER_SCALE_OUT));
  // Another scale while this one runs is refused (the first waits for its nodes).
  AdminRun busy = job.Admin({"scale-out", "--servers=3"});
  CHECK(busy.code == 1);
  CHECK(Has(busy, "already running"));
  job.StartNode("server", "s1");
  job.StartNode("worker", "w1");
  AdminRun out = Job::Finish(*scale);
  INFO(out.out);
  CHECK(out.code == 0);
  CHECK(Has(out, "scale-out done"));
  CHECK(Has(out, "workers 2/2, servers 2/2"));

  AdminRun js = job.Admin({"nodes", "--json"});
  nlohmann::json doc = nlohmann::json::parse(js.out, nullptr, false);
  REQUIRE(doc["nodes"].size() == 4);
  for (const auto& n : doc["nodes"]) {
    if (n["node_id"] == "s0") CHECK(n["rank"] == 0);
    if (n["node_id"] == "s1") CHECK(n["rank"] == 1);
  }

  AdminRun in_servers = job.Admin({"scale-in", "--servers=1"});  // the highest rank (s1) leaves
  CHECK(in_servers.code == 0);
  CHECK(Has(in_servers, "scale-in done"));
  CHECK(job.node("s1").Wait(15s) == std::optional<int>(0));
  AdminRun in_worker = job.Admin({"scale-in", "--node_ids=w1"});
  CHECK(in_worker.code == 0);
  CHECK(job.node("w1").Wait(15s) == std::optional<int>(0));
  AdminRun status = job.Admin({"status"});
  CHECK(Has(status, "workers 1/1, servers 1/1"));
  job.StopAndCheckExits();
}

TEST_CASE("pscore-admin reports a scale-out rolled back when the new server never comes", "[multiproc][net]") {
  Job job(1, 1, /*scale_timeout_ms=*/1500);
  AdminRun out = job.Admin({"scale-out", "--servers=2"});
  CHECK(out.code == 1);
  CHECK(Has(out, "scale-out started"));
  CHECK(Has(out, "rolled back"));
  CHECK(Has(out, "servers 1/1"));
  AdminRun status = job.Admin({"status"});
  CHECK(status.code == 0);
  CHECK(Has(status, "cluster CLUSTER_READY"));
  CHECK(Has(status, "last scale operation: rolled back"));
  // --nowait returns once the scheduler accepted the operation.
  AdminRun nowait = job.Admin({"scale-out", "--servers=2", "--nowait"});
  CHECK(nowait.code == 0);
  CHECK(Has(nowait, "scale-out started"));
  CHECK(!Has(nowait, "done"));
  CHECK(job.WaitReady());
  job.StopAndCheckExits();
}

}  // namespace pscore

namespace pscore {

TEST_CASE("pscore-admin watch-ranktable prints the tables until the job ends", "[multiproc][net]") {
  Job job;
  auto watch = job.StartAdmin({"watch-ranktable", "--json"});
  std::string first;
  for (int i = 0; i < 400 && first.empty(); ++i) {
    std::string log = watch->Log();
    size_t nl = log.find('\n');
    if (nl != std::string::npos) first = log.substr(0, nl);
    if (first.empty()) std::this_thread::sleep_for(25ms);
  }
  REQUIRE(!first.empty());
  nlohmann::json line = nlohmann::json::parse(first, nullptr, false);
  INFO(first);
  REQUIRE(line.is_object());
  CHECK(line["jobId"] == "default");
  CHECK(line["rankTable"].is_object());
  job.StopAndCheckExits();
  AdminRun end = Job::Finish(*watch);
  CHECK(end.code == 0);
  CHECK(Has(end, "rank table stream ended"));
}

}  // namespace pscore

namespace pscore {

TEST_CASE("pscore-admin watch-ranktable --publisher: the job's next registration ends it with exit 1 naming why",
          "[multiproc][net]") {
  Job job;
  // Waits until the process's output holds text (stdout and stderr together).
  auto wait_for = [](Process& p, const std::string& text) {
    for (int i = 0; i < 800; ++i) {
      if (p.Log().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(25ms);
    }
    return false;
  };
  auto first = job.StartAdmin({"watch-ranktable", "--publisher", "--json"});
  REQUIRE(wait_for(*first, "registration 1"));
  REQUIRE(wait_for(*first, "\"rankTable\""));
  auto second = job.StartAdmin({"watch-ranktable", "--publisher", "--json"});
  AdminRun end = Job::Finish(*first);
  INFO(end.out);
  CHECK(end.code == 1);
  CHECK(Has(end, "rank-table registration 1 of job 'default' (role 'admin') was superseded by registration 2"));
  REQUIRE(wait_for(*second, "registration 2"));
  REQUIRE(wait_for(*second, "\"rankTable\""));
  AdminRun misuse = job.Admin({"status", "--publisher"});
  CHECK(misuse.code == 2);
  CHECK(Has(misuse, "--publisher does not apply"));
  job.StopAndCheckExits();
  AdminRun end2 = Job::Finish(*second);
  INFO(end2.out);
  CHECK(end2.code == 0);  // the job ended: not a superseded registration
  CHECK(Has(end2, "rank table stream ended"));
}

}  // namespace pscore
