// In-process scaling: scale-out and scale-in while a worker pushes, with no update lost.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <map>
#include <thread>

#include "pscore/core/key_range.h"
#include "pscore/core/kv_codec.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_journal.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"
#include "multiproc/process.h"

#include "node/raw_link.h"  // last: pulls in Catch, whose CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;

NodeOptions Opts(pb::NodeRole role, int port, const std::string& id) {
  NodeOptions o;
  o.role = role;
  o.scheduler_port = port;
  o.node_id = id;
  o.heartbeat_interval = 50ms;
  o.connect_timeout = 5s;
  o.request_timeout = 20s;
  return o;
}

// Runs an admin operation on the scheduler's loop; its answer, or a failure after 60 s (a
// scale ends within scale_timeout, 10 s here). The promise is shared with the callback so
// a late answer after the deadline writes into live memory.
Status AdminOp(SchedulerNode& s, pb::AdminRequest req) {
  auto p = std::make_shared<std::promise<Status>>();
  std::future<Status> f = p->get_future();
  s.loop()->Post([&s, req, p] { s.Admin(req, [p](Status st, pb::AdminResponse) { p->set_value(st); }); });
  if (f.wait_for(60s) != std::future_status::ready) {
    return Status(Code::kTimeout, "admin " + req.op() + " not answered in 60 s");
  }
  return f.get();
}

bool WaitState(SchedulerNode& s, pb::ClusterState want, Duration timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (s.cluster_state() == want) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// Pushes +1 to every key in rounds until stopped; counts acknowledged rounds. Large keys
// go by ZPush (written from the shared values; the servers fold them in as they arrive).
struct Pusher {
  WorkerNode* worker;
  std::vector<uint64_t> keys;
  uint32_t floats = 4;  // per key
  std::atomic<bool> stop{false};
  std::atomic<int> acked{0};
  std::atomic<int> failed{0};
  std::thread thread;
  void Start() {
    thread = std::thread([this] {
      auto ones = std::make_shared<const std::vector<float>>(keys.size() * floats, 1.0f);
      const bool zero_copy = floats * sizeof(float) >= core::kZeroCopyBytes;
      while (!stop) {
        Status st = (zero_copy ? worker->ZPush(keys, ones) : worker->Push(keys, *ones)).get();
        if (st.ok()) {
          ++acked;
        } else {
          ++failed;
          UNSCOPED_INFO("push failed: " << st);
        }
      }
    });
  }
  void Stop() {
    stop = true;
    thread.join();
  }
};

SchedulerOptions Sched(int workers, int servers) {
  SchedulerOptions o;
  o.worker_num = workers;
  o.server_num = servers;
  o.heartbeat_interval = 50ms;
  o.heartbeat_timeout = 2s;
  o.scale_timeout = 10s;
  return o;
}

void CheckSums(WorkerNode& w, const std::vector<uint64_t>& keys, int acked, uint32_t floats = 4) {
  Result<PullResult> r = w.Pull(keys).get();
  REQUIRE(r.ok());
  REQUIRE(r->values.size() == keys.size() * floats);
  for (float v : r->values) REQUIRE(v == static_cast<float>(acked));
  // PullSync key by key (one server each: the direct way, or Pull when the keys moved
  // after the worker's last look at the metadata) agrees.
  for (uint64_t k : keys) {
    Result<PullResult> one = w.PullSync({k});
    REQUIRE(one.ok());
    REQUIRE(one->values == std::vector<float>(floats, static_cast<float>(acked)));
  }
}

}  // namespace

