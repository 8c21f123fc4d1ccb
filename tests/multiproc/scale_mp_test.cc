// Elastic scaling with real processes: a pscore-node scheduler and pscore-node servers
// (--auto_finish=false, 100 ms heartbeats timed out after 3 s, as in the other multi-process
// jobs: 1 s timed members out in a TSan build under CI load), and in-process WorkerNode
// pushers that add 1 to every key in rounds without pause while the admin scales the job.
// Checked: no acknowledged push lost or applied twice (sums equal the acknowledged rounds),
// each key answered by exactly one server, ranks kept on scale-out and compacted in
// old-rank order on scale-in, back-to-back operations, and rollback (with every node told)
// when a new or an old server is SIGKILLed mid-scale; a new server refused (its role's quota
// full, or a scale-in running) registering again until a scale-out admits it.
// A new server that never starts (rollback after --scale_timeout_ms, reason to the admin)
// and the admin's refusals are covered by admin_test.cc; here, a new server that did start
// but whose operation timed out is dropped and exits 1.
#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pscore/core/key_range.h"
#include "pscore/core/kv_codec.h"
#include "pscore/node/common/admin_client.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"
#include "multiproc/process.h"

#include <catch2/catch.hpp>

namespace pscore {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::TempDir;

constexpr int kKeys = 64;
constexpr int kFloatsPerKey = 4;

// Scheduler plus named node processes; every process is SIGKILLed by pid at destruction.
class ScaleJob {
 public:
  ScaleJob(int workers, int servers, int scale_timeout_ms = 30000, int heartbeat_timeout_ms = 3000) {
    REQUIRE(dir_.ok());
    REQUIRE(scheduler_.Start({testing::NodeBinary(), "--role=scheduler", "--recoverable_roles=worker,server", "--worker_num=" + std::to_string(workers),
                              "--server_num=" + std::to_string(servers), "--scale_timeout_ms=" + std::to_string(scale_timeout_ms),
                              "--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=" + std::to_string(heartbeat_timeout_ms),
                              "--port_file=" + dir_.File("sched.port")},
                             dir_.File("scheduler.log")));
    port_ = testing::ReadPortFile(dir_.File("sched.port"), 10s);
    REQUIRE(port_ > 0);
    node::AdminClientOptions o;
    o.scheduler_port = port_;
    o.tls = testing::TestTlsContext("admin");
    o.timeout = 5s;
    admin_ = std::make_unique<node::AdminClient>(o);
    REQUIRE(admin_->Connect().ok());
  }

