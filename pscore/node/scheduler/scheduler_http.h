// SchedulerHttp: the scheduler's HTTP surface (docs/http.md) on the scheduler's loop:
// the rank table and its chunked stream, cluster state, nodes, the admin operations and
// Prometheus /metrics. Every answer but the stream and /metrics is
// {"code":<pscore code, 0 = ok>,"message":..,"data":..}. Owned next to the SchedulerNode
// and RankTableHub (both must outlive it); Start/Stop from any thread but the loop's.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "pscore/comm/alive.h"
#include "pscore/comm/http_server.h"
#include "pscore/node/common/admin_ops.h"
#include "pscore/node/scheduler/ranktable_hub.h"
#include "pscore/node/scheduler/scheduler_node.h"

namespace pscore::node {

class MetricsText;

class SchedulerHttp {
 public:
  SchedulerHttp(SchedulerNode* sched, RankTableHub* hub, comm::HttpServerOptions options = {});
  ~SchedulerHttp();
  SchedulerHttp(const SchedulerHttp&) = delete;
  SchedulerHttp& operator=(const SchedulerHttp&) = delete;

  // Binds host:port (0: a free port) and serves. Returns the bound port.
  Result<int> Start(const std::string& host, int port);
  void Stop();  // Idempotent.
  int port() const { return port_; }

 private:
  bool Authorized(const comm::HttpRequest& req) const;
  void OnRequest(comm::HttpConnId id, comm::HttpRequest&& req);
  void ServeRankTable(comm::HttpConnId id, const comm::HttpRequest& req);
  void ServeStream(comm::HttpConnId id, const comm::HttpRequest& req);
  void ServeRegister(comm::HttpConnId id, const comm::HttpRequest& req);
  void Unauthorized(comm::HttpConnId id);
  void ServeAdmin(comm::HttpConnId id, const AdminOpInfo& info, const comm::HttpRequest& req);
  // /metrics (scheduler_metrics.cc).
  void ServeMetrics(comm::HttpConnId id);
  void AppendConnectionMetrics(MetricsText* m) const;
  void AppendRankTableMetrics(MetricsText* m) const;
  void AppendScaleMetrics(MetricsText* m) const;
  void Reply(comm::HttpConnId id, const Status& st, nlohmann::json data);
  void CountScale(AdminOp op, const Status& st);

  SchedulerNode* sched_;
  RankTableHub* hub_;
  comm::HttpServerOptions options_;
  std::unique_ptr<comm::HttpServer> server_;
  int port_ = 0;
  bool stopped_ = false;
  // Loop-thread counters for /metrics.
  std::map<int, uint64_t> responses_;                         // by HTTP status
  std::map<std::pair<AdminOp, bool>, uint64_t> scale_ops_;  // (op, accepted)
  uint64_t scales_done_ = 0;         // scale operations that ended done
  uint64_t scales_rolled_back_ = 0;  // and rolled back
  size_t http_subscribers_ = 0;
  comm::AliveToken alive_;
};

// HTTP status for a pscore Code (kOk 200, kNotFound 404, kFailedPrecondition 409, ...).
int HttpStatusOf(Code code);

}  // namespace pscore::node
