// libFuzzer target: a worker's dispatch. Each input is a sequence of decoded messages
// (tests/fuzz/dispatch_input.h) injected into a fresh WorkerNode in a READY cluster
// (tests/fuzz/node_harness.h): every push of the scheduler (metadata, cluster events,
// scale-out/in, user events, TERMINATE, unexpected commands) and requests from peers,
// which a worker refuses.
#include <cstddef>
#include <cstdint>

#include "pscore/node/worker/worker_node.h"
#include "fuzz/node_harness.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  FLAGS_minloglevel = 3;  // handlers log every refusal; keep the fuzzer's output readable
  pscore::fuzz::SharedLoop();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<pscore::fuzz::Record> records = pscore::fuzz::ParseRecords(data, size);
  if (records.empty()) return 0;
  pscore::node::WorkerNode worker(pscore::fuzz::FuzzNodeOptions(pscore::pb::WORKER), pscore::fuzz::SharedLoop());
  pscore::node::Node::Callbacks cb;
  cb.on_scale_out = [](const pscore::pb::ScaleOutMessage&) {};
  cb.on_scale_in = [](const pscore::pb::ScaleInMessage&) {};
  cb.on_user_event = [](const std::string&, uint32_t, const std::string&) {};
  cb.on_cluster_event = [](const pscore::pb::ClusterEventMessage&) {};
  worker.SetCallbacks(cb);
  pscore::fuzz::RunNodeInput(&worker, &records);
  worker.Stop();
  return 0;
}
