// In-process membership tests: many nodes on one shared loop reach READY with dense
// ranks and topology ids; a slow handler does not cost its server the heartbeat; a
// reported error reaches every other node within one heartbeat interval.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/node/common/handoff.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;

SchedulerOptions SchedOpts(int workers, int servers, Duration interval, Duration timeout) {
  SchedulerOptions o;
  o.worker_num = workers;
  o.server_num = servers;
  o.heartbeat_interval = interval;
  o.heartbeat_timeout = timeout;
  return o;
}

NodeOptions MemberOpts(pb::NodeRole role, int sched_port, const std::string& id, Duration interval) {
  NodeOptions o;
  o.role = role;
  o.scheduler_port = sched_port;
  o.node_id = id;
  o.heartbeat_interval = interval;
  o.connect_timeout = 10s;
  return o;
}

// Two local devices, listed out of order so the scheduler must sort them.
std::vector<pb::Device> TwoDevices() {
  std::vector<pb::Device> devs(2);
  devs[0].set_local_id(1);
  devs[0].set_device_ip("10.0.0.2");
  devs[1].set_local_id(0);
  devs[1].set_device_ip("10.0.0.1");
  return devs;
}

}  // namespace

TEST_CASE("1 scheduler + 64 workers + 16 servers on one shared loop reach READY with dense ranks and topology",
          "[node][net]") {
  constexpr int kWorkers = 64, kServers = 16;
  comm::EventLoop loop("shared");
  REQUIRE(loop.Start().ok());
  {
    SchedulerNode sched(SchedOpts(kWorkers, kServers, 100ms, 5s), &loop);
    REQUIRE(sched.Start().ok());
    std::vector<std::unique_ptr<Node>> nodes;
    for (int i = 0; i < kServers; ++i) {
      NodeOptions o = MemberOpts(pb::SERVER, sched.port(), "s" + std::to_string(i), 100ms);
      o.devices = TwoDevices();
      nodes.push_back(std::make_unique<ServerNode>(o, core::ParamStore::Options(), &loop));
    }
    for (int i = 0; i < kWorkers; ++i) {
      NodeOptions o = MemberOpts(pb::WORKER, sched.port(), "w" + std::to_string(i), 100ms);
      o.devices = TwoDevices();
      nodes.push_back(std::make_unique<WorkerNode>(o, &loop));
    }
    for (auto& n : nodes) REQUIRE(n->Start().ok());
    for (auto& n : nodes) REQUIRE(n->WaitForReady(20s).ok());
    CHECK(sched.cluster_state() == pb::CLUSTER_READY);

    std::set<int> worker_ranks, server_ranks;
    for (auto& n : nodes) {
      CHECK(n->rank() >= 0);
      bool fresh = (n->role() == pb::WORKER ? worker_ranks : server_ranks).insert(n->rank()).second;
      CHECK(fresh);  // unique per role
    }
    REQUIRE(worker_ranks.size() == kWorkers);
    REQUIRE(server_ranks.size() == kServers);
    CHECK(*worker_ranks.rbegin() == kWorkers - 1);  // dense: 0..W-1
    CHECK(*server_ranks.rbegin() == kServers - 1);

    // Every node holds the same metadata (same epoch), and it names itself at its rank.
    const uint64_t epoch = nodes[0]->epoch();
    for (auto& n : nodes) CHECK(n->epoch() == epoch);
    pb::SendMetadataMessage md = nodes[0]->metadata();
    REQUIRE(md.servers_meta_size() == kServers);
    REQUIRE(md.workers_meta_size() == kWorkers);
    CHECK(md.cluster_state() == pb::CLUSTER_READY);

    // Global device ids: dense, ordered by role (servers first), rank, local ordinal.
    std::vector<std::tuple<int, int, int, int>> devs;  // (role order, rank, local, global)
    auto collect = [&devs](const auto& list, int role_order) {
      for (const pb::ServersMeta& m : list) {
        for (const pb::Device& d : m.devices()) devs.emplace_back(role_order, m.rank_id(), d.local_id(), d.global_id());
      }
    };
    collect(md.servers_meta(), 0);
    collect(md.workers_meta(), 1);
    REQUIRE(devs.size() == 2u * (kWorkers + kServers));
    std::sort(devs.begin(), devs.end());
    for (size_t i = 0; i < devs.size(); ++i) CHECK(std::get<3>(devs[i]) == static_cast<int>(i));

    for (auto& n : nodes) n->Stop();
    sched.Stop();
  }
  CHECK(loop.Stop().ok());  // every handle of every node was closed
}

