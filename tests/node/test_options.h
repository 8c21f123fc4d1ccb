// Option and request builders that several node tests share. Include before Catch.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "pscore/node/common/options.h"
#include "pscore/node/common/wire.h"

namespace pscore::testing {

// A worker as the tests start one: 100 ms heartbeats, 10 s connect and request deadlines,
// handlers on the loop thread.
inline node::NodeOptions TestWorkerOptions(int sched_port, const std::string& id) {
  using namespace std::chrono_literals;
  node::NodeOptions o;
  o.role = pb::WORKER;
  o.scheduler_port = sched_port;
  o.node_id = id;
  o.heartbeat_interval = 100ms;
  o.connect_timeout = 10s;
  o.request_timeout = 10s;
  o.handler_threads = 0;
  return o;
}

// A KV_REQUEST payload that may overwrite; `timeout_ms` is a GET's wait.
inline BufferPtr KvPayload(pb::KvRequest::Op op, const std::string& key, const std::string& value = "",
                           int64_t timeout_ms = 0) {
  pb::KvRequest req;
  req.set_op(op);
  req.set_key(key);
  req.set_value(value);
  req.set_overwrite(true);
  req.set_timeout_ms(timeout_ms);
  return node::ToBuffer(req);
}

}  // namespace pscore::testing
