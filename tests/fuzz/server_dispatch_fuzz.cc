// libFuzzer target: a server's dispatch. Each input is a sequence of decoded messages
// (tests/fuzz/dispatch_input.h) injected into a fresh ServerNode in a READY cluster
// (tests/fuzz/node_harness.h): SEND_DATA to the built-in push/pull/migrate handlers and
// to a user handler, COLLECTIVE_SEND_DATA, PING, unserved commands, and every push of the
// scheduler (metadata, cluster events, scale-out/in, user events, TERMINATE).
#include <cstddef>
#include <cstdint>

#include "pscore/node/server/server_node.h"
#include "fuzz/node_harness.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  FLAGS_minloglevel = 3;  // handlers log every refusal; keep the fuzzer's output readable
  pscore::fuzz::SharedLoop();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<pscore::fuzz::Record> records = pscore::fuzz::ParseRecords(data, size);
  if (records.empty()) return 0;
  pscore::node::ServerNode server(pscore::fuzz::FuzzNodeOptions(pscore::pb::SERVER), {},
                                  pscore::fuzz::SharedLoop());
  // user_cmd 1 echoes; user_cmd 2 never answers (the Responder answers when dropped).
  server.RegisterHandler(1, [](const pscore::node::DataRequest& req, pscore::node::Responder r) {
    r.Reply(req.payload);
  });
  server.RegisterHandler(2, [](const pscore::node::DataRequest&, pscore::node::Responder) {});
  pscore::fuzz::RunNodeInput(&server, &records);
  server.Stop();
  return 0;
}