// A scheduler, servers s0.. (server i asks for rank i), one worker w0 at READY, and a
// pusher adding 1 to keys 0..num_keys-1 (`floats` each) in rounds. Stops everything, in
// order, when it goes.
class PushingJob {
 public:
  explicit PushingJob(int servers, int num_keys = 64, uint32_t floats = 4) : sched_(Sched(1, servers)) {
    REQUIRE(sched_.Start().ok());
    for (int i = 0; i < servers; ++i) {
      NodeOptions o = Opts(pb::SERVER, sched_.port(), "s" + std::to_string(i));
      o.rank = i;
      AddServer(o);
    }
    worker_ = std::make_unique<WorkerNode>(Opts(pb::WORKER, sched_.port(), "w0"));
    REQUIRE(worker_->Start().ok());
    REQUIRE(worker_->WaitForReady(10s).ok());
    pusher_.worker = worker_.get();
    pusher_.floats = floats;
    for (uint64_t k = 0; k < static_cast<uint64_t>(num_keys); ++k) pusher_.keys.push_back(k);
    pusher_.Start();
    std::this_thread::sleep_for(100ms);
  }
  ~PushingJob() {
    if (!pusher_.stop) pusher_.Stop();
    worker_->Stop();
    for (auto& s : servers_) s->Stop();
    sched_.Stop();
  }
  NodeOptions ServerOpts(const std::string& id) { return Opts(pb::SERVER, sched_.port(), id); }
  void AddServer(const NodeOptions& o) {
    servers_.push_back(std::make_unique<ServerNode>(o));
    REQUIRE(servers_.back()->Start().ok());
  }
  Status Admin(pb::AdminRequest req) { return AdminOp(sched_, std::move(req)); }
  // Waits up to `timeout` for the pusher's first acknowledged round (every key exists).
  bool WaitFirstRound(Duration timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (pusher_.acked == 0 && pusher_.failed == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    return pusher_.acked > 0;
  }
  // Waits for READY, lets pushes run a little longer, stops the pusher and checks that
  // none failed and every key holds exactly the acknowledged rounds.
  void FinishAndCheckSums() {
    REQUIRE(WaitState(sched_, pb::CLUSTER_READY, 15s));
    std::this_thread::sleep_for(200ms);
    pusher_.Stop();
    CHECK(pusher_.failed == 0);
    REQUIRE(pusher_.acked > 0);
    CheckSums(*worker_, pusher_.keys, pusher_.acked, pusher_.floats);
  }
  bool Holds(ServerNode& s, uint64_t key) {
    std::vector<uint32_t> lens;
    std::vector<float> vals;
    return s.store().Pull(&key, 1, &lens, &vals).ok();
  }
  ServerNode& server(size_t i) { return *servers_.at(i); }
  size_t num_servers() const { return servers_.size(); }
  WorkerNode& worker() { return *worker_; }
  SchedulerNode& sched() { return sched_; }
  const std::vector<uint64_t>& keys() const { return pusher_.keys; }

 private:
  SchedulerNode sched_;
  std::vector<std::unique_ptr<ServerNode>> servers_;
  std::unique_ptr<WorkerNode> worker_;
  Pusher pusher_;
};

pb::AdminRequest ScaleOut(int servers) {
  pb::AdminRequest req;
  req.set_op("scale_out");
  req.set_worker_num(1);
  req.set_server_num(servers);
  return req;
}

TEST_CASE("scale-out 2->4 servers while pushing loses no update and keeps old ranks", "[node][net][scale]") {
  PushingJob job(2);
  REQUIRE(job.Admin(ScaleOut(4)).ok());
  for (int i = 2; i < 4; ++i) job.AddServer(job.ServerOpts("s" + std::to_string(i)));
  job.FinishAndCheckSums();
  CHECK(job.worker().server_count() == 4);
  for (int i = 0; i < 2; ++i) CHECK(job.server(i).rank() == i);
  // Every key lives on exactly one server: its owner under 4 servers.
  for (size_t i = 0; i < job.num_servers(); ++i) {
    for (uint64_t k : job.keys()) CHECK(job.Holds(job.server(i), k) == (core::ServerForKey(k, 4) == job.server(i).rank()));
  }
}

TEST_CASE("scale-out 2->4 servers while large ZPushes are folded in as they arrive loses no update",
          "[node][net][scale][stream]") {
  PushingJob job(2, /*num_keys=*/8, /*floats=*/64 * 1024);  // 256 KiB a key
  REQUIRE(job.Admin(ScaleOut(4)).ok());
  for (int i = 2; i < 4; ++i) job.AddServer(job.ServerOpts("s" + std::to_string(i)));
  job.FinishAndCheckSums();
  uint64_t streamed = 0;
  for (size_t i = 0; i < job.num_servers(); ++i) streamed += job.server(i).streamed_pushes();
  CHECK(streamed > 0);
  for (size_t i = 0; i < job.num_servers(); ++i) {
    for (uint64_t k : job.keys()) CHECK(job.Holds(job.server(i), k) == (core::ServerForKey(k, 4) == job.server(i).rank()));
  }
}

TEST_CASE("Pulls of large keys during a scale-out 2->4 read whole pushes into their results - values never go back",
          "[node][net][scale][stream]") {
  PushingJob job(2, /*num_keys=*/8, /*floats=*/64 * 1024);  // 256 KiB a key
  // Another thread of the same worker pulls every key again and again, once they exist (a
  // Pull of a key never pushed is kNotFound: on a busy machine the first round may take
  // longer than the job's start-up pause). After the first Pull the worker knows the keys'
  // sizes, so the answers are read into the results; parts held or refused while the keys
  // move are sent again to the new owners.
  REQUIRE(job.WaitFirstRound(30s));
  const uint64_t in_place_before = job.worker().in_place_pulls();
  std::atomic<bool> stop{false};
  std::atomic<int> pulls{0}, failed{0}, torn{0}, went_back{0};
  std::string first_failure;  // the puller's until it is joined
  std::thread puller([&] {
    std::vector<float> last(job.keys().size(), 0.0f);
    const uint32_t floats = 64 * 1024;
    while (!stop) {
      std::future<Result<PullResult>> f = job.worker().Pull(job.keys());
      if (f.wait_for(30s) != std::future_status::ready) {
        ++failed;
        return;  // the op keeps its result alive; nothing waits on it any more
      }
      Result<PullResult> r = f.get();
      if (!r.ok() || r->values.size() != job.keys().size() * floats) {
        if (failed++ == 0) {
          first_failure = r.ok() ? std::to_string(r->values.size()) + " floats" : r.status().ToString();
        }
        continue;
      }
      for (size_t k = 0; k < job.keys().size(); ++k) {
        const float* v = r->values.data() + k * floats;
        if (std::any_of(v, v + floats, [&](float x) { return x != v[0]; })) ++torn;
        if (v[0] < last[k]) ++went_back;
        last[k] = v[0];
      }
      ++pulls;
    }
  });
  REQUIRE(job.Admin(ScaleOut(4)).ok());
  for (int i = 2; i < 4; ++i) job.AddServer(job.ServerOpts("s" + std::to_string(i)));
  job.FinishAndCheckSums();
  stop = true;
  puller.join();
  INFO("first failed Pull: " << first_failure);
  CHECK(failed == 0);
  CHECK(torn == 0);
  CHECK(went_back == 0);
  CHECK(pulls > 1);
  CHECK(job.worker().in_place_pulls() > in_place_before);
}

TEST_CASE("a new server whose data dir holds an earlier membership's entries keeps only what the owners send",
          "[node][net][scale][journal]") {
  // The journal of an earlier life: every pushed key with a stale value, and keys no
  // server of this job has.
  pscore::testing::TempDir dir;
  REQUIRE(!dir.path().empty());
  std::vector<uint64_t> stale_keys;
  for (uint64_t k = 0; k < 64; ++k) stale_keys.push_back(k);
  for (uint64_t k = 5000; k < 5016; ++k) stale_keys.push_back(k);
  {
    core::ParamStore scratch(core::ParamStore::Options{});
    ServerJournal journal(dir.path());
    REQUIRE(journal.Open(&scratch).ok());
    std::vector<uint32_t> lens(stale_keys.size(), 4);
    std::vector<float> values(stale_keys.size() * 4, 1000.0f);
    BufferPtr body = core::EncodeKvPairs(stale_keys.data(), stale_keys.size(), lens.data(), values.data(),
                                         values.size());
    REQUIRE(journal.Append(core::JournalOp::kInsert, std::string_view(body->data(), body->size())).ok());
  }
  PushingJob job(2);
  REQUIRE(job.Admin(ScaleOut(3)).ok());
  NodeOptions o = job.ServerOpts("s2");
  o.data_dir = dir.path();
  job.AddServer(o);
  job.FinishAndCheckSums();  // migrated entries overwrote the stale ones
  for (size_t i = 0; i < job.num_servers(); ++i) {
    for (uint64_t k = 5000; k < 5016; ++k) CHECK_FALSE(job.Holds(job.server(i), k));
  }
}

TEST_CASE("scale-in of server rank 0 of 3 while pushing loses no update and compacts ranks", "[node][net][scale]") {
  PushingJob job(3);
  pb::AdminRequest req;
  req.set_op("scale_in");
  req.add_node_ids("s0");
  REQUIRE(job.Admin(req).ok());
  REQUIRE(job.server(0).WaitForTermination(15s).ok());  // The leaving server is told to exit, cleanly.
  job.FinishAndCheckSums();
  CHECK(job.worker().server_count() == 2);
  CHECK(job.server(1).rank() == 0);
  CHECK(job.server(2).rank() == 1);
}

TEST_CASE("a collective receive from a rank that a scale-in removes fails once the view shrinks", "[node][net][scale]") {
  PushingJob job(3);
  REQUIRE(job.server(2).rank() == 2);
  auto from_leaving = job.server(0).CollectiveRecv(2, "never");
  auto from_staying = job.server(0).CollectiveRecv(1, "kept");
  pb::AdminRequest req;
  req.set_op("scale_in");
  req.add_node_ids("s2");
  REQUIRE(job.Admin(req).ok());
  REQUIRE(job.server(2).WaitForTermination(15s).ok());
  REQUIRE(from_leaving.wait_for(15s) == std::future_status::ready);
  Result<BufferPtr> gone = from_leaving.get();
  CHECK(gone.status().code() == Code::kUnavailable);
  CHECK_THAT(gone.status().message(), Catch::Contains("the cluster has 2 servers now"));
  // Rank 1 is still there: its receive waits on, and gets what rank 1 sends.
  CHECK(from_staying.wait_for(0s) == std::future_status::timeout);
  auto sent = job.server(1).CollectiveSend(0, "kept", Buffer::FromString("still here"));
  REQUIRE(sent.wait_for(10s) == std::future_status::ready);
  REQUIRE(sent.get().ok());
  REQUIRE(from_staying.wait_for(10s) == std::future_status::ready);
  Result<BufferPtr> kept = from_staying.get();
  REQUIRE(kept.ok());
  CHECK((*kept)->view() == "still here");
  job.FinishAndCheckSums();
}

TEST_CASE("a server that left by a scale-in serves none of its old range after the cluster is READY again",
          "[node][net][scale]") {
  // The leaving server's link is still up after its TERMINATE, so the state change to
  // READY reaches it too. A terminated node applies nothing more: its view stays that of
  // the hand-over (no range), so a push still on its way to it is refused and sent again
  // to the new owner, not applied where it would be lost with the server.
  PushingJob job(3);
  pb::AdminRequest req;
  req.set_op("scale_in");
  req.add_node_ids("s2");
  REQUIRE(job.Admin(req).ok());
  REQUIRE(job.server(2).WaitForTermination(15s).ok());
  REQUIRE(WaitState(job.sched(), pb::CLUSTER_READY, 15s));
  uint64_t old_key = 0;
  while (core::ServerForKey(old_key, 3) != 2) ++old_key;
  pscore::testing::RawLink peer(job.server(2).listen_port(), "raw-peer");
  peer.HelloAsWorker("w0");
  pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::WORKER, -1);
  meta.set_handler(kPushHandler);
  const uint32_t len = 4;
  const std::vector<float> ones(len, 1.0f);
  // Tried for a while: the state change may reach s2 after the scheduler is READY.
  for (auto until = std::chrono::steady_clock::now() + 500ms; std::chrono::steady_clock::now() < until;) {
    std::future<Result<comm::Frame>> push =
        peer.CallAsync(meta, core::EncodeKvPairs(&old_key, 1, &len, ones.data(), len), 5s);
    REQUIRE(push.wait_for(10s) == std::future_status::ready);
    Result<comm::Frame> r = push.get();
    INFO(r.status());
    REQUIRE(r.status().code() == Code::kAborted);
    std::this_thread::sleep_for(20ms);
  }
  job.FinishAndCheckSums();
}

