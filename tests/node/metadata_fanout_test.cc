// How the membership reaches the members: one immutable buffer per membership change,
// shared by every member's frame (no per-member copy), counted once in the scheduler's
// total of queued output; each member finds its own rank in it by node id.
#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"
#include "node/node_probe.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;

NodeOptions MemberOpts(pb::NodeRole role, int sched_port, const std::string& id) {
  NodeOptions o;
  o.role = role;
  o.scheduler_port = sched_port;
  o.node_id = id;
  o.heartbeat_interval = 100ms;
  o.connect_timeout = 20s;
  return o;
}

// What the scheduler's transport held right after the fan-out of the READY membership,
// in the same loop turn (nothing flushed yet).
struct FanOut {
  bool seen = false;
  uint64_t builds_before = 0, builds_after = 0;
  size_t shared_payloads = 0;
  uint64_t total_queued = 0;     // the transport's total
  uint64_t members_queued = 0;   // the members' links, each counted on its own
  uint64_t metadata_bytes = 0;
};

}  // namespace

TEST_CASE("a membership change sends all members one shared buffer, counted once in the queued total, and each learns its rank",
          "[node][net][metadata]") {
  constexpr int kWorkers = 40, kServers = 8;
  comm::EventLoop loop("fanout");
  REQUIRE(loop.Start().ok());
  {
    SchedulerOptions so;
    so.worker_num = kWorkers;
    so.server_num = kServers;
    so.heartbeat_interval = 100ms;
    so.heartbeat_timeout = 20s;  // a slow sanitizer build must not time anyone out
    SchedulerNode sched(so, &loop);
    FanOut fan;  // loop thread until the nodes are READY (then read by the test thread)
    std::mutex mu;
    sched.AddEventListener([&](const core::Event& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (fan.seen) return;
      // Listeners run before the scheduler acts on the event: the metadata event comes
      // first (its fan-out follows), then READY, drained in the same loop turn.
      if (e.kind == core::Event::Kind::kMetadataChanged) fan.builds_before = sched.metadata_builds();
      if (e.kind != core::Event::Kind::kStateChanged || e.state != pb::CLUSTER_READY) return;
      fan.seen = true;
      const comm::Transport& t = sched.messenger().transport();
      fan.builds_after = sched.metadata_builds();
      fan.shared_payloads = t.shared_payloads_queued();
      fan.total_queued = t.queued_write_bytes();
      fan.members_queued = sched.QueuedOutputBytes();
      fan.metadata_bytes = sched.cluster().BuildMetadata().ByteSizeLong();
    });
    REQUIRE(sched.Start().ok());
    std::vector<std::unique_ptr<Node>> nodes;
    for (int i = 0; i < kServers; ++i) {
      NodeOptions o = MemberOpts(pb::SERVER, sched.port(), "server-" + std::to_string(i));
      nodes.push_back(std::make_unique<ServerNode>(o, core::ParamStore::Options(), &loop));
    }
    for (int i = 0; i < kWorkers; ++i) {
      nodes.push_back(std::make_unique<WorkerNode>(MemberOpts(pb::WORKER, sched.port(), "worker-" + std::to_string(i)), &loop));
    }
    for (auto& n : nodes) REQUIRE(n->Start().ok());
    for (auto& n : nodes) REQUIRE(n->WaitForReady(60s).ok());

    FanOut f;
    {
      std::lock_guard<std::mutex> lock(mu);
      f = fan;
    }
    REQUIRE(f.seen);
    // One build for the change, whatever the number of members.
    CHECK(f.builds_after - f.builds_before == 1);
    // Larger than what is copied into a write batch, so the buffer itself is referenced.
    REQUIRE(f.metadata_bytes > 512);  // comm::kInlinePayloadBytes (comm-internal)
    const uint64_t members = kWorkers + kServers;
    // Every member's link holds the whole metadata...
    CHECK(f.members_queued >= members * f.metadata_bytes);
    // ...and it is one buffer: the total counts it once (plus headers and small frames).
    CHECK(f.shared_payloads == 1);
    CHECK(f.total_queued >= f.metadata_bytes);
    CHECK(f.total_queued < 2 * f.metadata_bytes + members * 1024);

    // Each member found its own rank in the shared bytes, by node id.
    std::vector<std::pair<std::string, int>> want;
    loop.RunAndWait([&] {
      for (auto& n : nodes) {
        const core::NodeRecord* rec = sched.cluster().Find(n->node_id());
        want.emplace_back(n->node_id(), rec == nullptr ? -2 : rec->rank);
      }
    });
    for (size_t i = 0; i < nodes.size(); ++i) {
      INFO(want[i].first);
      CHECK(nodes[i]->rank() == want[i].second);
      CHECK(nodes[i]->metadata().rank_id() == want[i].second);
    }
    for (auto& n : nodes) n->Stop();
    sched.Stop();
  }
  CHECK(loop.Stop().ok());
}

