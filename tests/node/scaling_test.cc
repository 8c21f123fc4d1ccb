// In-process scaling: scale-out and scale-in while a worker pushes, with no update lost.
#include <atomic>
#include <map>
#include <thread>

#include "core/key_range.h"
#include "core/kv_codec.h"
#include "multiproc/process.h"
#include "node/server_journal.h"
#include "node/scheduler_node.h"
#include "node/server_node.h"
#include "node/worker_node.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

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

Status AdminOp(SchedulerNode& s, pb::AdminRequest req) {
  std::promise<Status> p;
  s.loop()->Post([&] { s.Admin(req, [&](Status st, pb::AdminResponse) { p.set_value(st); }); });
  return p.get_future().get();
}

bool WaitState(SchedulerNode& s, pb::ClusterState want, Duration timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (s.cluster_state() == want) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// Pushes +1 to every key in rounds until stopped; counts acknowledged rounds.
struct Pusher {
  WorkerNode* worker;
  std::vector<uint64_t> keys;
  std::atomic<bool> stop{false};
  std::atomic<int> acked{0};
  std::atomic<int> failed{0};
  std::thread thread;
  void Start() {
    thread = std::thread([this] {
      std::vector<float> ones(keys.size() * 4, 1.0f);
      while (!stop) {
        Status st = worker->Push(keys, ones).get();
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

void CheckSums(WorkerNode& w, const std::vector<uint64_t>& keys, int acked) {
  Result<PullResult> r = w.Pull(keys).get();
  REQUIRE(r.ok());
  REQUIRE(r->values.size() == keys.size() * 4);
  for (float v : r->values) REQUIRE(v == static_cast<float>(acked));
}

}  // namespace

TEST_CASE("scale-out 2->4 servers while pushing loses no update and keeps old ranks", "[node][net][scale]") {
  SchedulerNode sched(Sched(1, 2));
  REQUIRE(sched.Start().ok());
  std::vector<std::unique_ptr<ServerNode>> servers;
  for (int i = 0; i < 2; ++i) {
    servers.push_back(std::make_unique<ServerNode>(Opts(pb::SERVER, sched.port(), "s" + std::to_string(i))));
    REQUIRE(servers.back()->Start().ok());
  }
  WorkerNode worker(Opts(pb::WORKER, sched.port(), "w0"));
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(10s).ok());
  std::map<std::string, int> old_ranks;
  for (auto& s : servers) old_ranks[s->node_id()] = s->rank();

  Pusher pusher;
  pusher.worker = &worker;
  for (uint64_t k = 0; k < 64; ++k) pusher.keys.push_back(k);
  pusher.Start();
  std::this_thread::sleep_for(100ms);

  pb::AdminRequest req;
  req.set_op("scale_out");
  req.set_worker_num(1);
  req.set_server_num(4);
  REQUIRE(AdminOp(sched, req).ok());
  for (int i = 2; i < 4; ++i) {
    servers.push_back(std::make_unique<ServerNode>(Opts(pb::SERVER, sched.port(), "s" + std::to_string(i))));
    REQUIRE(servers.back()->Start().ok());
  }
  REQUIRE(WaitState(sched, pb::CLUSTER_READY, 15s));
  std::this_thread::sleep_for(200ms);
  pusher.Stop();
  CHECK(pusher.failed == 0);
  REQUIRE(pusher.acked > 0);
  CHECK(worker.server_count() == 4);
  for (int i = 0; i < 2; ++i) CHECK(servers[i]->rank() == old_ranks[servers[i]->node_id()]);
  CheckSums(worker, pusher.keys, pusher.acked);
  // Every key lives on exactly one server: its owner under 4 servers.
  for (auto& s : servers) {
    for (uint64_t k : pusher.keys) {
      std::vector<uint32_t> lens;
      std::vector<float> vals;
      bool has = s->store().Pull(&k, 1, &lens, &vals).ok();
      CHECK(has == (core::ServerForKey(k, 4) == s->rank()));
    }
  }
  worker.Stop();
  for (auto& s : servers) s->Stop();
  sched.Stop();
}

TEST_CASE("a new server whose data dir holds an earlier membership's entries keeps only what the owners send",
          "[node][net][scale][journal]") {
  // The journal of an earlier life: every pushed key with a stale value, and keys no
  // server of this job has.
  testing::TempDir dir;
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

  SchedulerNode sched(Sched(1, 2));
  REQUIRE(sched.Start().ok());
  std::vector<std::unique_ptr<ServerNode>> servers;
  for (int i = 0; i < 2; ++i) {
    servers.push_back(std::make_unique<ServerNode>(Opts(pb::SERVER, sched.port(), "s" + std::to_string(i))));
    REQUIRE(servers.back()->Start().ok());
  }
  WorkerNode worker(Opts(pb::WORKER, sched.port(), "w0"));
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(10s).ok());

  Pusher pusher;
  pusher.worker = &worker;
  for (uint64_t k = 0; k < 64; ++k) pusher.keys.push_back(k);
  pusher.Start();
  std::this_thread::sleep_for(100ms);

  pb::AdminRequest req;
  req.set_op("scale_out");
  req.set_worker_num(1);
  req.set_server_num(3);
  REQUIRE(AdminOp(sched, req).ok());
  NodeOptions o = Opts(pb::SERVER, sched.port(), "s2");
  o.data_dir = dir.path();
  servers.push_back(std::make_unique<ServerNode>(o));
  REQUIRE(servers.back()->Start().ok());
  REQUIRE(WaitState(sched, pb::CLUSTER_READY, 15s));
  std::this_thread::sleep_for(200ms);
  pusher.Stop();
  CHECK(pusher.failed == 0);
  REQUIRE(pusher.acked > 0);
  CheckSums(worker, pusher.keys, pusher.acked);
  for (auto& s : servers) {
    for (uint64_t k = 5000; k < 5016; ++k) {
      std::vector<uint32_t> lens;
      std::vector<float> vals;
      CHECK_FALSE(s->store().Pull(&k, 1, &lens, &vals).ok());
    }
  }
  worker.Stop();
  for (auto& s : servers) s->Stop();
  sched.Stop();
}

TEST_CASE("scale-in of server rank 0 of 3 while pushing loses no update and compacts ranks", "[node][net][scale]") {
  SchedulerNode sched(Sched(1, 3));
  REQUIRE(sched.Start().ok());
  std::vector<std::unique_ptr<ServerNode>> servers;
  for (int i = 0; i < 3; ++i) {
    NodeOptions o = Opts(pb::SERVER, sched.port(), "s" + std::to_string(i));
    o.rank = i;
    servers.push_back(std::make_unique<ServerNode>(o));
    REQUIRE(servers.back()->Start().ok());
  }
  WorkerNode worker(Opts(pb::WORKER, sched.port(), "w0"));
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(10s).ok());
  Pusher pusher;
  pusher.worker = &worker;
  for (uint64_t k = 0; k < 64; ++k) pusher.keys.push_back(k);
  pusher.Start();
  std::this_thread::sleep_for(100ms);

  pb::AdminRequest req;
  req.set_op("scale_in");
  req.add_node_ids("s0");
  REQUIRE(AdminOp(sched, req).ok());
  REQUIRE(servers[0]->WaitForTermination(15s).ok());  // The leaving server is told to exit, cleanly.
  REQUIRE(WaitState(sched, pb::CLUSTER_READY, 15s));
  std::this_thread::sleep_for(200ms);
  pusher.Stop();
  CHECK(pusher.failed == 0);
  CHECK(worker.server_count() == 2);
  CHECK(servers[1]->rank() == 0);
  CHECK(servers[2]->rank() == 1);
  CheckSums(worker, pusher.keys, pusher.acked);
  worker.Stop();
  for (auto& s : servers) s->Stop();
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

}  // namespace pscore::node
