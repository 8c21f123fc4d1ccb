// A replicated job in this process for the failover and replication tests: a scheduler,
// servers that add pushes (kSum) holding each range on `replicas` of them, and one worker,
// all started and READY. Include after the project headers (it pulls in Catch).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {

inline core::ParamStore::Options SumStore() {
  core::ParamStore::Options o;
  o.rule = core::UpdateRule::kSum;
  return o;
}

// The value `server` stores for `key`, or empty when it holds none.
inline std::vector<float> Stored(node::ServerNode& server, uint64_t key) {
  std::vector<uint32_t> lens;
  std::vector<float> values;
  if (!server.store().Pull(&key, 1, &lens, &values).ok()) return {};
  return values;
}

// Keys 0..n-1: consecutive keys spread over every range (pscore/core/key_range.h).
inline std::vector<uint64_t> Keys(size_t n) {
  std::vector<uint64_t> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = i;
  return keys;
}

struct ReplicatedJobOptions {
  using Factory = std::function<std::unique_ptr<node::ServerNode>(node::NodeOptions, int rank)>;
  int servers = 2;
  int replicas = 2;
  std::vector<pb::NodeRole> recoverable_roles = {pb::SERVER};
  Duration recovery_timeout = std::chrono::seconds(30);
  Duration request_timeout = node::NodeOptions().request_timeout;
  Factory factory;  // makes server `rank` from its options; null: a plain ServerNode
};

// 100 ms heartbeats, a 1.5 s heartbeat timeout, one handler thread per node.
class ReplicatedJob {
 public:
  ReplicatedJob(int servers, int replicas, ReplicatedJobOptions::Factory factory = nullptr)
      : ReplicatedJob(WithShape(servers, replicas, std::move(factory))) {}
  explicit ReplicatedJob(ReplicatedJobOptions options) : options_(std::move(options)) {
    using namespace std::chrono_literals;
    node::SchedulerOptions so;
    so.server_num = options_.servers;
    so.worker_num = 1;
    so.replicas = options_.replicas;
    so.heartbeat_interval = 100ms;
    so.heartbeat_timeout = 1500ms;
    so.recoverable_roles = options_.recoverable_roles;
    sched = std::make_unique<node::SchedulerNode>(so);
    REQUIRE(sched->Start().ok());
    for (int i = 0; i < options_.servers; ++i) {
      node::NodeOptions o = Opts("s" + std::to_string(i));
      o.rank = i;
      servers.push_back(options_.factory ? options_.factory(o, i) : std::make_unique<node::ServerNode>(o, SumStore()));
    }
    worker = std::make_unique<node::WorkerNode>(Opts("w0"));
    for (auto& s : servers) REQUIRE(s->Start().ok());
    REQUIRE(worker->Start().ok());
    REQUIRE(worker->WaitForReady(kReady).ok());
    for (auto& s : servers) REQUIRE(s->WaitForReady(kReady).ok());
  }
  ~ReplicatedJob() {
    worker->Stop();
    for (auto& s : servers) s->Stop();
    sched->Stop();
  }

  // The options of a node of this job named `id`.
  node::NodeOptions Opts(const std::string& id) const {
    using namespace std::chrono_literals;
    node::NodeOptions o;
    o.scheduler_port = sched->port();
    o.node_id = id;
    o.heartbeat_interval = 100ms;
    o.heartbeat_timeout = 1500ms;
    o.connect_timeout = 5s;
    o.request_timeout = options_.request_timeout;
    o.recovery_timeout = options_.recovery_timeout;
    o.handler_threads = 1;
    return o;
  }
  node::ServerNode& ByRank(int rank) {
    for (auto& s : servers) {
      if (s->rank() == rank) return *s;
    }
    FAIL("no server of rank " << rank);
    return *servers[0];
  }

  std::unique_ptr<node::SchedulerNode> sched;
  std::vector<std::unique_ptr<node::ServerNode>> servers;
  std::unique_ptr<node::WorkerNode> worker;

 private:
  static ReplicatedJobOptions WithShape(int servers, int replicas, ReplicatedJobOptions::Factory factory) {
    ReplicatedJobOptions o;
    o.servers = servers;
    o.replicas = replicas;
    o.factory = std::move(factory);
    return o;
  }

  static constexpr auto kReady = std::chrono::seconds(60);
  ReplicatedJobOptions options_;
};

}  // namespace pscore::testing