TEST_CASE("a large membership reaches workers as their view (servers and totals) and servers whole - ranks, pushes and pulls work",
          "[node][net][metadata]") {
  constexpr int kWorkers = 30, kServers = 3;
  comm::EventLoop loop("view");
  REQUIRE(loop.Start().ok());
  {
    SchedulerOptions so;
    so.worker_num = kWorkers;
    so.server_num = kServers;
    so.heartbeat_interval = 100ms;
    so.heartbeat_timeout = 20s;
    so.worker_metadata_view_over = 512;  // 33 entries encode to more: workers get their view
    SchedulerNode sched(so, &loop);
    std::mutex mu;
    bool seen = false;
    size_t shared_payloads = 0;
    uint64_t full_bytes = 0, members_queued = 0;
    sched.AddEventListener([&](const core::Event& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (seen || e.kind != core::Event::Kind::kStateChanged || e.state != pb::CLUSTER_READY) return;
      seen = true;
      shared_payloads = sched.messenger().transport().shared_payloads_queued();
      members_queued = sched.QueuedOutputBytes();
      full_bytes = sched.cluster().BuildMetadata().ByteSizeLong();
    });
    REQUIRE(sched.Start().ok());
    std::vector<std::unique_ptr<Node>> nodes;
    for (int i = 0; i < kServers; ++i) {
      NodeOptions o = MemberOpts(pb::SERVER, sched.port(), "server-" + std::to_string(i));
      nodes.push_back(std::make_unique<ServerNode>(o, core::ParamStore::Options(), &loop));
    }
    for (int i = 0; i < kWorkers; ++i) {
      nodes.push_back(std::make_unique<WorkerNode>(MemberOpts(pb::WORKER, sched.port(), "worker-" + std::to_string(i)), &loop));
    }
    for (auto& n : nodes) REQUIRE(n->Start().ok());
    for (auto& n : nodes) REQUIRE(n->WaitForReady(60s).ok());
    {
      std::lock_guard<std::mutex> lock(mu);
      REQUIRE(seen);
      REQUIRE(full_bytes > 512);
      // The whole membership, held once for the servers; the view of 3 servers is under the
      // 512 bytes a write batch copies (comm::kInlinePayloadBytes), so it is not held.
      CHECK(shared_payloads == 1);
      // The workers' frames hold far less than the whole membership each.
      CHECK(members_queued < kServers * (full_bytes + 1024) + kWorkers * (full_bytes / 2));
    }
    std::vector<int> want;
    loop.RunAndWait([&] {
      for (auto& n : nodes) {
        const core::NodeRecord* rec = sched.cluster().Find(n->node_id());
        want.push_back(rec == nullptr ? -2 : rec->rank);
      }
    });
    for (size_t i = 0; i < nodes.size(); ++i) {
      INFO(nodes[i]->node_id());
      const pb::SendMetadataMessage md = nodes[i]->metadata();
      CHECK(nodes[i]->rank() == want[i]);
      CHECK(md.rank_id() == want[i]);
      CHECK(md.servers_meta_size() == kServers);
      CHECK(md.worker_num() == kWorkers);
      if (i < static_cast<size_t>(kServers)) {
        CHECK(md.workers_meta_size() == kWorkers);
        CHECK(md.omitted_workers() == 0);
      } else {
        CHECK(md.workers_meta_size() == 0);
        CHECK(md.omitted_workers() == kWorkers);
      }
    }
    // The data plane runs on the view: servers know every worker, workers every server.
    auto* w0 = static_cast<WorkerNode*>(nodes[kServers].get());
    auto* w1 = static_cast<WorkerNode*>(nodes[kServers + 1].get());
    const std::vector<uint64_t> keys = {1, 1ull << 40, ~0ull - 7};
    REQUIRE(w0->Push(keys, std::vector<float>{1, 2, 3}).get().ok());
    REQUIRE(w1->Push(keys, std::vector<float>{10, 20, 30}).get().ok());
    Result<PullResult> pulled = w1->Pull(keys).get();
    REQUIRE(pulled.ok());
    CHECK(pulled->values == std::vector<float>{11, 22, 33});
    for (auto& n : nodes) n->Stop();
    sched.Stop();
  }
  CHECK(loop.Stop().ok());
}

