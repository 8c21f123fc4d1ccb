// The fault matrix of docs/reliability.md, asserted with real pscore-node processes:
// SIGKILL and SIGSTOP (then SIGCONT) of each role (scheduler, server, worker) at each phase
// (registering, READY with traffic, during a scale-out, during finish): 24 cells, one
// TEST_CASE each, table-driven. A job is a scheduler (2 workers, 2 servers), servers s0, s1
// and worker w0 as processes, and worker w1 in this process (it pushes and pulls while the
// job is READY). The victim is the scheduler, s1 or w0. Short timings: heartbeat 100 ms,
// timeout 600 ms, connect timeout 1500 ms, scale timeout 2500 ms. Every wait has a
// deadline; every child is SIGKILLed by pid when the test ends, even on failure.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pscore/node/common/admin_client.h"
#include "pscore/node/worker/worker_node.h"
#include "multiproc/process.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kIntervalMs = 100;
constexpr int kTimeoutMs = 600;
constexpr int kConnectTimeoutMs = 1500;
constexpr int kScaleTimeoutMs = 2500;
constexpr auto kNodeStop = 1200ms;       // > heartbeat timeout: the node is timed out
constexpr auto kSchedulerStop = 1000ms;  // > heartbeat timeout, < connect timeout

enum class Role { kScheduler, kServer, kWorker };
enum class Phase { kRegistering, kReady, kScaleOut, kFinish };

// What a cell must show. Members are s0, s1, w0 (processes) and w1 (in this process).
enum class Outcome {
  kJobEnds,            // every member exits 4 ("cannot reach the scheduler") within the connect timeout
  kContinues,          // the cluster goes on (READY); no member restarted, none timed out for good
  kTimedOutRejoins,    // the victim is timed out; after SIGCONT the same process re-registers, READY
  kTimedOutRestarted,  // the victim is timed out; restarted with its node id: same rank, READY
  kTimedOutFinishes,   // the victim (already finished) is timed out; the others finish without it
};

struct Cell {
  Role role;
  int sig;
  Phase phase;
  Outcome outcome;
  // kScaleOut: how the scale operation ends ("done" or "rolled back"). kFinish: the exit
  // code of the surviving members once w1 finishes too (0), or -1 (not checked).
  const char* scale_result;
  int finish_exit;
};

std::vector<std::string> Timing() {
  return {"--heartbeat_interval_ms=" + std::to_string(kIntervalMs),
          "--heartbeat_timeout_ms=" + std::to_string(kTimeoutMs),
          "--connect_timeout_ms=" + std::to_string(kConnectTimeoutMs)};
}

// Pushes and pulls keys 1..4 until stopped; counts answers (each with a deadline).
class Traffic {
 public:
  explicit Traffic(node::WorkerNode* w) : worker_(w), thread_([this] { Run(); }) {}
  ~Traffic() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int ok() const { return ok_; }
  int failed() const { return failed_; }

 private:
  void Run() {
    const std::vector<uint64_t> keys = {1, 2, 3, 4};
    const std::vector<float> values(keys.size(), 1.0f);
    while (!stop_) {
      auto push = worker_->Push(keys, values);
      bool ok = push.wait_for(5s) == std::future_status::ready && push.get().ok();
      auto pull = worker_->Pull(keys);
      ok = ok && pull.wait_for(5s) == std::future_status::ready && pull.get().ok();
      (ok ? ok_ : failed_)++;
      if (!ok) std::this_thread::sleep_for(20ms);
    }
  }
  node::WorkerNode* worker_;
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0};
  std::atomic<int> failed_{0};
  std::thread thread_;
};

class Job {
 public:
  Job() { REQUIRE(dir_.ok()); }
  ~Job() {
    traffic_.reset();
    if (w1_) w1_->Stop();
  }

