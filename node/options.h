// Plain option structs for the roles. Filled by node/flags.cc from flags (or by an
// embedding program directly); no other code reads flags or the environment.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/clock.h"
#include "proto/comm.pb.h"

namespace pscore::node {

struct SchedulerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: pick a free port (read it back with SchedulerNode::port())
  int worker_num = 1;
  int server_num = 1;
  Duration heartbeat_interval = std::chrono::milliseconds(1000);
  Duration heartbeat_timeout = std::chrono::milliseconds(5000);
  Duration scale_timeout = std::chrono::seconds(60);
  uint64_t max_message_bytes = 256ull << 20;
  size_t max_kv_value_bytes = 16u << 20;
  std::string job_id = "default";
  std::string http_host = "127.0.0.1";
  int http_port = -1;  // -1: no HTTP endpoint; 0: a free port
  // Restart recovery: persist membership, state and KV here (empty: nothing persisted).
  std::string state_dir;
  bool state_reset_on_corrupt = false;  // a damaged state file: start fresh, not exit 1
  std::string cluster_token;  // empty: no authentication
  // Accepted connections: at most this many open (0: no cap); each must deliver one whole
  // frame within first_frame_timeout of being accepted or it is closed (0: no deadline).
  size_t max_connections = 10000;
  Duration first_frame_timeout = std::chrono::seconds(30);
};

struct NodeOptions {
  pb::NodeRole role = pb::WORKER;
  std::string node_id;  // empty: "<role>-<random>"
  std::string scheduler_host = "127.0.0.1";
  int scheduler_port = 0;
  std::string host = "127.0.0.1";  // address this node listens on and advertises
  int port = 0;                    // 0: a free port
  int rank = -1;                   // -1: any
  Duration heartbeat_interval = std::chrono::milliseconds(1000);
  Duration connect_timeout = std::chrono::seconds(30);
  Duration request_timeout = std::chrono::seconds(60);
  std::vector<pb::Device> devices;
  std::string host_name;
  uint64_t max_message_bytes = 256ull << 20;
  // Server handlers run on this many executor threads (0: on the loop thread).
  int handler_threads = 2;
  // Server: journal the built-in parameter store here (node/server_journal.h), so a
  // restart with the same directory (and node_id) gets the parameters back. One directory
  // per server. Empty: parameters live in memory only.
  std::string data_dir;
  std::string cluster_token;  // empty: no authentication
  // Accepted (peer) connections of a server: as SchedulerOptions.
  size_t max_connections = 10000;
  Duration first_frame_timeout = std::chrono::seconds(30);
};

}  // namespace pscore::node