TEST_CASE("a scheduler asked for more nodes per role than a job may have refuses to start", "[node]") {
  SchedulerOptions so;
  so.worker_num = 1;
  so.server_num = core::kMaxRoleTotal + 1;
  SchedulerNode sched(so);
  Status st = sched.Start();
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("must be in [0, 65536], got 1 and 65537"));
  so.server_num = -1;
  SchedulerNode negative(so);
  CHECK(negative.Start().code() == Code::kInvalidArgument);
}

TEST_CASE("a server whose handler sleeps 3x the heartbeat timeout is not declared dead", "[node][net]") {
  // A timeout of ten beats: a loaded sanitizer build can stall a loop for a few hundred ms, and a
  // member other than the slow server timed out then would fail the case for the wrong reason.
  const Duration interval = 100ms, timeout = 1s;
  SchedulerNode sched(SchedOpts(1, 1, interval, timeout));
  std::atomic<int> timeouts{0};
  sched.AddEventListener([&timeouts](const core::Event& e) {
    if (e.kind == core::Event::Kind::kNodeTimedOut) ++timeouts;
  });
  REQUIRE(sched.Start().ok());
  ServerNode server(MemberOpts(pb::SERVER, sched.port(), "slow-server", interval));
  server.RegisterHandler(1, [timeout](const DataRequest& req, Responder r) {
    std::this_thread::sleep_for(3 * timeout);
    r.Reply(req.payload);
  });
  WorkerNode worker(MemberOpts(pb::WORKER, sched.port(), "w0", interval));
  REQUIRE(server.Start().ok());
  REQUIRE(worker.Start().ok());
  REQUIRE(server.WaitForReady(10s).ok());
  REQUIRE(worker.WaitForReady(10s).ok());

  auto reply = worker.Send(0, 1, Buffer::FromString("still here"));
  REQUIRE(reply.wait_for(20s) == std::future_status::ready);
  Result<BufferPtr> r = reply.get();
  REQUIRE(r.ok());
  CHECK((*r)->view() == "still here");
  // One more timeout period, in case a missed beat is only noticed afterwards.
  std::this_thread::sleep_for(timeout + interval);
  CHECK(timeouts.load() == 0);
  CHECK(sched.cluster_state() == pb::CLUSTER_READY);
  worker.Stop();
  server.Stop();
  sched.Stop();
}

TEST_CASE("a reported error reaches every other node within one heartbeat interval", "[node][net]") {
  // A long interval: the error must be pushed, not carried by the next heartbeat.
  const Duration interval = 2s;
  SchedulerNode sched(SchedOpts(2, 1, interval, 20s));
  REQUIRE(sched.Start().ok());
  struct Member {
    std::unique_ptr<Node> node;
    Handoff<pb::ClusterEventMessage> error;
  };
  std::vector<std::unique_ptr<Member>> members;
  auto add = [&](pb::NodeRole role, const std::string& id) {
    auto m = std::make_unique<Member>();
    NodeOptions o = MemberOpts(role, sched.port(), id, interval);
    if (role == pb::SERVER) {
      m->node = std::make_unique<ServerNode>(o);
    } else {
      m->node = std::make_unique<WorkerNode>(o);
    }
    Member* raw = m.get();
    Node::Callbacks cb;
    cb.on_cluster_event = [raw](const pb::ClusterEventMessage& ev) {
      if (ev.kind() == pb::ClusterEventMessage::NODE_ERROR) raw->error.Put(ev);
    };
    m->node->SetCallbacks(cb);
    members.push_back(std::move(m));
  };
  add(pb::WORKER, "w0");
  add(pb::WORKER, "w1");
  add(pb::SERVER, "s0");
  for (auto& m : members) REQUIRE(m->node->Start().ok());
  for (auto& m : members) REQUIRE(m->node->WaitForReady(10s).ok());

  const auto sent = std::chrono::steady_clock::now();
  REQUIRE(members[0]->node->ReportError(7, "disk full").ok());
  for (size_t i = 1; i < members.size(); ++i) {
    const Duration left = interval - (std::chrono::steady_clock::now() - sent);
    INFO("node " << members[i]->node->node_id());
    std::optional<pb::ClusterEventMessage> ev = members[i]->error.TakeFor(std::max<Duration>(left, Duration::zero()));
    REQUIRE(ev.has_value());
    CHECK(ev->node_id() == "w0");
    CHECK(ev->role() == pb::WORKER);
    CHECK(ev->rank_id() == members[0]->node->rank());
    CHECK(ev->error_code() == 7);
    CHECK(ev->message() == "disk full");
  }
  for (auto& m : members) m->node->Stop();
  sched.Stop();
}

}  // namespace pscore::node
