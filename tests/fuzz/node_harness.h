// Shared by server_dispatch_fuzz and worker_dispatch_fuzz: runs one fuzz input against a
// fresh, unstarted worker or server on a shared loop. The node is first put in a READY
// cluster of one worker and one server (metadata and a state change pushed as the
// scheduler would), and a server hears HELLO from the worker on each peer connection the
// input uses. Then every record of the input is handed over (NodeProbe, node/node_probe.h):
// records flagged "from the scheduler" as pushes on the scheduler link, the others as
// requests from a peer connection. Addresses in injected metadata are rewritten to
// 127.0.0.1:1 (nothing listens there), so a fuzz input never makes the node dial a real
// host; a dial fails at once with "connection refused".
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "pscore/comm/event_loop.h"
#include "pscore/node/common/node.h"
#include "pscore/node/common/wire.h"
#include "fuzz/dispatch_input.h"
#include "node/node_probe.h"

namespace pscore::fuzz {

inline comm::EventLoop* SharedLoop() {
  static comm::EventLoop* loop = [] {
    auto* l = new comm::EventLoop("fuzz-loop");  // lives until exit
    if (!l->Start().ok()) __builtin_trap();
    return l;
  }();
  return loop;
}

inline node::NodeOptions FuzzNodeOptions(pb::NodeRole role) {
  node::NodeOptions o;
  o.role = role;
  o.node_id = role == pb::SERVER ? "server-fuzz" : "worker-fuzz";
  o.handler_threads = 0;  // handlers inline on the loop thread: one input, one outcome
  o.request_timeout = std::chrono::milliseconds(200);
  return o;
}

inline void NeuterAddresses(google::protobuf::RepeatedPtrField<pb::ServersMeta>* list) {
  for (auto& s : *list) {
    s.set_ip("127.0.0.1");
    s.set_port(1);
  }
}

inline comm::Frame SchedulerPush(pb::NodeCommand cmd, const google::protobuf::MessageLite& msg) {
  comm::Frame f;
  f.meta = node::MakeMeta(cmd, pb::SCHEDULER, 0);
  f.meta.set_oneway(true);
  f.payload = node::ToBuffer(msg);
  return f;
}

// The metadata of a READY cluster of 1 worker + 1 server in which `role` has rank 0.
inline pb::SendMetadataMessage BaselineMetadata(pb::NodeRole role) {
  pb::SendMetadataMessage md;
  md.set_worker_num(1);
  md.set_server_num(1);
  md.set_cluster_state(pb::CLUSTER_READY);
  md.set_rank_id(0);
  md.set_epoch(1);
  pb::ServersMeta* s = md.add_servers_meta();
  s->set_rank_id(0);
  s->set_role(pb::SERVER);
  s->set_node_id("server-fuzz");
  s->set_is_alive(true);
  pb::ServersMeta* w = md.add_workers_meta();
  w->set_rank_id(0);
  w->set_role(pb::WORKER);
  w->set_node_id("worker-fuzz");
  w->set_is_alive(true);
  NeuterAddresses(md.mutable_servers_meta());
  NeuterAddresses(md.mutable_workers_meta());
  (void)role;
  return md;
}

// A server serves data only to members that said HELLO: the worker of the baseline
// metadata says it on every peer connection of the input.
inline void HelloFromWorker(node::Node* n, const std::vector<Record>& records) {
  std::set<comm::ConnId> peers;
  for (const Record& r : records) {
    if (!r.from_scheduler()) peers.insert(r.conn());
  }
  for (comm::ConnId conn : peers) {
    pb::HelloMessage hello;
    hello.set_node_id("worker-fuzz");
    hello.set_role(pb::WORKER);
    hello.set_rank_id(0);
    comm::Frame f;
    f.meta = node::MakeMeta(pb::HELLO, pb::WORKER, 0);
    f.meta.set_oneway(true);
    f.payload = node::ToBuffer(hello);
    node::NodeProbe::FromPeer(*n, conn, std::move(f));
  }
}

inline void RunNodeInput(node::Node* n, std::vector<Record>* records) {
  constexpr comm::ConnId kSchedulerConn = 100;  // not a real connection: answers are dropped
  node::NodeProbe::FromScheduler(*n, kSchedulerConn, SchedulerPush(pb::SEND_METADATA, BaselineMetadata(n->role())));
  pb::ClusterEventMessage ready;
  ready.set_kind(pb::ClusterEventMessage::STATE_CHANGED);
  ready.set_cluster_state(pb::CLUSTER_READY);
  ready.set_epoch(1);
  node::NodeProbe::FromScheduler(*n, kSchedulerConn, SchedulerPush(pb::CLUSTER_EVENT, ready));
  if (n->role() == pb::SERVER) HelloFromWorker(n, *records);
  for (Record& r : *records) {
    if (r.from_scheduler() && r.frame.meta.cmd() == pb::SEND_METADATA && r.frame.payload) {
      pb::SendMetadataMessage md;
      if (md.ParseFromArray(r.frame.payload->data(), static_cast<int>(r.frame.payload->size()))) {
        NeuterAddresses(md.mutable_servers_meta());
        NeuterAddresses(md.mutable_workers_meta());
        r.frame.payload = node::ToBuffer(md);
      }
    }
    if (r.from_scheduler()) {
      node::NodeProbe::FromScheduler(*n, kSchedulerConn, std::move(r.frame));
    } else {
      node::NodeProbe::FromPeer(*n, r.conn(), std::move(r.frame));
    }
  }
}

}  // namespace pscore::fuzz
