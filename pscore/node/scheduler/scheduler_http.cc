#include "pscore/node/scheduler/scheduler_http.h"

#include <openssl/crypto.h>

#include <future>

#include <google/protobuf/util/json_util.h>

#include "pscore/node/common/wire.h"

namespace pscore::node {

namespace {

using json = nlohmann::json;

constexpr const char* kJson = "application/json";
// The admin operation POST /v1/<op> names, or null.
const AdminOpInfo* HttpAdminOp(const std::string& op) {
  const AdminOpInfo* info = FindAdminOp(op);
  return info != nullptr && info->http_post ? info : nullptr;
}


json ToJson(const google::protobuf::Message& msg) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  o.always_print_enums_as_ints = false;
  std::string text;
  if (!google::protobuf::util::MessageToJsonString(msg, &text, o).ok()) return json::object();
  return json::parse(text, nullptr, false);
}

// An admin answer as JSON; the cluster state by its printed name (core::ClusterStateName).
json AdminJson(const pb::AdminResponse& resp) {
  json j = ToJson(resp);
  if (j.is_object()) j["cluster_state"] = core::ClusterStateName(resp.cluster_state());
  return j;
}

// Reads the admin body: {"worker_num":int,"server_num":int,"node_ids":[string]}, each field
// only where the operation takes it (AdminOpInfo); all optional.
Status ParseAdminBody(const std::string& body, const AdminOpInfo& info, pb::AdminRequest* req) {
  const std::string op = info.wire;
  req->set_op(op);
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) return Status::Ok();
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return Status(Code::kInvalidArgument, "request body is not valid JSON");
  if (!j.is_object()) return Status(Code::kInvalidArgument, "request body must be a JSON object");
  std::set<std::string> allowed;
  if (info.takes_totals) allowed = {"worker_num", "server_num"};
  if (info.takes_ids) allowed.insert("node_ids");
  for (auto& [key, value] : j.items()) {
    const bool known = key == "worker_num" || key == "server_num" || key == "node_ids";
    if (!known) return Status(Code::kInvalidArgument, "unknown field '" + key + "'");
    if (allowed.count(key) == 0) {
      std::string takes;
      for (const std::string& f : allowed) takes += (takes.empty() ? "" : ", ") + f;
      return Status(Code::kInvalidArgument, "field '" + key + "' does not apply to " + op + " (it takes " +
                                                (takes.empty() ? "no field" : takes) + ")");
    }
    if (key == "worker_num" || key == "server_num") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > core::kMaxRoleTotal) {
        return Status(Code::kInvalidArgument,
                      key + " must be an integer in [0, " + std::to_string(core::kMaxRoleTotal) + "]");
      }
      int v = value.get<int>();
      key == "worker_num" ? req->set_worker_num(v) : req->set_server_num(v);
    } else if (key == "node_ids") {
      if (!value.is_array()) return Status(Code::kInvalidArgument, "node_ids must be an array of strings");
      for (auto& id : value) {
        if (!id.is_string()) return Status(Code::kInvalidArgument, "node_ids must be an array of strings");
        req->add_node_ids(id.get<std::string>());
      }
    }
  }
  return Status::Ok();
}

// Reads the registration body: {"job_id":string,"role":string}, job_id required.
Status ParseRegisterBody(const std::string& body, std::string* job_id, std::string* role) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return Status(Code::kInvalidArgument, "request body is not valid JSON");
  if (!j.is_object()) return Status(Code::kInvalidArgument, "request body must be a JSON object");
  for (auto& [key, value] : j.items()) {
    if (key != "job_id" && key != "role") {
      return Status(Code::kInvalidArgument, "unknown field '" + key + "' (it takes job_id, role)");
    }
    if (!value.is_string()) return Status(Code::kInvalidArgument, key + " must be a string");
    *(key == "job_id" ? job_id : role) = value.get<std::string>();
  }
  if (job_id->empty()) return Status(Code::kInvalidArgument, "job_id is required");
  return Status::Ok();
}

// A registration id from a query parameter: decimal digits, at most 19 of them.
Status ParseRegistration(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 19 || text.find_first_not_of("0123456789") != std::string::npos) {
    return Status(Code::kInvalidArgument, "registration must be a decimal number below 10^19");
  }
  *out = std::stoull(text);
  return Status::Ok();
}

}  // namespace

int HttpStatusOf(Code code) {
  switch (code) {
    case Code::kOk: return 200;
    case Code::kInvalidArgument:
    case Code::kProtocol: return 400;
    case Code::kPermissionDenied: return 403;
    case Code::kNotFound: return 404;
    case Code::kAlreadyExists:
    case Code::kFailedPrecondition:
    case Code::kAborted: return 409;
    case Code::kResourceExhausted: return 429;
    case Code::kUnimplemented: return 501;
    case Code::kUnavailable:
    case Code::kCancelled: return 503;
    case Code::kTimeout: return 504;
    default: return 500;
  }
}