TEST_CASE("a member finds its rank in metadata that names no recipient, and handles coalesced notices one by one in order",
          "[node][metadata]") {
  comm::EventLoop loop("member");
  REQUIRE(loop.Start().ok());
  {
    WorkerNode w(MemberOpts(pb::WORKER, 1, "worker-b"), &loop);
    std::vector<std::pair<int, std::string>> heard;  // loop thread; read after NodeProbe returns
    bool nested = false;
    Node::Callbacks cb;
    cb.on_cluster_event = [&](const pb::ClusterEventMessage& ev) {
      heard.emplace_back(ev.kind(), ev.node_id());
      nested = nested || ev.more_size() != 0;
    };
    w.SetCallbacks(cb);
    auto push = [&w](pb::NodeCommand cmd, const google::protobuf::MessageLite& msg) {
      comm::Frame f;
      f.meta = MakeMeta(cmd, pb::SCHEDULER, 0);
      f.meta.set_oneway(true);
      f.payload = ToBuffer(msg);
      NodeProbe::FromScheduler(w, /*conn=*/100, std::move(f));
    };
    // The same bytes every member gets: rank_id of the message itself is not set.
    pb::SendMetadataMessage md;
    md.set_worker_num(3);
    md.set_server_num(1);
    md.set_cluster_state(pb::CLUSTER_READY);
    md.set_epoch(1);
    auto add = [](google::protobuf::RepeatedPtrField<pb::ServersMeta>* list, const std::string& id, int rank,
                  pb::NodeRole role) {
      pb::ServersMeta* m = list->Add();
      m->set_node_id(id);
      m->set_rank_id(rank);
      m->set_role(role);
      m->set_ip("127.0.0.1");
      m->set_port(1);  // never dialled here
      m->set_is_alive(true);
    };
    add(md.mutable_servers_meta(), "worker-b", 0, pb::SERVER);  // same id, other role: not ours
    add(md.mutable_workers_meta(), "worker-c", 0, pb::WORKER);
    add(md.mutable_workers_meta(), "worker-a", 1, pb::WORKER);
    add(md.mutable_workers_meta(), "worker-b", 2, pb::WORKER);
    push(pb::SEND_METADATA, md);
    CHECK(w.rank() == 2);
    CHECK(w.metadata().rank_id() == 2);
    CHECK(w.epoch() == 1);
    // A worker's view of a large membership has no worker entries: the rank stays as told.
    pb::SendMetadataMessage view = md;
    view.clear_workers_meta();
    view.set_omitted_workers(3);
    view.set_epoch(2);
    push(pb::SEND_METADATA, view);
    CHECK(w.epoch() == 2);
    CHECK(w.rank() == 2);
    CHECK(w.metadata().rank_id() == 2);
    CHECK(w.metadata().omitted_workers() == 3);
    CHECK(w.NodeIds(pb::SERVER) == std::vector<std::string>{"worker-b"});
    // An impossible count is refused, not trusted.
    view.set_omitted_workers(-1);
    view.set_epoch(3);
    push(pb::SEND_METADATA, view);
    CHECK(w.epoch() == 2);
    // The whole membership again: the rank is read from it.
    md.set_epoch(4);
    push(pb::SEND_METADATA, md);
    CHECK(w.epoch() == 4);
    CHECK(w.metadata().omitted_workers() == 0);
    CHECK(w.rank() == 2);

    // Three per-node notices coalesced into one frame: the first, the others in `more`.
    pb::ClusterEventMessage ev;
    ev.set_kind(pb::ClusterEventMessage::NODE_TIMED_OUT);
    ev.set_node_id("worker-a");
    ev.set_role(pb::WORKER);
    ev.set_rank_id(1);
    pb::ClusterEventMessage* second = ev.add_more();
    second->set_kind(pb::ClusterEventMessage::NODE_TIMED_OUT);
    second->set_node_id("worker-c");
    second->set_role(pb::WORKER);
    pb::ClusterEventMessage* third = ev.add_more();
    third->set_kind(pb::ClusterEventMessage::NODE_RECOVERED);
    third->set_node_id("worker-a");
    third->set_role(pb::WORKER);
    push(pb::CLUSTER_EVENT, ev);
    REQUIRE(heard.size() == 3);
    CHECK(heard[0] == std::make_pair(static_cast<int>(pb::ClusterEventMessage::NODE_TIMED_OUT), std::string("worker-a")));
    CHECK(heard[1] == std::make_pair(static_cast<int>(pb::ClusterEventMessage::NODE_TIMED_OUT), std::string("worker-c")));
    CHECK(heard[2] == std::make_pair(static_cast<int>(pb::ClusterEventMessage::NODE_RECOVERED), std::string("worker-a")));
    CHECK_FALSE(nested);  // each handed on as a notice of its own
    w.Stop();
  }
  CHECK(loop.Stop().ok());
}

