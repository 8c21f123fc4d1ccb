// libFuzzer target: the scheduler's command dispatch. Each input is a sequence of decoded
// messages (tests/fuzz/dispatch_input.h) handed to a fresh SchedulerNode's request handler
// through NodeProbe::ToScheduler, on four simulated connections, as the transport
// would hand them over: REGISTER, HEARTBEAT, FETCH_METADATA, FINISH, ADMIN, KV_REQUEST,
// BARRIER, SEND_EVENT, SCALE_*_DONE, REPORT_ERROR, PING and every unserved command.
// The scheduler is not started (no socket): answers to the simulated connections are
// dropped by the transport. One loop thread serves every input; a fresh scheduler per
// input keeps each input reproducible on its own.
#include <cstddef>
#include <cstdint>

#include <glog/logging.h>

#include "pscore/comm/event_loop.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "fuzz/dispatch_input.h"
#include "node/node_probe.h"

namespace {

pscore::comm::EventLoop* SharedLoop() {
  static pscore::comm::EventLoop* loop = [] {
    auto* l = new pscore::comm::EventLoop("fuzz-loop");  // lives until exit
    if (!l->Start().ok()) __builtin_trap();
    return l;
  }();
  return loop;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  FLAGS_minloglevel = 3;  // handlers log every refusal; keep the fuzzer's output readable
  SharedLoop();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<pscore::fuzz::Record> records = pscore::fuzz::ParseRecords(data, size);
  if (records.empty()) return 0;
  pscore::node::SchedulerOptions opts;
  opts.worker_num = 1;
  opts.server_num = 1;
  opts.job_id = "fuzz";
  pscore::node::SchedulerNode scheduler(opts, SharedLoop());
  for (auto& r : records) pscore::node::NodeProbe::ToScheduler(scheduler, r.conn(), std::move(r.frame));
  scheduler.Stop();
  return 0;
}
