// What the demo-job fault tests ask a job's scheduler (tests/multiproc/train_job.h): one
// admin answer over a fresh connection (the scheduler may have been restarted since the
// last one), and a wait for a cluster state. Every call has a deadline.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "pscore/node/common/admin_client.h"  // before Catch: its CHECK must win over glog's

namespace pscore::testing {

// The answer to `request` from the scheduler on `port`, or nullopt (no link, refused, or
// no answer within 3 s).
inline std::optional<pb::AdminResponse> AdminAsk(int port, const pb::AdminRequest& request) {
  node::AdminClientOptions ao;
  ao.scheduler_port = port;
  ao.timeout = std::chrono::seconds(3);
  node::AdminClient admin(ao);
  if (!admin.Connect().ok()) return std::nullopt;
  Result<pb::AdminResponse> r = admin.Admin(request);
  if (!r.ok()) return std::nullopt;
  return *r;
}

inline std::optional<pb::AdminResponse> AdminAsk(int port, const std::string& op) {
  pb::AdminRequest request;
  request.set_op(op);
  return AdminAsk(port, request);
}

// Polls "status" until the cluster is in `state` (false at the deadline).
inline bool WaitState(int port, pb::ClusterState state, std::chrono::steady_clock::time_point deadline) {
  while (std::chrono::steady_clock::now() < deadline) {
    std::optional<pb::AdminResponse> r = AdminAsk(port, "status");
    if (r && r->cluster_state() == state) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace pscore::testing
