#include "pscore/node/common/admin_client.h"

#include <algorithm>
#include <future>
#include <thread>

#include "pscore/comm/address.h"
#include "pscore/core/cluster_manager.h"
#include "pscore/node/common/admin_ops.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {
namespace {

// Extra wait for a posted call beyond its own deadline; guards only against a dead loop.
constexpr auto kMargin = std::chrono::seconds(5);
// A blocking KV Get's answer deadline on the link: the scheduler's own deadline plus this.
constexpr auto kGetSlack = std::chrono::seconds(2);

Status Unreachable(const std::string& target, const std::string& why) {
  return Status(Code::kUnavailable, "scheduler unreachable at " + target + ": " + why);
}

}  // namespace

AdminClient::AdminClient(AdminClientOptions options) : options_(std::move(options)), loop_("admin") {
  comm::TransportOptions t;
  t.limits.max_message_bytes = options_.max_message_bytes;
  t.max_incomplete_frame_bytes = std::max<uint64_t>(t.max_incomplete_frame_bytes, 2 * options_.max_message_bytes);
  t.auth_token = options_.cluster_token;
  t.tls = options_.tls;
  comm::Messenger::Handlers h;
  // The scheduler sends an admin client nothing but answers; ignore anything else.
  h.on_request = [](comm::ConnId, comm::Frame&&) {};
  messenger_ = std::make_unique<comm::Messenger>(&loop_, t, std::move(h));
}

AdminClient::~AdminClient() {
  if (loop_started_) loop_.Stop().IgnoreError();  // The stop hook shuts the messenger down.
  messenger_.reset();
}

std::string AdminClient::Target() const {
  return comm::JoinHostPort(options_.scheduler_host, options_.scheduler_port);
}

Status AdminClient::Connect() {
  if (options_.scheduler_port <= 0 || options_.scheduler_port > 65535) {
    return Status(Code::kInvalidArgument, "no scheduler port given (--scheduler_port or PSCORE_SCHEDULER_PORT)");
  }
  if (!loop_started_) {
    PSCORE_RETURN_IF_ERROR(loop_.Start());
    loop_started_ = true;
    loop_.Post([this] { loop_.AddStopHook([this] { messenger_->Shutdown(); }); });
  }
  auto promise = std::make_shared<std::promise<Status>>();
  std::future<Status> done = promise->get_future();
  comm::ConnectOptions co;
  co.timeout = options_.timeout;
  co.max_backoff = std::chrono::milliseconds(200);
  loop_.Post([this, co, promise] {
    messenger_->transport().Connect(options_.scheduler_host, options_.scheduler_port, co,
                                    [this, promise](Result<comm::ConnId> r) {
                                      if (r.ok()) conn_ = *r;
                                      promise->set_value(r.status());
                                    });
  });
  if (done.wait_for(options_.timeout + kMargin) != std::future_status::ready) {
    return Unreachable(Target(), "connect did not finish");
  }
  Status st = done.get();
  if (!st.ok()) return Unreachable(Target(), st.ToString());
  return Status::Ok();
}

Status AdminClient::Call(pb::NodeCommand cmd, const google::protobuf::MessageLite& request,
                         Duration timeout, google::protobuf::MessageLite* out) {
  CHECK(!loop_.InLoopThread()) << "blocking AdminClient call on its own loop";
  if (!loop_started_) return Status(Code::kFailedPrecondition, "AdminClient: Connect first");
  auto promise = std::make_shared<std::promise<Result<comm::Frame>>>();
  std::future<Result<comm::Frame>> done = promise->get_future();
  BufferPtr payload = ToBuffer(request);
  const auto started = std::chrono::steady_clock::now();
  loop_.Post([this, cmd, payload, timeout, promise, started] {
    if (conn_ == comm::kNoConn || !messenger_->transport().IsOpen(conn_)) {
      promise->set_value(Status(Code::kUnavailable, "the link is closed"));
      return;
    }
    messenger_->Call(conn_, MakeMeta(cmd, pb::ADMIN_CLIENT, -1), payload, timeout,
                     [this, promise, started, timeout](Result<comm::Frame> r) {
                       if (!r.ok()) {
                         // Tell the link's failures apart from the scheduler's answers.
                         bool lost = !messenger_->transport().IsOpen(conn_);
                         bool expired = r.status().code() == Code::kTimeout &&
                                        std::chrono::steady_clock::now() - started >= timeout;
                         if (lost || expired) {
                           promise->set_value(Status(Code::kUnavailable, r.status().ToString()));
                           return;
                         }
                       }
                       promise->set_value(std::move(r));
                     });
  });
  if (done.wait_for(timeout + kMargin) != std::future_status::ready) {
    return Unreachable(Target(), pb::NodeCommand_Name(cmd) + ": no answer");
  }
  Result<comm::Frame> r = done.get();
  if (!r.ok()) {
    if (r.status().code() == Code::kUnavailable) return Unreachable(Target(), r.status().message());
    return r.status();
  }
  return ParsePayload(*r, out);
}