SchedulerHttp::SchedulerHttp(SchedulerNode* sched, RankTableHub* hub, comm::HttpServerOptions options)
    : sched_(sched), hub_(hub), options_(options) {
  if (options_.tls == nullptr) options_.tls = sched_->options().tls;  // HTTPS when the scheduler uses TLS
}

SchedulerHttp::~SchedulerHttp() { Stop(); }

Result<int> SchedulerHttp::Start(const std::string& host, int port) {
  if (server_) return Status(Code::kFailedPrecondition, "http already started");
  std::promise<Result<int>> done;
  bool queued = sched_->loop()->Run([&] {
    server_ = std::make_unique<comm::HttpServer>(
        sched_->loop(), options_, [this](comm::HttpConnId id, comm::HttpRequest&& req) { OnRequest(id, std::move(req)); });
    comm::AliveToken::Watch alive = alive_.watch();
    sched_->AddEventListener([this, alive](const core::Event& e) {
      if (!alive) return;
      if (e.kind == core::Event::Kind::kScaleDone) ++scales_done_;
      if (e.kind == core::Event::Kind::kRollback) ++scales_rolled_back_;
    });
    done.set_value(server_->Listen(host, port));
  });
  if (!queued) return Status(Code::kCancelled, "the scheduler's event loop is stopping");
  Result<int> r = done.get_future().get();
  if (r.ok()) port_ = *r;
  return r;
}

void SchedulerHttp::Stop() {
  if (stopped_ || !server_) return;
  stopped_ = true;
  auto shutdown = [this] {
    server_->Shutdown();  // its close watchers take the streams off the hub first
    alive_.Expire();
  };
  sched_->loop()->RunAndWait(shutdown);
}

void SchedulerHttp::Reply(comm::HttpConnId id, const Status& st, json data) {
  DCHECK(sched_->loop()->InLoopThread());
  int status = HttpStatusOf(st.code());
  ++responses_[status];
  server_->Respond(id, status, kJson, comm::JsonEnvelope(st.code(), st.ok() ? "ok" : st.ToString(), data))
      .IgnoreError();
}

// Mutating endpoints need the cluster token as a bearer token when the job has one.
bool SchedulerHttp::Authorized(const comm::HttpRequest& req) const {
  const std::string& token = sched_->options().cluster_token;
  if (token.empty()) return true;
  auto h = req.headers.find("authorization");
  if (h == req.headers.end()) return false;
  const std::string prefix = "Bearer ";
  if (h->second.compare(0, prefix.size(), prefix) != 0) return false;
  std::string given = h->second.substr(prefix.size());
  return given.size() == token.size() && CRYPTO_memcmp(given.data(), token.data(), token.size()) == 0;
}

void SchedulerHttp::Unauthorized(comm::HttpConnId id) {
  DCHECK(sched_->loop()->InLoopThread());
  ++responses_[401];
  server_->Respond(id, 401, kJson,
                   comm::JsonEnvelope(Code::kPermissionDenied,
                                      "this job has a cluster token: send Authorization: Bearer <token>"))
      .IgnoreError();
}

void SchedulerHttp::OnRequest(comm::HttpConnId id, comm::HttpRequest&& req) {
  DCHECK(sched_->loop()->InLoopThread());
  const std::string& p = req.path;
  const bool get = req.method == "GET" || req.method == "HEAD";  // HEAD: the server sends no body
  const bool post = req.method == "POST";
  auto wrong_method = [&](const char* allowed) {
    ++responses_[405];
    // RFC 9110 15.5.6: a 405 lists the methods the resource supports.
    const std::string body =
        comm::JsonEnvelope(Code::kInvalidArgument, req.method + " not allowed on " + p + "; use " + allowed);
    server_->Respond(id, 405, kJson, body, {{"Allow", allowed}}).IgnoreError();
  };
  if (p == "/v1/ranktable") return get ? ServeRankTable(id, req) : wrong_method("GET, HEAD");
  if (p == "/v1/ranktable/stream") return get ? ServeStream(id, req) : wrong_method("GET, HEAD");
  if (p == "/v1/ranktable/register") {
    if (!post) return wrong_method("POST");
    if (!Authorized(req)) return Unauthorized(id);
    return ServeRegister(id, req);
  }
  if (p == "/metrics") return get ? ServeMetrics(id) : wrong_method("GET, HEAD");
  if (p == "/v1/cluster" || p == "/v1/nodes") {
    if (!get) return wrong_method("GET, HEAD");
    pb::AdminRequest areq;
    areq.set_op(AdminOpName(p == "/v1/nodes" ? AdminOp::kNodes : AdminOp::kStatus));
    Status allowed = sched_->CheckAdminCertificate(areq.op(), req.peer_identity, "an HTTPS client");
    if (!allowed.ok()) return Reply(id, allowed, nullptr);
    return sched_->Admin(areq, [this, id](Status st, pb::AdminResponse resp) { Reply(id, st, AdminJson(resp)); });
  }
  if (p.rfind("/v1/", 0) == 0 && HttpAdminOp(p.substr(4)) != nullptr) {
    if (!post) return wrong_method("POST");
    if (!Authorized(req)) return Unauthorized(id);
    return ServeAdmin(id, *HttpAdminOp(p.substr(4)), req);
  }
  Reply(id, Status(Code::kNotFound, "no such endpoint: " + p), nullptr);
}

