// MemberHttp: a worker's or server's optional HTTP endpoint (--http_port), serving GET
// /metrics in Prometheus text format on the node's loop: its view of the cluster, its
// transport counters and its role's counters. Owned next to the Node, which must outlive
// it; Start/Stop from any thread but the loop's.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "pscore/comm/http_server.h"
#include "pscore/node/common/node.h"

namespace pscore::node {

class MemberHttp {
 public:
  explicit MemberHttp(Node* node, comm::HttpServerOptions options = {});
  ~MemberHttp();
  MemberHttp(const MemberHttp&) = delete;
  MemberHttp& operator=(const MemberHttp&) = delete;

  // Binds host:port (0: a free port) and serves. Returns the bound port.
  Result<int> Start(const std::string& host, int port);
  void Stop();  // Idempotent.

 private:
  void OnRequest(comm::HttpConnId id, comm::HttpRequest&& req);
  std::string Metrics();

  Node* node_;
  comm::HttpServerOptions options_;
  std::unique_ptr<comm::HttpServer> server_;
  bool stopped_ = false;
  std::map<int, uint64_t> responses_;  // loop thread: by HTTP status
};

}  // namespace pscore::node