// A process a scale-in removed, registering again after it missed the TERMINATE (its link
// was down) with a scheduler restarted from --state_dir since: it is told to end, as that
// scheduler's predecessor would have told it, and not refused as one too many.
TEST_CASE("a scheduler restarted from its state dir still knows a process a scale-in removed - it is told it left",
          "[node][net][scale][state]") {
  pscore::testing::TempDir dir;
  REQUIRE(dir.ok());
  SchedulerOptions so = Sched(2, 1);
  so.state_dir = dir.path();
  auto sched = std::make_unique<SchedulerNode>(so);
  REQUIRE(sched->Start().ok());
  ServerNode server(Opts(pb::SERVER, sched->port(), "s0"));
  REQUIRE(server.Start().ok());
  WorkerNode w0(Opts(pb::WORKER, sched->port(), "w0"));
  REQUIRE(w0.Start().ok());
  WorkerNode w1(Opts(pb::WORKER, sched->port(), "w1"));
  REQUIRE(w1.Start().ok());
  REQUIRE(w0.WaitForReady(10s).ok());
  REQUIRE(w1.WaitForReady(10s).ok());
  std::promise<uint64_t> registered;  // w1's incarnation, as the scheduler holds it
  sched->loop()->Post([&] { registered.set_value(sched->cluster().Find("w1")->incarnation); });
  std::future<uint64_t> incarnation = registered.get_future();
  REQUIRE(incarnation.wait_for(10s) == std::future_status::ready);
  const uint64_t left_incarnation = incarnation.get();
  pb::AdminRequest req;
  req.set_op("scale_in");
  req.add_node_ids("w1");
  REQUIRE(AdminOp(*sched, req).ok());
  REQUIRE(w1.WaitForTermination(15s).ok());
  REQUIRE(WaitState(*sched, pb::CLUSTER_READY, 10s));
  const int port = sched->port();
  sched->Stop();  // a clean stop writes the newest state
  sched.reset();

  so.port = port;  // the members redial the same address
  SchedulerNode restarted(so);
  REQUIRE(restarted.Start().ok());
  pscore::testing::RawLink stale(restarted.port(), "raw-stale");
  pb::RegisterMessage reg;
  reg.set_ip("127.0.0.1");
  reg.set_port(1);
  reg.set_node_id("w1");
  reg.set_role(pb::WORKER);
  reg.set_incarnation(left_incarnation);
  reg.set_protocol_version(kProtocolVersion);
  reg.set_requested_rank(-1);
  Result<comm::Frame> stale_answer = stale.Call(pb::REGISTER, reg);
  REQUIRE_FALSE(stale_answer.ok());
  CHECK(stale_answer.status().code() == Code::kFailedPrecondition);
  CHECK_THAT(stale_answer.status().message(), Catch::Contains("node w1 left the cluster in a scale-in"));
  // A new process under that id is not the one that left: refused as one worker too many.
  reg.set_incarnation(left_incarnation + 1);
  Result<comm::Frame> other = stale.Call(pb::REGISTER, reg);
  REQUIRE_FALSE(other.ok());
  CHECK_THAT(other.status().message(), !Catch::Contains("left the cluster"));
  REQUIRE(WaitState(restarted, pb::CLUSTER_READY, 10s));
  CHECK(w0.Push({1, 2}, {1, 1}).get().ok());  // the job goes on with the worker that stayed
  w0.Stop();
  server.Stop();
  restarted.Stop();
}

