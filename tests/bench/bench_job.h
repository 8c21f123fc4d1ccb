// The options of a node of an in-process job that moves gigabytes per call (scale_bench,
// sparse_bench): 200 ms heartbeats, 10-minute requests, messages up to 2 GiB.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "pscore/node/common/options.h"

namespace pscore::bench {

inline constexpr size_t kJobMaxMessageBytes = 2ull << 30;

inline node::NodeOptions JobNodeOptions(int scheduler_port, const std::string& id) {
  node::NodeOptions o;
  o.scheduler_port = scheduler_port;
  o.node_id = id;
  o.heartbeat_interval = std::chrono::milliseconds(200);
  o.request_timeout = std::chrono::minutes(10);
  o.max_message_bytes = kJobMaxMessageBytes;
  return o;
}

}  // namespace pscore::bench
