#include "pscore/node/common/member_http.h"

#include <future>

#include "pscore/core/cluster_manager.h"
#include "pscore/node/common/metrics_text.h"
#include "pscore/node/common/wire.h"

namespace pscore::node {
namespace {

// A label value in the text format: backslash, double quote and newline escaped.
std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

}  // namespace

MemberHttp::MemberHttp(Node* node, comm::HttpServerOptions options) : node_(node), options_(options) {
  if (options_.tls == nullptr) options_.tls = node_->options().tls;  // HTTPS when the node uses TLS
}

MemberHttp::~MemberHttp() { Stop(); }

Result<int> MemberHttp::Start(const std::string& host, int port) {
  if (server_) return Status(Code::kFailedPrecondition, "http already started");
  std::promise<Result<int>> done;
  bool queued = node_->loop()->Run([&] {
    server_ = std::make_unique<comm::HttpServer>(
        node_->loop(), options_, [this](comm::HttpConnId id, comm::HttpRequest&& req) { OnRequest(id, std::move(req)); });
    done.set_value(server_->Listen(host, port));
  });
  if (!queued) return Status(Code::kCancelled, "the node's event loop is stopping");
  return done.get_future().get();
}

void MemberHttp::Stop() {
  if (stopped_ || !server_) return;
  stopped_ = true;
  node_->loop()->RunAndWait([this] { server_->Shutdown(); });
}

// Only /metrics: a member has no admin surface of its own.
void MemberHttp::OnRequest(comm::HttpConnId id, comm::HttpRequest&& req) {
  DCHECK(node_->loop()->InLoopThread());
  const bool get = req.method == "GET" || req.method == "HEAD";
  if (req.path != "/metrics") {
    ++responses_[404];
    server_->Respond(id, 404, "text/plain", "no such endpoint: " + req.path + " (a member serves /metrics)\n")
        .IgnoreError();
    return;
  }
  if (!get) {
    ++responses_[405];
    server_->Respond(id, 405, "text/plain", req.method + " not allowed on /metrics; use GET, HEAD\n",
                     {{"Allow", "GET, HEAD"}})
        .IgnoreError();
    return;
  }
  ++responses_[200];
  server_->Respond(id, 200, "text/plain; version=0.0.4", Metrics()).IgnoreError();
}

// Prometheus text format 0.0.4.
std::string MemberHttp::Metrics() {
  DCHECK(node_->loop()->InLoopThread());
  MetricsText m;
  const std::string role = RoleLabel(node_->role());
  m.Family("pscore_member_info", "gauge", "This process: 1, labelled with its role and node id.");
  m.Sample("pscore_member_info", "role=\"" + role + "\",node_id=\"" + EscapeLabel(node_->node_id()) + "\"", 1);
  m.Family("pscore_member_rank", "gauge", "This node's rank in its role (absent before the scheduler assigned one).");
  if (node_->rank() >= 0) m.Sample("pscore_member_rank", "", static_cast<uint64_t>(node_->rank()));
  m.Family("pscore_cluster_state", "gauge", "1 for the cluster state this node last heard of, 0 for the others.");
  const google::protobuf::EnumDescriptor* states = pb::ClusterState_descriptor();
  for (int i = 0; i < states->value_count(); ++i) {
    const auto state = static_cast<pb::ClusterState>(states->value(i)->number());
    m.Sample("pscore_cluster_state", "state=\"" + core::ClusterStateName(state) + "\"",
             state == node_->cluster_state() ? 1 : 0);
  }
  m.Family("pscore_membership_version", "gauge", "Membership epoch of the metadata this node holds.");
  m.Sample("pscore_membership_version", "", node_->epoch());
  const comm::Transport& t = node_->transport();
  AppendTransportMetrics(t, &m);
  m.Family("pscore_connections", "gauge", "Open connections by protocol.");
  m.Sample("pscore_connections", "protocol=\"native\"", t.num_connections());
  m.Sample("pscore_connections", "protocol=\"http\"", server_->num_connections());
  m.Family("pscore_connections_opened_total", "counter", "Connections opened by protocol.");
  m.Sample("pscore_connections_opened_total", "protocol=\"native\"", t.stats().connections_opened);
  m.Sample("pscore_connections_opened_total", "protocol=\"http\"", server_->stats().connections_accepted);
  m.Family("pscore_payload_bytes_copied_total", "counter", "Payload bytes this node copied in user space.");
  m.Sample("pscore_payload_bytes_copied_total", "", node_->payload_bytes_copied());
  node_->AppendRoleMetrics(&m);
  m.Family("pscore_http_responses_total", "counter", "HTTP responses by status code.");
  for (auto& [code, n] : responses_) m.Sample("pscore_http_responses_total", "code=\"" + std::to_string(code) + "\"", n);
  return m.text();
}

}  // namespace pscore::node
