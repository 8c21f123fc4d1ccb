#include <set>

#include "pscore/node/common/node.h"
#include "pscore/node/scheduler/scheduler_node.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;

SchedulerOptions SchedOpts(int workers, int servers) {
  SchedulerOptions o;
  o.worker_num = workers;
  o.server_num = servers;
  o.heartbeat_interval = 50ms;
  o.heartbeat_timeout = 500ms;
  return o;
}

NodeOptions Opts(pb::NodeRole role, int sched_port, std::string id) {
  NodeOptions o;
  o.role = role;
  o.scheduler_port = sched_port;
  o.node_id = std::move(id);
  o.heartbeat_interval = 50ms;
  o.connect_timeout = 5s;
  return o;
}

}  // namespace

TEST_CASE("1 scheduler + 2 workers + 2 servers reach READY with dense ranks and finish", "[node][net]") {
  SchedulerNode sched(SchedOpts(2, 2));
  REQUIRE(sched.Start().ok());
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(std::make_unique<Node>(Opts(pb::WORKER, sched.port(), "w" + std::to_string(i)), nullptr));
    nodes.push_back(std::make_unique<Node>(Opts(pb::SERVER, sched.port(), "s" + std::to_string(i)), nullptr));
  }
  for (auto& n : nodes) REQUIRE(n->Start().ok());
  for (auto& n : nodes) REQUIRE(n->WaitForReady(10s).ok());
  std::set<int> worker_ranks, server_ranks;
  for (auto& n : nodes) (n->role() == pb::WORKER ? worker_ranks : server_ranks).insert(n->rank());
  CHECK((worker_ranks == std::set<int>{0, 1}));
  CHECK((server_ranks == std::set<int>{0, 1}));
  CHECK(nodes[0]->metadata().servers_meta_size() == 2);

  std::vector<std::future<Status>> finishes;
  for (auto& n : nodes) {
    Node* p = n.get();
    finishes.push_back(std::async(std::launch::async, [p] { return p->Finish(10s); }));
  }
  for (auto& f : finishes) CHECK(f.get().ok());
  CHECK(sched.WaitForExit(5s).ok());
  for (auto& n : nodes) CHECK(n->WaitForTermination(5s).ok());
  for (auto& n : nodes) n->Stop();
  sched.Stop();
}

TEST_CASE("a stopped scheduler or node refuses Start with a clear error - not a hang or an abort", "[node][net]") {
  SchedulerNode sched(SchedOpts(1, 0));
  REQUIRE(sched.Start().ok());
  Node worker(Opts(pb::WORKER, sched.port(), "w0"), nullptr);
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(10s).ok());
  worker.Stop();
  Status again = worker.Start();
  CHECK(again.code() == Code::kFailedPrecondition);
  CHECK_THAT(again.message(), Catch::Contains("w0 was stopped"));
  // A blocking client call after Stop is answered, on the calling thread.
  CHECK(worker.KvSet("k", "v").code() == Code::kCancelled);
  sched.Stop();
  Status sched_again = sched.Start();
  CHECK(sched_again.code() == Code::kFailedPrecondition);
  CHECK_THAT(sched_again.message(), Catch::Contains("stopped"));
}

}  // namespace pscore::node