TEST_CASE("a worker on a shared loop destroyed after a scale-in leaves no timer behind that would use it",
          "[node][net][scale]") {
  // The link to a server that left is closed request_timeout later, by a timer on the
  // loop; on a shared loop it must go with the worker (ASan: heap-use-after-free before).
  comm::EventLoop loop("shared");
  REQUIRE(loop.Start().ok());
  SchedulerNode sched(Sched(1, 2));
  REQUIRE(sched.Start().ok());
  ServerNode s0(Opts(pb::SERVER, sched.port(), "s0"));
  ServerNode s1(Opts(pb::SERVER, sched.port(), "s1"));
  REQUIRE(s0.Start().ok());
  REQUIRE(s1.Start().ok());
  NodeOptions wo = Opts(pb::WORKER, sched.port(), "w0");
  wo.request_timeout = 500ms;
  auto worker = std::make_unique<WorkerNode>(wo, &loop);
  REQUIRE(worker->Start().ok());
  REQUIRE(worker->WaitForReady(10s).ok());
  const int leaving_rank = s1.rank();
  // Opens the link: the server answers kNotFound (no handler 99). A slow first dial may
  // outlast the short request timeout; the link stays and the next call is answered.
  Code answered = Code::kTimeout;
  for (int attempt = 0; attempt < 10 && answered == Code::kTimeout; ++attempt) {
    auto linked = worker->Send(leaving_rank, 99, nullptr);
    REQUIRE(linked.wait_for(10s) == std::future_status::ready);
    answered = linked.get().status().code();
  }
  CHECK(answered == Code::kNotFound);
  pb::AdminRequest req;
  req.set_op("scale_in");
  req.add_node_ids("s1");
  REQUIRE(AdminOp(sched, req).ok());
  auto deadline = std::chrono::steady_clock::now() + 15s;
  while (worker->server_count() != 1) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(10ms);
  }
  worker->Stop();
  worker.reset();
  std::this_thread::sleep_for(1s);  // past the timer's 500 ms, the shared loop running
  bool alive = false;
  loop.RunAndWait([&alive] { alive = true; });
  CHECK(alive);
  REQUIRE(loop.Stop().ok());
}