Result<pb::AdminResponse> AdminClient::Admin(const pb::AdminRequest& request) {
  pb::AdminResponse resp;
  PSCORE_RETURN_IF_ERROR(Call(pb::ADMIN, request, options_.timeout, &resp));
  return resp;
}

Result<pb::AdminResponse> AdminClient::Admin(const std::string& op) {
  pb::AdminRequest req;
  req.set_op(op);
  return Admin(req);
}

Result<pb::AdminResponse> AdminClient::WaitForReady(Duration timeout, Duration period) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    Result<pb::AdminResponse> r = Admin(AdminOpName(AdminOp::kStatus));
    if (!r.ok()) return r.status();
    if (r->cluster_state() == pb::CLUSTER_READY) return r;
    if (r->cluster_state() == pb::CLUSTER_EXIT) {
      return Status(Code::kAborted, "the job is exiting");
    }
    if (std::chrono::steady_clock::now() + period > deadline) {
      return Status(Code::kTimeout, "cluster still in " + core::ClusterStateName(r->cluster_state()) +
                                        " after " + std::to_string(ToMillis(timeout)) + " ms");
    }
    std::this_thread::sleep_for(period);
  }
}

Result<pb::AdminResponse> AdminClient::WaitForScaleEnd(Duration timeout, Duration period) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    Result<pb::AdminResponse> r = Admin(AdminOpName(AdminOp::kStatus));
    if (!r.ok()) return r.status();
    const pb::ClusterState s = r->cluster_state();
    if (s == pb::CLUSTER_EXIT) return Status(Code::kAborted, "the job is exiting");
    if (s != pb::CLUSTER_SCALE_OUT && s != pb::CLUSTER_SCALE_IN) return r;
    if (std::chrono::steady_clock::now() + period > deadline) {
      return Status(Code::kTimeout, "cluster still in " + core::ClusterStateName(s) + " after " +
                                        std::to_string(ToMillis(timeout)) + " ms");
    }
    std::this_thread::sleep_for(period);
  }
}

Status AdminClient::KvSet(const std::string& key, const std::string& value, bool overwrite) {
  pb::KvRequest req;
  req.set_op(pb::KvRequest::SET);
  req.set_key(key);
  req.set_value(value);
  req.set_overwrite(overwrite);
  pb::KvResponse resp;
  return Call(pb::KV_REQUEST, req, options_.timeout, &resp);
}

Result<std::string> AdminClient::KvGet(const std::string& key, Duration timeout) {
  pb::KvRequest req;
  req.set_op(pb::KvRequest::GET);
  req.set_key(key);
  req.set_timeout_ms(ToMillis(timeout));
  pb::KvResponse resp;
  PSCORE_RETURN_IF_ERROR(Call(pb::KV_REQUEST, req, timeout + kGetSlack, &resp));
  return resp.value();
}

Result<std::string> AdminClient::KvTryGet(const std::string& key) {
  pb::KvRequest req;
  req.set_op(pb::KvRequest::TRY_GET);
  req.set_key(key);
  pb::KvResponse resp;
  PSCORE_RETURN_IF_ERROR(Call(pb::KV_REQUEST, req, options_.timeout, &resp));
  return resp.value();
}

Result<std::vector<std::pair<std::string, std::string>>> AdminClient::KvList(const std::string& dir) {
  pb::KvRequest req;
  req.set_op(pb::KvRequest::LIST);
  req.set_key(dir);
  pb::KvResponse resp;
  PSCORE_RETURN_IF_ERROR(Call(pb::KV_REQUEST, req, options_.timeout, &resp));
  std::vector<std::pair<std::string, std::string>> out;
  for (const pb::KvEntry& e : resp.entries()) out.emplace_back(e.key(), e.value());
  return out;
}

Status AdminClient::KvDelete(const std::string& key) {
  pb::KvRequest req;
  req.set_op(pb::KvRequest::DELETE);
  req.set_key(key);
  pb::KvResponse resp;
  return Call(pb::KV_REQUEST, req, options_.timeout, &resp);
}

Result<std::vector<pb::BarrierInfo>> AdminClient::Barriers() {
  Result<pb::AdminResponse> r = Admin(AdminOpName(AdminOp::kBarriers));
  if (!r.ok()) return r.status();
  return std::vector<pb::BarrierInfo>(r->barriers().begin(), r->barriers().end());
}

}  // namespace pscore::node