  // A pscore-node server or worker; rank -1: any.
  Process& Start(const std::string& role, const std::string& id, int rank = -1,
                 const std::vector<std::string>& extra = {}) {
    auto p = std::make_unique<Process>();
    std::vector<std::string> argv = {testing::NodeBinary(), "--role=" + role, "--node_id=" + id,
                                     "--rank=" + std::to_string(rank), "--scheduler_port=" + std::to_string(port_),
                                     "--auto_finish=false", "--heartbeat_interval_ms=100"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    REQUIRE(p->Start(argv, dir_.File(id + ".log")));
    procs_[id] = std::move(p);
    return *procs_[id];
  }

  node::NodeOptions WorkerOptions(const std::string& id) const {
    node::NodeOptions o;
    o.role = pb::WORKER;
    o.node_id = id;
    o.tls = testing::TestTlsContext(id);
    o.scheduler_port = port_;
    o.heartbeat_interval = 100ms;
    o.connect_timeout = 10s;
    o.request_timeout = 30s;
    return o;
  }

  pb::AdminResponse Admin(const pb::AdminRequest& req) {
    Result<pb::AdminResponse> r = admin_->Admin(req);
    INFO(req.op() << ": " << r.status());
    REQUIRE(r.ok());
    return *r;
  }
  // node id -> rank of every registered node.
  std::map<std::string, int> Ranks() {
    Result<pb::AdminResponse> r = admin_->Admin("nodes");
    REQUIRE(r.ok());
    std::map<std::string, int> out;
    for (const pb::ServersMeta& n : r->nodes()) out[n.node_id()] = n.rank_id();
    return out;
  }
  pb::AdminResponse WaitReady() {
    Result<pb::AdminResponse> r = admin_->WaitForReady(30s, 20ms);
    INFO(r.status() << "\nscheduler log:\n" << scheduler_.Log());
    REQUIRE(r.ok());
    return *r;
  }
  bool WaitRegistered(const std::string& id) {
    for (int i = 0; i < 500; ++i) {
      if (Ranks().count(id) == 1) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  Process& proc(const std::string& id) { return *procs_.at(id); }
  std::string SchedulerLog() const { return scheduler_.Log(); }

 private:
  TempDir dir_;
  Process scheduler_;
  int port_ = 0;
  std::unique_ptr<node::AdminClient> admin_;
  std::map<std::string, std::unique_ptr<Process>> procs_;
};

// Whether the process's log holds `text` within 20 s.
bool WaitForLog(Process& p, const std::string& text) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (p.Log().find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

// How many times `text` occurs in `log`.
size_t Occurrences(const std::string& log, const std::string& text) {
  size_t n = 0;
  for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
  return n;
}

// Pushes +1 to every key in rounds until stopped; counts acknowledged and failed rounds.
class Pusher {
 public:
  explicit Pusher(node::WorkerNode* worker) : worker_(worker) {}
  ~Pusher() { Stop(); }
  void Start() {
    thread_ = std::thread([this] {
      std::vector<uint64_t> keys(kKeys);
      for (int k = 0; k < kKeys; ++k) keys[k] = k;
      const std::vector<float> ones(kKeys * kFloatsPerKey, 1.0f);
      while (!stop_) {
        Status st = worker_->Push(keys, ones).get();
        if (st.ok()) {
          ++acked_;
        } else {
          ++failed_;
          std::lock_guard<std::mutex> lock(mu_);
          last_error_ = st.ToString();
        }
      }
    });
  }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int acked() const { return acked_; }
  int failed() const { return failed_; }
  std::string last_error() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_error_;
  }

 private:
  node::WorkerNode* worker_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> acked_{0};
  std::atomic<int> failed_{0};
  std::mutex mu_;
  std::string last_error_;
};

std::vector<uint64_t> AllKeys() {
  std::vector<uint64_t> keys(kKeys);
  for (int k = 0; k < kKeys; ++k) keys[k] = k;
  return keys;
}

// Stops both pushers and checks neither saw a failed push; the pushes acknowledged to both.
int StopPushers(Pusher& p0, Pusher& p1) {
  p0.Stop();
  p1.Stop();
  INFO("w0 last error: " << p0.last_error() << "; w1 last error: " << p1.last_error());
  CHECK(p0.failed() == 0);
  CHECK(p1.failed() == 0);
  return p0.acked() + p1.acked();
}

// Every key holds `expected` in each of its floats (pulled through the worker's partition).
void CheckSums(node::WorkerNode& w, int expected) {
  Result<node::PullResult> r = w.Pull(AllKeys()).get();
  INFO(r.status());
  REQUIRE(r.ok());
  REQUIRE(r->values.size() == static_cast<size_t>(kKeys * kFloatsPerKey));
  int wrong = 0;
  for (float v : r->values) wrong += v == static_cast<float>(expected) ? 0 : 1;
  INFO("expected " << expected << ", first value " << r->values[0]);
  CHECK(wrong == 0);
}

// Asks every server rank directly for each key (pscore.pull to that rank alone): exactly
// one server answers, the key's owner under `servers`, with `expected`; every other server
// refuses with kAborted.
void CheckExactlyOneOwner(node::WorkerNode& w, int servers, int expected) {
  REQUIRE(w.server_count() == servers);
  for (uint64_t k : AllKeys()) {
    int answered = 0;
    for (int rank = 0; rank < servers; ++rank) {
      BufferPtr req = core::EncodeKvPairs(&k, 1, nullptr, nullptr, 0);
      Result<BufferPtr> r = w.Call(rank, node::kPullHandler, req).get();
      if (!r.ok()) {
        INFO("key " << k << " at rank " << rank << ": " << r.status());
        CHECK(r.status().code() == Code::kAborted);
        continue;
      }
      ++answered;
      CHECK(rank == core::ServerForKey(k, servers));
      Result<core::KvView> v = core::DecodeKvPairs((*r)->data(), (*r)->size(), /*expect_values=*/true);
      REQUIRE(v.ok());
      REQUIRE(v->num_values == static_cast<size_t>(kFloatsPerKey));
      CHECK(v->values[0] == static_cast<float>(expected));
    }
    INFO("key " << k);
    CHECK(answered == 1);
  }
}

}  // namespace

TEST_CASE("scale-out 2->4 servers and 2->3 workers while two workers push loses no update",
          "[multiproc][net][scale][tlspass]") {
  ScaleJob job(/*workers=*/2, /*servers=*/2);
  job.Start("server", "s0");
  job.Start("server", "s1");
  node::WorkerNode w0(job.WorkerOptions("w0"));
  node::WorkerNode w1(job.WorkerOptions("w1"));
  REQUIRE(w0.Start().ok());
  REQUIRE(w1.Start().ok());
  REQUIRE(w0.WaitForReady(20s).ok());
  REQUIRE(w1.WaitForReady(20s).ok());
  const std::map<std::string, int> before = job.Ranks();
  REQUIRE(before.size() == 4);

  Pusher p0(&w0), p1(&w1);
  p0.Start();
  p1.Start();
  std::this_thread::sleep_for(200ms);
  pb::AdminRequest req;
  req.set_op("scale_out");
  req.set_worker_num(3);
  req.set_server_num(4);
  pb::AdminResponse started = job.Admin(req);
  CHECK(started.cluster_state() == pb::CLUSTER_SCALE_OUT);
  job.Start("server", "s2");
  job.Start("server", "s3");
  job.Start("worker", "w2");
  pb::AdminResponse ready = job.WaitReady();
  CHECK(ready.server_num() == 4);
  CHECK(ready.worker_num() == 3);
  CHECK(ready.registered_servers() == 4);
  std::this_thread::sleep_for(300ms);  // pushes go on under the new membership
  const int expected = StopPushers(p0, p1);
  REQUIRE(p0.acked() > 0);
  REQUIRE(p1.acked() > 0);
  CheckSums(w0, expected);
  CheckSums(w1, expected);
  CheckExactlyOneOwner(w0, 4, expected);

  std::map<std::string, int> after = job.Ranks();
  for (const auto& [id, rank] : before) {
    INFO(id);
    CHECK(after[id] == rank);  // existing ranks never change on scale-out
  }
  CHECK(std::set<int>{after["s2"], after["s3"]} == std::set<int>{2, 3});
  CHECK(after["w2"] == 2);
  w0.Stop();
  w1.Stop();
}

TEST_CASE("scale-in of server rank 0 of 3 while pushing loses no update and compacts ranks",
          "[multiproc][net][scale][tlspass]") {
  ScaleJob job(/*workers=*/2, /*servers=*/3);
  for (int i = 0; i < 3; ++i) job.Start("server", "s" + std::to_string(i), i);
  node::WorkerNode w0(job.WorkerOptions("w0"));
  node::WorkerNode w1(job.WorkerOptions("w1"));
  REQUIRE(w0.Start().ok());
  REQUIRE(w1.Start().ok());
  REQUIRE(w0.WaitForReady(20s).ok());
  REQUIRE(w1.WaitForReady(20s).ok());
  REQUIRE(job.Ranks()["s0"] == 0);

  Pusher p0(&w0), p1(&w1);
  p0.Start();
  p1.Start();
  std::this_thread::sleep_for(200ms);
  pb::AdminRequest req;
  req.set_op("scale_in");
  req.add_node_ids("s0");
  job.Admin(req);
  {
    std::optional<int> code = job.proc("s0").Wait(20s);
    INFO(job.proc("s0").Log());
    CHECK(code == std::optional<int>(0));  // the leaving process exits cleanly
  }
  pb::AdminResponse ready = job.WaitReady();
  CHECK(ready.server_num() == 2);
  std::this_thread::sleep_for(300ms);
  const int expected = StopPushers(p0, p1);
  CheckSums(w0, expected);
  CheckExactlyOneOwner(w1, 2, expected);

  std::map<std::string, int> after = job.Ranks();
  CHECK(after.count("s0") == 0);
  CHECK(after["s1"] == 0);  // survivors keep their order by old rank, made dense
  CHECK(after["s2"] == 1);
  CHECK(job.proc("s1").running());
  CHECK(job.proc("s2").running());
  w0.Stop();
  w1.Stop();
}

TEST_CASE("SIGKILL of a new server in the middle of a scale-out rolls back and tells every node",
          "[multiproc][net][scale]") {
  ScaleJob job(/*workers=*/1, /*servers=*/2);
  job.Start("server", "s0");
  job.Start("server", "s1");
  node::WorkerNode w0(job.WorkerOptions("w0"));
  auto rollback = std::make_shared<std::promise<std::string>>();
  auto told = std::make_shared<std::atomic<bool>>(false);
  node::Node::Callbacks cb;
  cb.on_cluster_event = [rollback, told](const pb::ClusterEventMessage& ev) {
    if (ev.kind() == pb::ClusterEventMessage::ROLLBACK && !told->exchange(true)) rollback->set_value(ev.message());
  };
  w0.SetCallbacks(cb);
  REQUIRE(w0.Start().ok());
  REQUIRE(w0.WaitForReady(20s).ok());
  Pusher pusher(&w0);
  pusher.Start();
  std::this_thread::sleep_for(200ms);

  // The scale-out also wants a second worker that never comes: it stays open, with s2 in.
  pb::AdminRequest req;
  req.set_op("scale_out");
  req.set_worker_num(2);
  req.set_server_num(3);
  job.Admin(req);
  job.Start("server", "s2");
  REQUIRE(job.WaitRegistered("s2"));
  job.proc("s2").Signal(SIGKILL);

  auto fut = rollback->get_future();
  REQUIRE(fut.wait_for(15s) == std::future_status::ready);
  const std::string why = fut.get();
  CHECK_THAT(why, Catch::Contains("s2") && Catch::Contains("timed out during scale-out"));
  pb::AdminResponse ready = job.WaitReady();
  CHECK(ready.server_num() == 2);
  CHECK(ready.worker_num() == 1);
  CHECK_THAT(ready.last_scale_result(), Catch::Contains("rolled back"));
  std::map<std::string, int> ranks = job.Ranks();
  CHECK(ranks.count("s2") == 0);
  CHECK(ranks["s0"] + ranks["s1"] == 1);

  std::this_thread::sleep_for(300ms);  // the job serves on with its old membership
  pusher.Stop();
  INFO("last error: " << pusher.last_error());
  CHECK(pusher.failed() == 0);
  CheckSums(w0, pusher.acked());
  CheckExactlyOneOwner(w0, 2, pusher.acked());
  CHECK(job.proc("s0").running());
  CHECK(job.proc("s1").running());
  w0.Stop();
}

TEST_CASE("a scale-out that times out drops the new server it admitted, which then exits 1",
          "[multiproc][net][scale]") {
  // s1 is started after the scale-out began and must register within its timeout, which
  // therefore leaves room for a process start on a loaded machine.
  ScaleJob job(/*workers=*/1, /*servers=*/1, /*scale_timeout_ms=*/5000);
  job.Start("server", "s0");
  job.Start("worker", "w0");
  job.WaitReady();
  pb::AdminRequest req;
  req.set_op("scale_out");
  req.set_worker_num(2);  // the second worker never comes
  req.set_server_num(2);
  job.Admin(req);
  // Dropped by the rollback, it is refused "quota full" and waits 1 s for another scale-out.
  job.Start("server", "s1", -1, {"--join_timeout_ms=1000"});
  REQUIRE(job.WaitRegistered("s1"));
  pb::AdminResponse ready = job.WaitReady();
  CHECK(ready.server_num() == 1);
  CHECK(ready.worker_num() == 1);
  CHECK_THAT(ready.last_scale_result(), Catch::Contains("rolled back: scale-out timed out after 5000 ms"));
  CHECK_THAT(ready.last_scale_result(), Catch::Contains("0 of 1 new workers registered"));
  std::optional<int> code = job.proc("s1").Wait(15s);
  const std::string log = job.proc("s1").Log();
  INFO(log);
  CHECK(code == std::optional<int>(1));
  CHECK_THAT(log, Catch::Contains("quota full"));
  CHECK_THAT(log, Catch::Contains("no scale-out made room"));
  CHECK(job.Ranks().count("s1") == 0);
  CHECK(job.proc("s0").running());
}

// Asks for a scale-out of the 1-worker job to 2 servers; `joining`, started before and
// waiting, is admitted as server rank 1 and the scale-out ends done.
void ScaleOutToTwoServers(ScaleJob& job, const std::string& joining) {
  pb::AdminRequest req;
  req.set_op("scale_out");
  req.set_worker_num(1);
  req.set_server_num(2);
  job.Admin(req);
  pb::AdminResponse ready = job.WaitReady();
  CHECK(ready.server_num() == 2);
  CHECK(ready.registered_servers() == 2);
  CHECK_THAT(ready.last_scale_result(), Catch::Contains("done"));
  CHECK(job.Ranks()[joining] == 1);
}

// Lets the pusher go on under the new membership, stops it, and checks that no push failed,
// every key holds every acknowledged push, and one of `servers` owns each key.
void StopAndCheck(Pusher& pusher, node::WorkerNode& w0, int servers) {
  std::this_thread::sleep_for(300ms);
  pusher.Stop();
  INFO("last error: " << pusher.last_error());
  CHECK(pusher.failed() == 0);
  REQUIRE(pusher.acked() > 0);
  CheckSums(w0, pusher.acked());
  CheckExactlyOneOwner(w0, servers, pusher.acked());
}

TEST_CASE("a server started before its scale-out waits and joins it - one that waits past --join_timeout_ms exits 1",
          "[multiproc][net][scale][tlspass]") {
  ScaleJob job(/*workers=*/1, /*servers=*/1);
  job.Start("server", "s0");
  node::WorkerNode w0(job.WorkerOptions("w0"));
  REQUIRE(w0.Start().ok());
  REQUIRE(w0.WaitForReady(20s).ok());
  Pusher pusher(&w0);
  pusher.Start();
  // Started before the scale-out is asked (as an operator scaling a StatefulSet may): it is
  // refused "quota full" and registers again instead of exiting.
  Process& early = job.Start("server", "s1");
  const bool waits = WaitForLog(early, "registering again until a scale-out makes room");
  INFO(early.Log());
  REQUIRE(waits);
  std::this_thread::sleep_for(500ms);
  REQUIRE(early.running());
  CHECK(job.Ranks().count("s1") == 0);

  ScaleOutToTwoServers(job, "s1");
  CHECK_THAT(early.Log(), Catch::Contains("admitted after"));
  StopAndCheck(pusher, w0, 2);

  // The quota is full again: a server that waits 1 s for a scale-out that never comes exits 1.
  const auto started = std::chrono::steady_clock::now();
  Process& late = job.Start("server", "s2", -1, {"--join_timeout_ms=1000"});
  std::optional<int> code = late.Wait(20s);
  const auto waited = std::chrono::steady_clock::now() - started;
  INFO(late.Log());
  CHECK(code == std::optional<int>(1));
  CHECK(waited >= 1s);
  CHECK_THAT(late.Log(), Catch::Contains("server quota full (2/2)") && Catch::Contains("no scale-out made room"));
  // It asked at least 5 times (waits of 100, 200, 400, 800 ms); the scheduler wrote one line.
  CHECK(Occurrences(job.SchedulerLog(), "refused server s2") == 1);
  CHECK(job.Ranks().count("s2") == 0);
  CHECK(early.running());
  w0.Stop();
}

TEST_CASE("a server started while a scale-in runs waits through it and joins the next scale-out",
          "[multiproc][net][scale]") {
  // Members time out after 10 s: the leaving server is paused below that to hold the scale-in open.
  ScaleJob job(/*workers=*/1, /*servers=*/2, /*scale_timeout_ms=*/30000, /*heartbeat_timeout_ms=*/10000);
  job.Start("server", "s0", 0);
  Process& leaving = job.Start("server", "s1", 1);
  node::WorkerNode w0(job.WorkerOptions("w0"));
  REQUIRE(w0.Start().ok());
  REQUIRE(w0.WaitForReady(20s).ok());
  Pusher pusher(&w0);
  pusher.Start();
  std::this_thread::sleep_for(200ms);

  // Paused, the leaving server cannot hand its keys over: the scale-in stays open.
  leaving.Signal(SIGSTOP);
  pb::AdminRequest in;
  in.set_op("scale_in");
  in.add_node_ids("s1");
  job.Admin(in);
  Process& late = job.Start("server", "s2");
  const bool waits = WaitForLog(late, "registering again until the scale-in ends");
  leaving.Signal(SIGCONT);
  INFO("s2:\n" << late.Log() << "\nscheduler:\n" << job.SchedulerLog());
  REQUIRE(waits);
  CHECK_THAT(late.Log(), Catch::Contains("scale-in running; new node s2 refused"));
  CHECK(leaving.Wait(20s) == std::optional<int>(0));
  const pb::AdminResponse ready = job.WaitReady();
  CHECK(ready.server_num() == 1);
  CHECK_THAT(ready.last_scale_result(), Catch::Contains("done"));

  // After the scale-in the quota is full (1/1): it goes on waiting, now for a scale-out.
  REQUIRE(WaitForLog(late, "server quota full (1/1); registering again until a scale-out makes room"));
  REQUIRE(late.running());
  CHECK(job.Ranks().count("s2") == 0);
  ScaleOutToTwoServers(job, "s2");
  CHECK_THAT(late.Log(), Catch::Contains("admitted after") &&
                             Catch::Contains("of \"scale-in running\", then \"quota full\""));
  StopAndCheck(pusher, w0, 2);
  // The scheduler logged each reason it refused the server for once.
  CHECK(Occurrences(job.SchedulerLog(), "refused server s2") == 2);
  w0.Stop();
}

}  // namespace pscore

namespace pscore {

TEST_CASE("scale-out then scale-in back to back while pushing: every update kept, ranks as documented",
          "[multiproc][net][scale]") {
  ScaleJob job(/*workers=*/2, /*servers=*/2);
  job.Start("server", "s0", 0);
  job.Start("server", "s1", 1);
  node::WorkerNode w0(job.WorkerOptions("w0"));
  node::WorkerNode w1(job.WorkerOptions("w1"));
  REQUIRE(w0.Start().ok());
  REQUIRE(w1.Start().ok());
  REQUIRE(w0.WaitForReady(20s).ok());
  REQUIRE(w1.WaitForReady(20s).ok());
  Pusher p0(&w0), p1(&w1);
  p0.Start();
  p1.Start();
  for (int round = 0; round < 3; ++round) {
    const std::string id = "n" + std::to_string(round);
    pb::AdminRequest out;
    out.set_op("scale_out");
    out.set_worker_num(2);
    out.set_server_num(3);
    job.Admin(out);
    job.Start("server", id);
    job.WaitReady();
    // The oldest server leaves at once: the new one must hand over keys it just received.
    std::map<std::string, int> ranks = job.Ranks();
    std::string leaving;
    for (const auto& [node_id, rank] : ranks) {
      if (rank == 0 && node_id[0] != 'w') leaving = node_id;
    }
    REQUIRE(!leaving.empty());
    pb::AdminRequest in;
    in.set_op("scale_in");
    in.add_node_ids(leaving);
    job.Admin(in);
    CHECK(job.proc(leaving).Wait(20s) == std::optional<int>(0));
    pb::AdminResponse ready = job.WaitReady();
    CHECK(ready.server_num() == 2);
  }
  std::this_thread::sleep_for(200ms);
  const int expected = StopPushers(p0, p1);
  CheckSums(w0, expected);
  CheckExactlyOneOwner(w1, 2, expected);
  w0.Stop();
  w1.Stop();
}

}  // namespace pscore

namespace pscore {

TEST_CASE("SIGKILL of an old server mid-scale-out rolls back - the job waits for it in NODE_TIMEOUT",
          "[multiproc][net][scale]") {
  ScaleJob job(/*workers=*/1, /*servers=*/2);
  job.Start("server", "s0", 0);
  job.Start("server", "s1", 1);
  node::WorkerNode w0(job.WorkerOptions("w0"));
  auto rollback = std::make_shared<std::promise<std::string>>();
  auto told = std::make_shared<std::atomic<bool>>(false);
  node::Node::Callbacks cb;
  cb.on_cluster_event = [rollback, told](const pb::ClusterEventMessage& ev) {
    if (ev.kind() == pb::ClusterEventMessage::ROLLBACK && !told->exchange(true)) rollback->set_value(ev.message());
  };
  w0.SetCallbacks(cb);
  REQUIRE(w0.Start().ok());
  REQUIRE(w0.WaitForReady(20s).ok());
  REQUIRE(w0.Push(AllKeys(), std::vector<float>(kKeys * kFloatsPerKey, 1.0f)).get().ok());
  pb::AdminRequest req;
  req.set_op("scale_out");
  req.set_worker_num(1);
  req.set_server_num(3);
  job.Admin(req);
  job.proc("s1").Signal(SIGKILL);
  auto fut = rollback->get_future();
  REQUIRE(fut.wait_for(15s) == std::future_status::ready);
  CHECK_THAT(fut.get(), Catch::Contains("s1") && Catch::Contains("timed out during scale-out"));
  for (int i = 0; i < 100 && w0.cluster_state() != pb::NODE_TIMEOUT; ++i) std::this_thread::sleep_for(50ms);
  CHECK(pb::ClusterState_Name(w0.cluster_state()) == "NODE_TIMEOUT");
  CHECK(w0.server_count() == 2);
  job.Start("server", "s1", 1);  // the same node id comes back with its rank
  job.WaitReady();
  CHECK(job.Ranks()["s1"] == 1);
  // Nothing replicates a server's store: keys of the killed server are gone (a Pull names
  // one), the survivor's keys are intact.
  Result<node::PullResult> all = w0.Pull(AllKeys()).get();
  CHECK(all.status().code() == Code::kNotFound);
  std::vector<uint64_t> kept;
  for (uint64_t k : AllKeys()) {
    if (core::ServerForKey(k, 2) == 0) kept.push_back(k);
  }
  REQUIRE(!kept.empty());
  Result<node::PullResult> survivor = w0.Pull(kept).get();
  REQUIRE(survivor.ok());
  for (float v : survivor->values) CHECK(v == 1.0f);
  w0.Stop();
}

}  // namespace pscore