TEST_CASE("workers holding the worker's view learn their compacted ranks after a worker scale-in - and a scale-out completes",
          "[node][net][scale]") {
  SchedulerOptions so = Sched(3, 1);
  so.worker_metadata_view_over = 1;  // every worker gets the view: servers and totals only
  SchedulerNode sched(so);
  REQUIRE(sched.Start().ok());
  ServerNode s0(Opts(pb::SERVER, sched.port(), "s0"));
  REQUIRE(s0.Start().ok());
  std::vector<std::unique_ptr<WorkerNode>> w;
  for (int i = 0; i < 3; ++i) {
    NodeOptions o = Opts(pb::WORKER, sched.port(), "w" + std::to_string(i));
    o.rank = i;
    w.push_back(std::make_unique<WorkerNode>(o));
  }
  for (auto& n : w) REQUIRE(n->Start().ok());
  for (auto& n : w) REQUIRE(n->WaitForReady(10s).ok());
  REQUIRE(s0.WaitForReady(10s).ok());  // the server may learn READY after the workers
  for (int i = 0; i < 3; ++i) {
    CHECK(w[i]->rank() == i);
    CHECK(w[i]->metadata().omitted_workers() == 3);
    CHECK(w[i]->metadata().workers_meta_size() == 0);
  }
  CHECK(s0.metadata().workers_meta_size() == 3);
  pb::AdminRequest req;
  req.set_op("scale_in");
  req.add_node_ids("w0");
  REQUIRE(AdminOp(sched, req).ok());  // answered when accepted
  // Done when the survivors hold the metadata of 2 workers and the cluster is READY again.
  auto until = std::chrono::steady_clock::now() + 20s;
  while (!(w[1]->metadata().worker_num() == 2 && w[2]->metadata().worker_num() == 2 &&
           sched.cluster_state() == pb::CLUSTER_READY) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(sched.cluster_state() == pb::CLUSTER_READY);
  REQUIRE(w[1]->metadata().worker_num() == 2);
  std::map<std::string, int> want;
  sched.loop()->RunAndWait([&] {
    for (const char* id : {"w1", "w2"}) {
      const core::NodeRecord* rec = sched.cluster().Find(id);
      want[id] = rec == nullptr ? -2 : rec->rank;
    }
  });
  CHECK(want["w1"] != 1);  // the ranks were compacted
  // A heartbeat answer (every 50 ms) carries the new rank.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while ((w[1]->rank() != want["w1"] || w[2]->rank() != want["w2"]) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK(w[1]->rank() == want["w1"]);
  CHECK(w[2]->rank() == want["w2"]);
  CHECK(w[1]->metadata().rank_id() == want["w1"]);
  CHECK(w[2]->metadata().omitted_workers() == 2);
  // A scale-out back to 3 workers completes on the view's counts (workers_meta + omitted).
  pb::AdminRequest out;
  out.set_op("scale_out");
  out.set_worker_num(3);
  out.set_server_num(1);
  std::future<Status> scaled = std::async(std::launch::async, [&] { return AdminOp(sched, out); });
  REQUIRE(WaitState(sched, pb::CLUSTER_SCALE_OUT, 15s));
  WorkerNode w3(Opts(pb::WORKER, sched.port(), "w3"));
  REQUIRE(w3.Start().ok());
  CHECK(scaled.get().ok());  // AdminOp gives up after 60 s
  CHECK(WaitState(sched, pb::CLUSTER_READY, 15s));
  CHECK(w3.WaitForReady(10s).ok());
  w3.Stop();
  for (auto& n : w) n->Stop();
  s0.Stop();
  sched.Stop();
}

// What servers of the server's view hold of the workers, by rank: ids from the metadata's
// worker_ids, with no worker entry.
void CheckServerView(ServerNode& s, const std::vector<std::string>& workers) {
  const pb::SendMetadataMessage md = s.metadata();
  CHECK(md.workers_meta_size() == 0);
  CHECK(md.omitted_workers() == static_cast<int>(workers.size()));
  CHECK(md.worker_ids_size() == static_cast<int>(workers.size()));
  CHECK(s.NodeIds(pb::WORKER) == workers);
}

TEST_CASE("servers holding the server's view (worker ids and ranks) serve every worker, follow a worker scale-in "
          "and complete a scale-out",
          "[node][net][scale][metadata]") {
  SchedulerOptions so = Sched(3, 2);
  so.worker_metadata_view_over = 1;  // every member gets its role's view
  so.server_metadata_view_over = 1;
  SchedulerNode sched(so);
  REQUIRE(sched.Start().ok());
  std::vector<std::unique_ptr<ServerNode>> s;
  for (int i = 0; i < 2; ++i) {
    NodeOptions o = Opts(pb::SERVER, sched.port(), "s" + std::to_string(i));
    o.rank = i;
    s.push_back(std::make_unique<ServerNode>(o));
  }
  std::vector<std::unique_ptr<WorkerNode>> w;
  for (int i = 0; i < 3; ++i) {
    NodeOptions o = Opts(pb::WORKER, sched.port(), "w" + std::to_string(i));
    o.rank = i;
    w.push_back(std::make_unique<WorkerNode>(o));
  }
  for (auto& n : s) REQUIRE(n->Start().ok());
  for (auto& n : w) REQUIRE(n->Start().ok());
  for (auto& n : w) REQUIRE(n->WaitForReady(10s).ok());
  for (auto& n : s) REQUIRE(n->WaitForReady(10s).ok());
  for (int i = 0; i < 2; ++i) {
    CHECK(s[i]->rank() == i);  // found in servers_meta, which the view keeps whole
    CheckServerView(*s[i], {"w0", "w1", "w2"});
  }
  // Every worker's link is admitted by id: pushes from each reach both servers' ranges.
  const std::vector<uint64_t> keys = {1, 1ull << 63};
  for (auto& n : w) REQUIRE(n->Push(keys, std::vector<float>{1, 2}).get().ok());
  Result<PullResult> pulled = w[2]->Pull(keys).get();
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>{3, 6});

  pb::AdminRequest in;
  in.set_op("scale_in");
  in.add_node_ids("w0");
  REQUIRE(AdminOp(sched, in).ok());
  auto until = std::chrono::steady_clock::now() + 20s;
  auto servers_hold = [&](size_t n) {
    return s[0]->NodeIds(pb::WORKER).size() == n && s[1]->NodeIds(pb::WORKER).size() == n &&
           sched.cluster_state() == pb::CLUSTER_READY;
  };
  while (!servers_hold(2) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  REQUIRE(sched.cluster_state() == pb::CLUSTER_READY);
  for (auto& n : s) CheckServerView(*n, {"w1", "w2"});  // ranks compacted, order kept

  pb::AdminRequest out;
  out.set_op("scale_out");
  out.set_worker_num(3);
  out.set_server_num(2);
  std::future<Status> scaled = std::async(std::launch::async, [&] { return AdminOp(sched, out); });
  REQUIRE(WaitState(sched, pb::CLUSTER_SCALE_OUT, 15s));
  WorkerNode w3(Opts(pb::WORKER, sched.port(), "w3"));
  REQUIRE(w3.Start().ok());
  CHECK(scaled.get().ok());  // every server answered SCALE_OUT_DONE on the view's counts
  CHECK(WaitState(sched, pb::CLUSTER_READY, 15s));
  REQUIRE(w3.WaitForReady(10s).ok());
  until = std::chrono::steady_clock::now() + 10s;
  while (!servers_hold(3) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  for (auto& n : s) CheckServerView(*n, {"w1", "w2", "w3"});
  REQUIRE(w3.Push(keys, std::vector<float>{10, 20}).get().ok());  // the new worker is admitted
  pulled = w3.Pull(keys).get();
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>{13, 26});
  w3.Stop();
  for (auto& n : w) n->Stop();
  for (auto& n : s) n->Stop();
  sched.Stop();
}

TEST_CASE("a scale-out whose new server never comes rolls back to the old membership", "[node][net][scale]") {
  SchedulerOptions so = Sched(1, 1);
  so.scale_timeout = 500ms;
  SchedulerNode sched(so);
  REQUIRE(sched.Start().ok());
  ServerNode server(Opts(pb::SERVER, sched.port(), "s0"));
  REQUIRE(server.Start().ok());
  WorkerNode worker(Opts(pb::WORKER, sched.port(), "w0"));
  std::promise<std::string> rollback;
  Node::Callbacks cb;
  cb.on_cluster_event = [&](const pb::ClusterEventMessage& ev) {
    if (ev.kind() == pb::ClusterEventMessage::ROLLBACK) rollback.set_value(ev.message());
  };
  worker.SetCallbacks(cb);
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(10s).ok());
  REQUIRE(worker.Push({1, 2}, {1, 1}).get().ok());

  pb::AdminRequest req;
  req.set_op("scale_out");
  req.set_worker_num(1);
  req.set_server_num(2);
  REQUIRE(AdminOp(sched, req).ok());
  auto fut = rollback.get_future();
  REQUIRE(fut.wait_for(10s) == std::future_status::ready);
  CHECK_THAT(fut.get(), Catch::Contains("timed out"));
  REQUIRE(WaitState(sched, pb::CLUSTER_READY, 5s));
  // The job serves as before: the held push goes through under the old membership.
  REQUIRE(worker.Push({1, 2}, {1, 1}).get().ok());
  Result<PullResult> r = worker.Pull({1, 2}).get();
  REQUIRE(r.ok());
  CHECK((r->values == std::vector<float>{2, 2}));
  worker.Stop();
  server.Stop();
  sched.Stop();
}