  void StartScheduler() {
    std::vector<std::string> argv = {NodeBinary(), "--role=scheduler", "--recoverable_roles=worker,server", "--scheduler_port=0", "--worker_num=2",
                                     "--server_num=2", "--scale_timeout_ms=" + std::to_string(kScaleTimeoutMs),
                                     "--port_file=" + dir_.File("sched.port")};
    for (auto& f : Timing()) argv.push_back(f);
    REQUIRE(scheduler_.Start(argv, dir_.File("scheduler.log")));
    port_ = ReadPortFile(dir_.File("sched.port"), 10s);
    INFO(scheduler_.Log());
    REQUIRE(port_ > 0);
    node::AdminClientOptions o;
    o.scheduler_port = port_;
    o.timeout = 3s;
    admin_ = std::make_unique<node::AdminClient>(o);
    REQUIRE(admin_->Connect().ok());
  }

  Process& StartMember(const std::string& role, const std::string& id, bool auto_finish) {
    std::vector<std::string> argv = {NodeBinary(), "--role=" + role, "--node_id=" + id,
                                     "--scheduler_port=" + std::to_string(port_),
                                     std::string("--auto_finish=") + (auto_finish ? "true" : "false")};
    for (auto& f : Timing()) argv.push_back(f);
    // A new server refused once its scale-out rolled back waits 1 s for another, then exits 1.
    argv.push_back("--join_timeout_ms=1000");
    procs_.push_back(std::make_unique<Process>());
    REQUIRE(procs_.back()->Start(argv, dir_.File(id + "." + std::to_string(procs_.size()) + ".log")));
    return *procs_.back();
  }

  void StartW1() {
    node::NodeOptions o;
    o.role = pb::WORKER;
    o.node_id = "w1";
    o.scheduler_port = port_;
    o.heartbeat_interval = std::chrono::milliseconds(kIntervalMs);
    o.connect_timeout = std::chrono::milliseconds(kConnectTimeoutMs);
    o.request_timeout = 2s;
    w1_ = std::make_unique<node::WorkerNode>(o);
    node::Node::Callbacks cb;
    cb.on_fatal = [this](const Status&) { w1_fatal_ = true; };
    cb.on_cluster_event = [this](const pb::ClusterEventMessage& ev) {
      std::lock_guard<std::mutex> lock(events_mu_);
      w1_events_.push_back(ev);
    };
    w1_->SetCallbacks(cb);
    REQUIRE(w1_->Start().ok());
  }
  void StartTraffic() { traffic_ = std::make_unique<Traffic>(w1_.get()); }

  Result<pb::AdminResponse> Nodes() { return admin_->Admin("nodes"); }

