// Keyword options of the node classes into the C++ option structs, and the TLS files.
#include "binding.h"

namespace pscore::python {

std::shared_ptr<comm::TlsContext> LoadTls(const comm::TlsFiles& files) {
  if (!files.enabled()) return nullptr;
  Result<std::shared_ptr<comm::TlsContext>> tls = comm::TlsContext::Load(files);
  if (!tls.ok()) Raise(tls.status());
  return *tls;
}

bool TlsOption(const std::string& k, py::handle v, comm::TlsFiles& files) {
  if (k == "tls_cert") files.cert = v.cast<std::string>();
  else if (k == "tls_key") files.key = v.cast<std::string>();
  else if (k == "tls_ca") files.ca = v.cast<std::string>();
  else return false;
  return true;
}

void ApplyNodeOptions(node::NodeOptions& o, const py::kwargs& kw) {
  comm::TlsFiles tls;
  for (auto item : kw) {
    std::string k = item.first.cast<std::string>();
    py::handle v = item.second;
    if (k == "node_id") o.node_id = v.cast<std::string>();
    else if (k == "scheduler_host") o.scheduler_host = v.cast<std::string>();
    else if (k == "scheduler_port") o.scheduler_port = v.cast<int>();
    else if (k == "host") o.host = v.cast<std::string>();
    else if (k == "port") o.port = v.cast<int>();
    else if (k == "rank") o.rank = v.cast<int>();
    else if (k == "heartbeat_interval") o.heartbeat_interval = Seconds(v.cast<double>());
    else if (k == "heartbeat_timeout") o.heartbeat_timeout = Seconds(v.cast<double>());
    else if (k == "scheduler_timeout") o.scheduler_timeout_ms = static_cast<int64_t>(v.cast<double>() * 1000);
    else if (k == "connect_timeout") o.connect_timeout = Seconds(v.cast<double>());
    else if (k == "join_timeout") o.join_timeout = Seconds(v.cast<double>());
    else if (k == "request_timeout") o.request_timeout = Seconds(v.cast<double>());
    else if (k == "recovery_timeout") o.recovery_timeout = Seconds(v.cast<double>());
    else if (k == "host_name") o.host_name = v.cast<std::string>();
    else if (k == "max_message_bytes") o.max_message_bytes = v.cast<uint64_t>();
    else if (k == "handler_threads") o.handler_threads = v.cast<int>();
    else if (k == "push_slice_keys") o.push_slice_keys = v.cast<size_t>();
    else if (k == "data_dir") o.data_dir = v.cast<std::string>();
    else if (k == "journal_compact_bytes") o.journal_compact_bytes = v.cast<uint64_t>();
    else if (k == "cluster_token") o.cluster_token = v.cast<std::string>();
    else if (k == "direct_control_calls") o.direct_control_calls = v.cast<bool>();
    else if (k == "poll_spin") o.poll_spin = Seconds(v.cast<double>());
    else if (k == "max_connections") o.accept.max_connections = v.cast<size_t>();
    else if (TlsOption(k, v, tls)) continue;
    else Raise(Status(Code::kInvalidArgument, "unknown node option '" + k + "'"));
  }
  o.tls = LoadTls(tls);
  // As pscore-node: with TLS and no node_id, the certificate's CN is the node id.
  if (o.tls != nullptr && o.node_id.empty()) o.node_id = o.tls->identity();
}

}  // namespace pscore::python