void SchedulerHttp::ServeRankTable(comm::HttpConnId id, const comm::HttpRequest& req) {
  DCHECK(sched_->loop()->InLoopThread());
  auto job = req.query.find("jobId");
  Status st = hub_->CheckJob(job == req.query.end() ? "" : job->second);
  if (!st.ok()) return Reply(id, st, nullptr);
  std::shared_ptr<const RankTableSnapshot> snap = hub_->current();
  if (!snap) {
    return Reply(id, Status(Code::kUnavailable, "no complete rank table yet: job '" + hub_->job_id() +
                                                    "' is not ready (every member registered with its devices)"),
                 nullptr);
  }
  Reply(id, Status::Ok(), json{{"jobId", snap->job_id}, {"version", snap->version},
                               {"rankTable", json::parse(snap->table, nullptr, false)}});
}

void SchedulerHttp::ServeRegister(comm::HttpConnId id, const comm::HttpRequest& req) {
  DCHECK(sched_->loop()->InLoopThread());
  std::string job_id, role;
  Status st = ParseRegisterBody(req.body, &job_id, &role);
  if (!st.ok()) return Reply(id, st, nullptr);
  Result<pb::RankTableRegistration> reg = hub_->Register(job_id, role);
  if (!reg.ok()) return Reply(id, reg.status(), nullptr);
  Reply(id, Status::Ok(), json{{"job_id", reg->jobid()}, {"role", reg->role()}, {"registration", reg->registration()}});
}

void SchedulerHttp::ServeStream(comm::HttpConnId id, const comm::HttpRequest& req) {
  DCHECK(sched_->loop()->InLoopThread());
  auto job = req.query.find("jobId");
  uint64_t registration = 0;
  auto reg = req.query.find("registration");
  Status st = reg == req.query.end() ? Status::Ok() : ParseRegistration(reg->second, &registration);
  if (st.ok()) st = hub_->CheckSubscription(job == req.query.end() ? "" : job->second, registration);
  if (!st.ok()) return Reply(id, st, nullptr);
  auto role = req.query.find("role");
  ++responses_[200];
  if (!server_->StartStream(id, 200, "application/x-ndjson").ok()) return;
  comm::HttpServer* server = server_.get();
  RankTableHub::Sink sink;
  sink.label = "http conn " + std::to_string(id);
  sink.role = role == req.query.end() ? "" : role->second;
  sink.queued_bytes = [server, id] { return server->QueuedBytes(id); };
  sink.send = [server, id](const RankTableSnapshot& snap) { return server->SendChunk(id, snap.line); };
  sink.registration = registration;
  sink.drop = [server, id](const Status&) { server->Close(id); };
  // The final line: {"jobId":J,"error":{"code":N,"message":M}}, then the stream's end.
  sink.end = [server, id, job_id = hub_->job_id()](const Status& why) {
    json line = {{"jobId", job_id}, {"error", {{"code", static_cast<int>(why.code())}, {"message", why.message()}}}};
    server->SendChunk(id, std::make_shared<const std::string>(comm::JsonText(line) + "\n")).IgnoreError();
    if (!server->EndStream(id).ok()) server->Close(id);
  };
  uint64_t sub = hub_->AddSubscriber(std::move(sink));
  ++http_subscribers_;
  comm::AliveToken::Watch alive = alive_.watch();
  server_->WatchClose(id, [this, alive, sub] {
    if (!alive) return;
    hub_->RemoveSubscriber(sub);
    --http_subscribers_;
  });
}

void SchedulerHttp::CountScale(AdminOp op, const Status& st) {
  DCHECK(sched_->loop()->InLoopThread());
  ++scale_ops_[{op, st.ok()}];
}

void SchedulerHttp::ServeAdmin(comm::HttpConnId id, const AdminOpInfo& info, const comm::HttpRequest& req) {
  DCHECK(sched_->loop()->InLoopThread());
  const AdminOp op = info.op;
  pb::AdminRequest areq;
  Status st = sched_->CheckAdminCertificate(info.wire, req.peer_identity, "an HTTPS client");
  if (!st.ok()) {
    CountScale(op, st);
    return Reply(id, st, nullptr);
  }
  st = ParseAdminBody(req.body, info, &areq);
  if (!st.ok()) {
    CountScale(op, st);
    return Reply(id, st, nullptr);
  }
  sched_->Admin(areq, [this, id, op](Status s, pb::AdminResponse resp) {
    CountScale(op, s);
    Reply(id, s, AdminJson(resp));
  });
}

}  // namespace pscore::node
