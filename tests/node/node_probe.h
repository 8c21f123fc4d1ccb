// NodeProbe: hands a frame to a node's dispatch as if it had arrived on a connection, for
// tests and fuzzers. It is a friend of Node and SchedulerNode. Call it from any thread but
// the node's loop thread: the frame is handled there, and the call returns once it has
// been. Answers to a connection that does not exist are dropped.
#pragma once

#include <utility>

#include "pscore/comm/event_loop.h"
#include "pscore/node/common/node.h"
#include "pscore/node/scheduler/scheduler_node.h"

namespace pscore::node {

class NodeProbe {
 public:
  // As a push from the scheduler on the node's scheduler link.
  static void FromScheduler(Node& node, comm::ConnId conn, comm::Frame&& frame) {
    node.loop()->RunAndWait([&] { node.HandleSchedulerPush(conn, std::move(frame)); });
  }
  // As a request from a peer on `conn` (a server serves data only once it said HELLO).
  static void FromPeer(Node& node, comm::ConnId conn, comm::Frame&& frame) {
    node.loop()->RunAndWait([&] { node.OnPeerRequest(conn, std::move(frame)); });
  }
  // As a request from a member, on the scheduler's side of `conn`.
  static void ToScheduler(SchedulerNode& scheduler, comm::ConnId conn, comm::Frame&& frame) {
    scheduler.loop()->RunAndWait([&] { scheduler.OnRequest(conn, std::move(frame)); });
  }
};

}  // namespace pscore::node