// Asks the 1-server job for a second server (none comes: the scale holds traffic until its
// scale_timeout) and waits until the worker has seen SCALE_OUT, so its calls are held.
void ScaleOutToTwoServers(SchedulerNode& sched, WorkerNode& worker) {
  pb::AdminRequest req;
  req.set_op("scale_out");
  req.set_worker_num(1);
  req.set_server_num(2);
  REQUIRE(AdminOp(sched, req).ok());
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (worker.cluster_state() != pb::CLUSTER_SCALE_OUT && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE(worker.cluster_state() == pb::CLUSTER_SCALE_OUT);
}

TEST_CASE("by default a scale that times out is rolled back before the calls it holds reach their deadline",
          "[node][scale]") {
  CHECK(SchedulerOptions{}.scale_timeout < NodeOptions{}.request_timeout);
  CHECK(core::ClusterConfig{}.scale_timeout == SchedulerOptions{}.scale_timeout);
}

TEST_CASE("a push or pull held while the cluster scales fails kTimeout at its request deadline - not at the scale's end",
          "[node][net][scale]") {
  SchedulerOptions so = Sched(1, 1);
  so.scale_timeout = 30s;  // the new server never comes: the scale holds traffic for 30 s
  SchedulerNode sched(so);
  REQUIRE(sched.Start().ok());
  ServerNode server(Opts(pb::SERVER, sched.port(), "s0"));
  REQUIRE(server.Start().ok());
  NodeOptions wo = Opts(pb::WORKER, sched.port(), "w0");
  wo.request_timeout = 1s;
  WorkerNode worker(wo);
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(10s).ok());
  REQUIRE(worker.Push({1, 2}, {1, 1}).get().ok());
  ScaleOutToTwoServers(sched, worker);
  std::future<Status> push = worker.Push({1, 2}, {1, 1});
  std::future<Result<PullResult>> pull = worker.Pull({1, 2});
  REQUIRE(push.wait_for(10s) == std::future_status::ready);
  REQUIRE(pull.wait_for(10s) == std::future_status::ready);
  Status pushed = push.get();
  CHECK(pushed.code() == Code::kTimeout);
  CHECK_THAT(pushed.message(), Catch::Contains("held past its deadline"));
  CHECK(pull.get().status().code() == Code::kTimeout);
  CHECK(sched.cluster_state() == pb::CLUSTER_SCALE_OUT);  // still scaling: the deadline ended them
  worker.Stop();
  server.Stop();
  sched.Stop();
}