  // Polls "nodes" until pred holds; false at the deadline.
  bool WaitFor(const std::function<bool(const pb::AdminResponse&)>& pred, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      Result<pb::AdminResponse> r = Nodes();
      if (r.ok() && pred(*r)) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  bool WaitForState(pb::ClusterState s, std::chrono::milliseconds timeout) {
    return WaitFor([s](const pb::AdminResponse& r) { return r.cluster_state() == s; }, timeout);
  }
  static const pb::ServersMeta* Find(const pb::AdminResponse& r, const std::string& id) {
    for (const pb::ServersMeta& m : r.nodes()) {
      if (m.node_id() == id) return &m;
    }
    return nullptr;
  }

  // The cluster events w1 got so far.
  std::vector<pb::ClusterEventMessage> W1Events() {
    std::lock_guard<std::mutex> lock(events_mu_);
    return w1_events_;
  }
  // Polls w1's events until one of `kind` about node_id arrived; false at the deadline.
  bool WaitForW1Event(pb::ClusterEventMessage::Kind kind, const std::string& node_id,
                      std::chrono::milliseconds timeout, pb::ClusterEventMessage* out) {
    const auto deadline = Clock::now() + timeout;
    do {
      for (const pb::ClusterEventMessage& ev : W1Events()) {
        if (ev.kind() == kind && ev.node_id() == node_id) {
          *out = ev;
          return true;
        }
      }
      std::this_thread::sleep_for(20ms);
    } while (Clock::now() < deadline);
    return false;
  }

  int CountInSchedulerLog(const std::string& text) {
    const std::string log = scheduler_.Log();
    int n = 0;
    for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
    return n;
  }

  Process& scheduler() { return scheduler_; }
  std::vector<std::unique_ptr<Process>>& procs() { return procs_; }
  node::WorkerNode* w1() { return w1_.get(); }
  Traffic* traffic() { return traffic_.get(); }
  bool w1_fatal() const { return w1_fatal_; }
  node::AdminClient& admin() { return *admin_; }

 private:
  TempDir dir_;
  Process scheduler_;
  std::vector<std::unique_ptr<Process>> procs_;
  std::unique_ptr<node::AdminClient> admin_;
  std::unique_ptr<node::WorkerNode> w1_;
  std::unique_ptr<Traffic> traffic_;
  std::atomic<bool> w1_fatal_{false};
  std::mutex events_mu_;
  std::vector<pb::ClusterEventMessage> w1_events_;  // guarded by events_mu_
  int port_ = 0;
};

std::string Name(Role r) { return r == Role::kScheduler ? "scheduler" : r == Role::kServer ? "s1" : "w0"; }

// Polls p's log until it holds text; false at the deadline.
bool WaitForLog(Process& p, const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  do {
    if (p.Log().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(20ms);
  } while (Clock::now() < deadline);
  return false;
}

// What pscore-node logs when the scheduler tells it that node_id timed out (node_main.cc).
std::string TimedOutLine(const std::string& node_id) {
  return "cluster event NODE_TIMED_OUT for " + std::string(node_id[0] == 's' ? "server " : "worker ") + node_id;
}

// Every other live member was told that the victim timed out: each member process logs the
// event, and w1 (when it was up before the fault) got it through on_cluster_event. While
// READY, the event carries the cluster state NODE_TIMEOUT.
void CheckOthersTold(Job& job, const std::vector<Process*>& others, const std::string& victim_id, Phase phase,
                     bool w1_was_up) {
  const std::string line = TimedOutLine(victim_id);
  for (Process* p : others) {
    INFO(p->Log());
    CHECK(WaitForLog(*p, line, 10s));
    if (phase == Phase::kReady) {
      const std::string log = p->Log();
      const size_t at = log.find(line);
      REQUIRE(at != std::string::npos);
      CHECK(log.substr(at, log.find('\n', at) - at).find("; cluster NODE_TIMEOUT") != std::string::npos);
    }
  }
  if (!w1_was_up) return;
  pb::ClusterEventMessage ev;
  REQUIRE(job.WaitForW1Event(pb::ClusterEventMessage::NODE_TIMED_OUT, victim_id, 10s, &ev));
  if (phase == Phase::kReady) CHECK(ev.cluster_state() == pb::NODE_TIMEOUT);
}

// A scheduler stall times nobody out: its own log says it saw the stall, it logged no
// timeout, no member (nor w1) was told of one, and every node before the fault still has
// its rank and incarnation.
void CheckNobodyTimedOut(Job& job, const pb::AdminResponse& before, const pb::AdminResponse& after) {
  INFO(job.scheduler().Log());
  CHECK(job.CountInSchedulerLog("scheduler: did not run for ") >= 1);
  CHECK(job.CountInSchedulerLog(") timed out") == 0);
  for (auto& p : job.procs()) {
    INFO(p->Log());
    CHECK(p->Log().find("cluster event NODE_TIMED_OUT") == std::string::npos);
  }
  for (const pb::ClusterEventMessage& ev : job.W1Events()) {
    CHECK(ev.kind() != pb::ClusterEventMessage::NODE_TIMED_OUT);
  }
  for (const pb::ServersMeta& b : before.nodes()) {
    const pb::ServersMeta* a = Job::Find(after, b.node_id());
    INFO("node " << b.node_id());
    REQUIRE(a != nullptr);
    CHECK(a->rank_id() == b.rank_id());
    CHECK(a->incarnation() == b.incarnation());
  }
}

void RunCell(const Cell& cell) {
  Job job;
  job.StartScheduler();
  const bool finish_phase = cell.phase == Phase::kFinish;
  Process& s0 = job.StartMember("server", "s0", finish_phase);
  Process* s1 = &job.StartMember("server", "s1", finish_phase);
  Process* w0 = &job.StartMember("worker", "w0", finish_phase);
  (void)s0;
  const std::string victim_id = Name(cell.role);

  // Bring the job to the phase.
  if (cell.phase == Phase::kRegistering) {
    REQUIRE(job.WaitFor([](const pb::AdminResponse& r) { return r.nodes_size() == 3; }, 10s));
    REQUIRE(job.Nodes()->cluster_state() == pb::ClUSTER_STARTING);
  } else {
    job.StartW1();
    REQUIRE(job.w1()->WaitForReady(15s).ok());
    if (cell.phase != Phase::kFinish) job.StartTraffic();
  }
  if (cell.phase == Phase::kScaleOut) {
    pb::AdminRequest req;
    req.set_op("scale_out");
    req.set_server_num(3);
    req.set_worker_num(2);
    REQUIRE(job.admin().Admin(req).ok());
    REQUIRE(job.WaitForState(pb::CLUSTER_SCALE_OUT, 5s));
  }
  if (finish_phase) {
    const auto until = Clock::now() + 10s;
    while (Clock::now() < until && job.CountInSchedulerLog(" finished; waiting for") < 3) {
      std::this_thread::sleep_for(20ms);
    }
    INFO(job.scheduler().Log());
    REQUIRE(job.CountInSchedulerLog(" finished; waiting for") == 3);
  }
  Result<pb::AdminResponse> before = job.Nodes();
  REQUIRE(before.ok());
  const int traffic_before = job.traffic() ? job.traffic()->ok() : 0;

  // Inject.
  Process* victim = cell.role == Role::kScheduler ? &job.scheduler() : cell.role == Role::kServer ? s1 : w0;
  Process* const original = victim;
  // The live members other than the victim (w1 aside), told of its timeout if it has one.
  std::vector<Process*> others;
  for (auto& p : job.procs()) {
    if (p.get() != victim) others.push_back(p.get());
  }
  const auto injected = Clock::now();
  victim->Signal(cell.sig);
  if (cell.sig == SIGSTOP) {
    std::this_thread::sleep_for(cell.role == Role::kScheduler ? kSchedulerStop : kNodeStop);
    if (cell.role != Role::kScheduler) {
      // While stopped, the scheduler times the victim out: by now, unless the scheduler did
      // not run for a while itself (a loaded machine), which does not count against
      // heartbeats; then a moment later.
      const bool timed_out = job.WaitFor(
          [&](const pb::AdminResponse& r) {
            const pb::ServersMeta* rec = Job::Find(r, victim_id);
            return rec != nullptr && !rec->is_alive() && rec->state() == pb::NODE_TIMED_OUT;
          },
          10s);
      CHECK(timed_out);
    }
    victim->Signal(SIGCONT);
    if (cell.role == Role::kScheduler) {
      // The phase's state throughout: the first answer after the stall shows the state from
      // before it with every node alive, and the scheduler logs that it saw its own stall.
      Result<pb::AdminResponse> resumed = job.Nodes();
      REQUIRE(resumed.ok());
      CHECK(resumed->cluster_state() == before->cluster_state());
      for (const pb::ServersMeta& b : before->nodes()) {
        const pb::ServersMeta* m = Job::Find(*resumed, b.node_id());
        INFO("node " << b.node_id());
        REQUIRE(m != nullptr);
        CHECK(m->is_alive());
      }
      INFO(job.scheduler().Log());
      CHECK(WaitForLog(job.scheduler(), "scheduler: did not run for ", 10s));
    }
  }
  INFO("cell: " << victim_id << " signal " << cell.sig << " phase " << static_cast<int>(cell.phase));

  if (cell.outcome == Outcome::kJobEnds) {
    const auto bound = std::chrono::milliseconds(kConnectTimeoutMs + 2500);
    for (auto& p : job.procs()) {
      const auto left = bound - std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - injected);
      std::optional<int> code = p->Wait(std::max<std::chrono::milliseconds>(left, 10ms));
      INFO(p->Log());
      REQUIRE(code.has_value());  // no hang
      CHECK(*code == 4);  // the scheduler was lost after the member joined
      CHECK(p->Log().find("cannot reach the scheduler") != std::string::npos);
    }
    if (job.w1() != nullptr) {
      const auto until = Clock::now() + 3s;
      while (Clock::now() < until && !job.w1_fatal()) std::this_thread::sleep_for(10ms);
      CHECK(job.w1_fatal());
    }
    return;
  }

  if (cell.outcome == Outcome::kTimedOutRestarted || cell.outcome == Outcome::kTimedOutFinishes) {
    // Detected, then (unless the job is finishing) restarted with its node id.
    CHECK(job.WaitFor(
        [&](const pb::AdminResponse& r) {
          const pb::ServersMeta* m = Job::Find(r, victim_id);
          return m != nullptr && !m->is_alive();
        },
        5s));
    REQUIRE(victim->Wait(2s).has_value());
  }
  if (cell.role != Role::kScheduler) CheckOthersTold(job, others, victim_id, cell.phase, job.w1() != nullptr);
  if (cell.outcome == Outcome::kTimedOutRestarted) {
    victim = &job.StartMember(cell.role == Role::kServer ? "server" : "worker", victim_id, finish_phase);
  }

  // Complete the phase.
  if (cell.phase == Phase::kRegistering) {
    job.StartW1();
    REQUIRE(job.w1()->WaitForReady(15s).ok());
  }
  Process* s2 = nullptr;
  if (cell.phase == Phase::kScaleOut) s2 = &job.StartMember("server", "s2", false);
  if (cell.phase == Phase::kFinish) {
    // The membership before w1 finishes (the scheduler exits once the barrier passes).
    Result<pb::AdminResponse> waiting = job.Nodes();
    REQUIRE(waiting.ok());
    Status fin = job.w1()->Finish(10s);
    INFO(job.scheduler().Log());
    if (cell.finish_exit == 0) {
      CHECK(fin.ok());
      std::optional<int> sched = job.scheduler().Wait(10s);
      INFO(job.scheduler().Log());
      CHECK(sched == std::optional<int>(0));
      for (auto& p : job.procs()) {
        if (p.get() == original && cell.sig == SIGKILL) continue;
        std::optional<int> code = p->Wait(10s);
        INFO(p->Log());
        REQUIRE(code.has_value());
        CHECK(*code == 0);
      }
      if (cell.outcome == Outcome::kContinues) CheckNobodyTimedOut(job, *before, *waiting);
      if (cell.outcome == Outcome::kTimedOutFinishes) {
        // The job is over and its scheduler gone: a restart of the victim with its node id
        // cannot register and exits 1 once its connect timeout is spent.
        Process& again = job.StartMember(cell.role == Role::kServer ? "server" : "worker", victim_id, true);
        std::optional<int> code = again.Wait(std::chrono::milliseconds(kConnectTimeoutMs) + 20s);
        INFO(again.Log());
        REQUIRE(code.has_value());
        CHECK(*code == 1);
        CHECK(again.Log().find("cannot reach the scheduler") != std::string::npos);
      }
    } else {
      INFO("finish: " << fin);
      CHECK_FALSE(fin.ok());
    }
    return;
  }

  // The cluster is READY again with the victim (same rank).
  INFO(job.scheduler().Log());
  REQUIRE(job.WaitFor(
      [](const pb::AdminResponse& r) {
        if (r.cluster_state() != pb::CLUSTER_READY) return false;
        for (const pb::ServersMeta& m : r.nodes()) {
          if (!m.is_alive()) return false;
        }
        return true;
      },
      10s));
  Result<pb::AdminResponse> after = job.Nodes();
  REQUIRE(after.ok());
  if (cell.role != Role::kScheduler) {
    const pb::ServersMeta* b = Job::Find(*before, victim_id);
    const pb::ServersMeta* a = Job::Find(*after, victim_id);
    REQUIRE(b != nullptr);
    REQUIRE(a != nullptr);
    CHECK(a->rank_id() == b->rank_id());
    if (cell.outcome == Outcome::kTimedOutRestarted) CHECK(a->incarnation() != b->incarnation());
    if (cell.outcome == Outcome::kTimedOutRejoins) CHECK(a->incarnation() == b->incarnation());
  }
  if (cell.role == Role::kScheduler) CheckNobodyTimedOut(job, *before, *after);
  const bool scaled = cell.phase == Phase::kScaleOut && std::string(cell.scale_result) == "done";
  for (auto& p : job.procs()) {
    if ((p.get() == original && cell.sig == SIGKILL) || (p.get() == s2 && !scaled)) continue;
    INFO(p->Log());
    CHECK(p->running());  // nobody gave up
  }
  if (cell.phase == Phase::kScaleOut) {
    INFO("last scale result: " << after->last_scale_result());
    CHECK(after->last_scale_result().find(cell.scale_result) != std::string::npos);
    CHECK(after->server_num() == (scaled ? 3 : 2));
    if (!scaled) {
      // The rolled-back operation's new server is refused and exits 1 after its join timeout.
      std::optional<int> code = s2->Wait(10s);
      INFO(s2->Log());
      REQUIRE(code.has_value());
      CHECK(*code == 1);
      CHECK(s2->Log().find("refused") != std::string::npos);
    }
  }
  if (job.traffic() != nullptr) {
    // The data plane works again: new pushes and pulls succeed.
    const auto until = Clock::now() + 10s;
    while (Clock::now() < until && job.traffic()->ok() < traffic_before + 5) std::this_thread::sleep_for(20ms);
    CHECK(job.traffic()->ok() >= traffic_before + 5);
    job.traffic()->Stop();
    REQUIRE(job.w1()->Push({1}, {1.0f}).get().ok());
    REQUIRE(job.w1()->Pull({1}).get().ok());
  }
}

// The matrix (keep in sync with the table in docs/reliability.md).
#define FAULT_CELL(role, sig, phase, outcome, scale, fin)                                         \
  TEST_CASE("fault matrix: " #sig " " #role " while " #phase " -> " #outcome, "[multiproc][net]") { \
    RunCell(Cell{Role::role, sig, Phase::phase, Outcome::outcome, scale, fin});                     \
  }

}  // namespace

