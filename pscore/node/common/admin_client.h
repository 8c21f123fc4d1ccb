// AdminClient: an operator's blocking link to the scheduler (pscore-admin and tests).
// Owns an EventLoop thread and a Messenger on it; every public call blocks the caller
// (never call it on that loop) until the scheduler answers or the deadline passes.
// Failures to reach the scheduler (connect failed, link lost, no answer in time) come back
// as Code::kUnavailable with a message starting "scheduler unreachable"; any other error
// is the scheduler's own answer (a refused operation).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/core/clock.h"
#include "pscore/core/status.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::node {

struct AdminClientOptions {
  std::string scheduler_host = "127.0.0.1";
  int scheduler_port = 0;
  // Deadline of the connection attempt and of each request.
  Duration timeout = std::chrono::seconds(10);
  uint64_t max_message_bytes = 256ull << 20;
  std::string cluster_token;  // the job's token, when it has one
  // TLS to the scheduler (comm::TlsContext::Load); the certificate names the operator
  // (docs/security.md). Null: plaintext.
  std::shared_ptr<comm::TlsContext> tls;
};

class AdminClient {
 public:
  explicit AdminClient(AdminClientOptions options);
  ~AdminClient();  // Closes the link and joins the loop thread.
  AdminClient(const AdminClient&) = delete;
  AdminClient& operator=(const AdminClient&) = delete;

  // Connects (retrying until the timeout). Must succeed before any other call.
  Status Connect();

  // One admin operation (see SchedulerNode::Admin): status, nodes, scale_out, scale_in,
  // new_instance, enable, disable, stop, barriers.
  Result<pb::AdminResponse> Admin(const pb::AdminRequest& request);
  Result<pb::AdminResponse> Admin(const std::string& op);

  // Polls "status" every `period` until the cluster is READY (and no scale operation is
  // running) or `timeout` passes (kTimeout carrying the last state seen).
  Result<pb::AdminResponse> WaitForReady(Duration timeout,
                                         Duration period = std::chrono::milliseconds(100));

  // Polls "status" every `period` until no scale operation is running: the answer whose
  // state is neither SCALE_OUT nor SCALE_IN (READY when it completed or rolled back to a
  // healthy job; NODE_TIMEOUT or another state when it rolled back into one), kAborted at
  // EXIT, or kTimeout after `timeout`.
  Result<pb::AdminResponse> WaitForScaleEnd(Duration timeout,
                                            Duration period = std::chrono::milliseconds(100));

  // Coordination key-value store of the scheduler.
  Status KvSet(const std::string& key, const std::string& value, bool overwrite = true);
  // Blocks until the key exists or `timeout` passes (kTimeout from the scheduler).
  Result<std::string> KvGet(const std::string& key, Duration timeout);
  Result<std::string> KvTryGet(const std::string& key);
  Result<std::vector<std::pair<std::string, std::string>>> KvList(const std::string& dir);
  Status KvDelete(const std::string& key);

  // Every kept barrier round, sorted by id then generation.
  Result<std::vector<pb::BarrierInfo>> Barriers();

 private:
  // Sends one request and waits for its answer's payload, parsed into *out.
  Status Call(pb::NodeCommand cmd, const google::protobuf::MessageLite& request, Duration timeout,
              google::protobuf::MessageLite* out);
  std::string Target() const;

  AdminClientOptions options_;
  comm::EventLoop loop_;
  std::unique_ptr<comm::Messenger> messenger_;
  comm::ConnId conn_ = comm::kNoConn;  // loop thread after Connect
  bool loop_started_ = false;
};

}  // namespace pscore::node