TEST_CASE("a worker stopped while the cluster scales fails its held pushes and pulls kCancelled - and any call after Stop",
          "[node][net][scale]") {
  // The worker on a loop of its own (stopped with it) or on a shared one (runs on).
  const bool shared = GENERATE(false, true);
  CAPTURE(shared);
  comm::EventLoop loop("shared");
  REQUIRE(loop.Start().ok());
  SchedulerOptions so = Sched(1, 1);
  so.scale_timeout = 30s;  // the new server never comes: the scale holds traffic until Stop
  SchedulerNode sched(so);
  REQUIRE(sched.Start().ok());
  ServerNode server(Opts(pb::SERVER, sched.port(), "s0"));
  REQUIRE(server.Start().ok());
  WorkerNode worker(Opts(pb::WORKER, sched.port(), "w0"), shared ? &loop : nullptr);
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(10s).ok());
  REQUIRE(worker.Push({1, 2}, {1, 1}).get().ok());
  ScaleOutToTwoServers(sched, worker);
  std::future<Status> push = worker.Push({1, 2}, {1, 1});
  std::future<Result<PullResult>> pull = worker.Pull({1, 2});
  CHECK(push.wait_for(200ms) == std::future_status::timeout);  // held while the cluster scales
  worker.Stop();
  REQUIRE(push.wait_for(5s) == std::future_status::ready);
  REQUIRE(pull.wait_for(5s) == std::future_status::ready);
  CHECK(push.get().code() == Code::kCancelled);
  CHECK(pull.get().status().code() == Code::kCancelled);
  // After Stop: answered at once, not dropped with the loop's queue.
  std::future<Status> late = worker.Push({1, 2}, {1, 1});
  REQUIRE(late.wait_for(5s) == std::future_status::ready);
  CHECK(late.get().code() == Code::kCancelled);
  std::future<Result<PullResult>> late_pull = worker.Pull({1});
  REQUIRE(late_pull.wait_for(5s) == std::future_status::ready);
  CHECK(late_pull.get().status().code() == Code::kCancelled);
  std::future<Result<BufferPtr>> late_send = worker.Send(0, 1, Buffer::Allocate(0));
  REQUIRE(late_send.wait_for(5s) == std::future_status::ready);
  CHECK(late_send.get().status().code() == Code::kCancelled);
  CHECK(worker.KvSet("k", "v").code() == Code::kCancelled);
  server.Stop();
  sched.Stop();
  loop.Stop().IgnoreError();
}