FAULT_CELL(kScheduler, SIGKILL, kRegistering, kJobEnds, "", -1)
FAULT_CELL(kScheduler, SIGSTOP, kRegistering, kContinues, "", -1)
FAULT_CELL(kServer, SIGKILL, kRegistering, kTimedOutRestarted, "", -1)
FAULT_CELL(kServer, SIGSTOP, kRegistering, kTimedOutRejoins, "", -1)
FAULT_CELL(kWorker, SIGKILL, kRegistering, kTimedOutRestarted, "", -1)
FAULT_CELL(kWorker, SIGSTOP, kRegistering, kTimedOutRejoins, "", -1)

FAULT_CELL(kScheduler, SIGKILL, kReady, kJobEnds, "", -1)
FAULT_CELL(kScheduler, SIGSTOP, kReady, kContinues, "", -1)
FAULT_CELL(kServer, SIGKILL, kReady, kTimedOutRestarted, "", -1)
FAULT_CELL(kServer, SIGSTOP, kReady, kTimedOutRejoins, "", -1)
FAULT_CELL(kWorker, SIGKILL, kReady, kTimedOutRestarted, "", -1)
FAULT_CELL(kWorker, SIGSTOP, kReady, kTimedOutRejoins, "", -1)

FAULT_CELL(kScheduler, SIGKILL, kScaleOut, kJobEnds, "", -1)
FAULT_CELL(kScheduler, SIGSTOP, kScaleOut, kContinues, "done", -1)
FAULT_CELL(kServer, SIGKILL, kScaleOut, kTimedOutRestarted, "rolled back", -1)
FAULT_CELL(kServer, SIGSTOP, kScaleOut, kTimedOutRejoins, "rolled back", -1)
FAULT_CELL(kWorker, SIGKILL, kScaleOut, kTimedOutRestarted, "rolled back", -1)
FAULT_CELL(kWorker, SIGSTOP, kScaleOut, kTimedOutRejoins, "rolled back", -1)

FAULT_CELL(kScheduler, SIGKILL, kFinish, kJobEnds, "", -1)
FAULT_CELL(kScheduler, SIGSTOP, kFinish, kContinues, "", 0)
FAULT_CELL(kServer, SIGKILL, kFinish, kTimedOutFinishes, "", 0)
FAULT_CELL(kServer, SIGSTOP, kFinish, kTimedOutRejoins, "", 0)
FAULT_CELL(kWorker, SIGKILL, kFinish, kTimedOutFinishes, "", 0)
FAULT_CELL(kWorker, SIGSTOP, kFinish, kTimedOutRejoins, "", 0)

}  // namespace pscore::testing