TEST_CASE("nodes that time out in one scheduler pass reach a member as one CLUSTER_EVENT frame", "[node][net][metadata]") {
  comm::EventLoop loop("timeouts");
  REQUIRE(loop.Start().ok());
  {
    SchedulerOptions so;
    so.worker_num = 4;
    so.server_num = 0;
    so.heartbeat_interval = 100ms;
    so.heartbeat_timeout = 3s;
    SchedulerNode sched(so, &loop);
    REQUIRE(sched.Start().ok());
    WorkerNode observer(MemberOpts(pb::WORKER, sched.port(), "observer"), &loop);
    std::mutex mu;
    std::vector<std::string> timed_out;
    Node::Callbacks cb;
    cb.on_cluster_event = [&](const pb::ClusterEventMessage& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (ev.kind() == pb::ClusterEventMessage::NODE_TIMED_OUT) timed_out.push_back(ev.node_id());
    };
    observer.SetCallbacks(cb);
    REQUIRE(observer.Start().ok());
    auto registered = [&] {
      int n = 0;
      loop.RunAndWait([&] { n = sched.cluster().registered(pb::WORKER); });
      return n;
    };
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (registered() < 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
    REQUIRE(registered() == 1);
    // Three members that register in one loop turn and never beat: their heartbeat ages
    // cross the timeout together, so one scheduler tick times all three out. Their links
    // are not real connections (anything sent to them is dropped).
    loop.RunAndWait([&] {
      for (int i = 0; i < 3; ++i) {
        pb::RegisterMessage reg;
        reg.set_node_id("ghost-" + std::to_string(i));
        reg.set_role(pb::WORKER);
        reg.set_ip("127.0.0.1");
        reg.set_port(1);
        reg.set_incarnation(1);
        reg.set_requested_rank(-1);
        reg.set_protocol_version(kProtocolVersion);
        comm::Frame f;
        f.meta = MakeMeta(pb::REGISTER, pb::WORKER, -1);
        f.meta.set_request_id(1);
        f.payload = ToBuffer(reg);
        NodeProbe::ToScheduler(sched, /*conn=*/900001 + i, std::move(f));
      }
    });
    REQUIRE(observer.WaitForReady(60s).ok());
    auto heard = [&] {
      std::lock_guard<std::mutex> lock(mu);
      return timed_out.size();
    };
    while (heard() < 3 && std::chrono::steady_clock::now() < deadline + 60s) std::this_thread::sleep_for(10ms);
    REQUIRE(heard() == 3);
    {
      std::lock_guard<std::mutex> lock(mu);
      std::sort(timed_out.begin(), timed_out.end());
      CHECK(timed_out == std::vector<std::string>{"ghost-0", "ghost-1", "ghost-2"});
    }
    uint64_t event_frames = 0;
    loop.RunAndWait([&] {
      for (const comm::CommandStats& c : sched.messenger().transport().StatsByCommand()) {
        if (c.cmd == pb::CLUSTER_EVENT) event_frames = c.frames_out;
      }
    });
    // To the observer, the only link: READY, NODE_TIMEOUT and one frame for the three
    // notices (five frames if each notice went alone).
    CHECK(event_frames == 3);
    observer.Stop();
    sched.Stop();
  }
  CHECK(loop.Stop().ok());
}

}  // namespace pscore::node