TEST_CASE("a server copying the keys it gives up does not hold the view lock - its loop serves a pull meanwhile",
          "[node][net][scale]") {
  SchedulerNode sched(Sched(1, 1));
  REQUIRE(sched.Start().ok());
  NodeOptions o0 = Opts(pb::SERVER, sched.port(), "s0");
  o0.rank = 0;
  ServerNode s0(o0);
  REQUIRE(s0.Start().ok());
  WorkerNode w0(Opts(pb::WORKER, sched.port(), "w0"));
  REQUIRE(w0.Start().ok());
  REQUIRE(w0.WaitForReady(10s).ok());
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 64; ++k) keys.push_back(k);
  REQUIRE(w0.Push(keys, std::vector<float>(keys.size() * 4, 1.0f)).get().ok());
  // `held` stays on s0 under 2 servers; `moving` goes to s1. They differ in the top bit of
  // their position, so they are in different stripes of the store.
  uint64_t held = 0, moving = 0;
  while (core::ServerForKey(held, 2) != 0) ++held;
  while (core::ServerForKey(moving, 2) != 1) ++moving;
  // A push straight into the store whose update rule waits on the test: it holds `held`'s
  // stripe, so the copy of the keys s0 gives up stops there until the test lets go.
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, released = false;
  s0.store().SetUpdater([&](uint64_t key, float* stored, const float* incoming, size_t n) {
    if (key == held) {
      std::unique_lock<std::mutex> lock(mu);
      entered = true;
      cv.notify_all();
      cv.wait(lock, [&] { return released; });
    }
    for (size_t i = 0; i < n; ++i) stored[i] += incoming[i];
  });
  auto release = [&] {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    cv.notify_all();
  };
  std::thread holder([&] {
    const uint32_t len = 4;
    const float zeros[4] = {0, 0, 0, 0};
    s0.store().Push(&held, &len, zeros, 1).IgnoreError();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, 10s, [&] { return entered; }));
  }
  pb::AdminRequest out;
  out.set_op("scale_out");
  out.set_worker_num(1);
  out.set_server_num(2);
  Status scaled = AdminOp(sched, out);
  NodeOptions o1 = Opts(pb::SERVER, sched.port(), "s1");
  o1.rank = 1;
  ServerNode s1(o1);
  bool refused_under_new_view = false;
  bool scale_still_open = false;
  if (scaled.ok() && s1.Start().ok()) {
    // A small pull runs on s0's loop thread and takes the view lock. Once s0 switched its
    // view it refuses `moving` as owned by rank 1 of 2, while its copy is still stopped
    // at `held`: the scale cannot have ended. A copy under the view lock would keep the
    // pull waiting until the copy was done.
    pscore::testing::RawLink peer(s0.listen_port(), "raw-peer");
    peer.HelloAsWorker("w0");
    pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::WORKER, -1);
    meta.set_handler(kPullHandler);
    for (auto deadline = std::chrono::steady_clock::now() + 30s;
         !refused_under_new_view && std::chrono::steady_clock::now() < deadline;) {
      std::future<Result<comm::Frame>> pull = peer.CallAsync(meta, core::EncodeKvPairs(&moving, 1, nullptr, nullptr, 0), 60s);
      if (pull.wait_for(5s) != std::future_status::ready) break;  // the loop is stuck on the lock
      Result<comm::Frame> r = pull.get();
      refused_under_new_view = r.status().code() == Code::kAborted && r.status().message().find("of 2") != std::string::npos;
      scale_still_open = sched.cluster_state() == pb::CLUSTER_SCALE_OUT;
      if (!refused_under_new_view) std::this_thread::sleep_for(10ms);
    }
  }
  release();
  holder.join();
  REQUIRE(scaled.ok());
  CHECK(refused_under_new_view);
  CHECK(scale_still_open);
  // The copy goes on once let go: the scale-out ends and no value was lost.
  REQUIRE(WaitState(sched, pb::CLUSTER_READY, 30s));
  Result<PullResult> all = w0.Pull(keys).get();
  REQUIRE(all.ok());
  CHECK(all->values == std::vector<float>(keys.size() * 4, 1.0f));
  w0.Stop();
  s1.Stop();
  s0.Stop();
  sched.Stop();
}

}  // namespace pscore::node
