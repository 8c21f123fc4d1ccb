#include "pscore/node/common/metrics_text.h"

#include <vector>

#include "pscore/comm/tls.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::node {

void MetricsText::Family(const std::string& name, const char* type, const char* help) {
  out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void MetricsText::Sample(const std::string& name, const std::string& labels, uint64_t value) {
  out_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + std::to_string(value) + "\n";
}

std::string CommandLabel(int cmd) {
  if (cmd == comm::kOtherCommand) return "OTHER";
  if (pb::NodeCommand_IsValid(cmd)) return pb::NodeCommand_Name(static_cast<pb::NodeCommand>(cmd));
  return "CMD_" + std::to_string(cmd);
}

void AppendTransportMetrics(const comm::Transport& t, MetricsText* m) {
  // By command: one in and one out sample per command that carried a frame either way.
  const std::vector<comm::CommandStats> by_cmd = t.StatsByCommand();
  m->Family("pscore_messages_total", "counter", "Native protocol frames by direction and command.");
  for (const comm::CommandStats& c : by_cmd) {
    const std::string cmd = CommandLabel(c.cmd);
    m->Sample("pscore_messages_total", "direction=\"in\",cmd=\"" + cmd + "\"", c.frames_in);
    m->Sample("pscore_messages_total", "direction=\"out\",cmd=\"" + cmd + "\"", c.frames_out);
  }
  m->Family("pscore_bytes_total", "counter", "Native protocol bytes of whole frames by direction and command.");
  for (const comm::CommandStats& c : by_cmd) {
    const std::string cmd = CommandLabel(c.cmd);
    m->Sample("pscore_bytes_total", "direction=\"in\",cmd=\"" + cmd + "\"", c.bytes_in);
    m->Sample("pscore_bytes_total", "direction=\"out\",cmd=\"" + cmd + "\"", c.bytes_out);
  }
  const comm::TransportStats& s = t.stats();
  m->Family("pscore_wire_bytes_total", "counter",
            "Native protocol bytes read and queued, partial and refused frames included.");
  m->Sample("pscore_wire_bytes_total", "direction=\"in\"", s.bytes_in);
  m->Sample("pscore_wire_bytes_total", "direction=\"out\"", s.bytes_out);
  m->Family("pscore_protocol_errors_total", "counter", "Native connections closed for bad input.");
  m->Sample("pscore_protocol_errors_total", "", s.protocol_errors);
  m->Family("pscore_connections_capped_total", "counter", "Native connections closed at a memory cap, by cap.");
  m->Sample("pscore_connections_capped_total", "cap=\"incomplete_frames\"", s.incomplete_cap_closed);
  m->Sample("pscore_connections_capped_total", "cap=\"queued_per_connection\"", s.queued_cap_closed);
  m->Sample("pscore_connections_capped_total", "cap=\"queued_total\"", s.total_queued_cap_closed);
  m->Family("pscore_incomplete_frame_bytes", "gauge", "Payload bytes held for native frames received in part.");
  m->Sample("pscore_incomplete_frame_bytes", "", t.incomplete_frame_bytes());
  m->Family("pscore_queued_write_bytes", "gauge", "Native output queued and not yet written, all connections.");
  m->Sample("pscore_queued_write_bytes", "", s.queued_write_bytes);
  if (const std::shared_ptr<comm::TlsContext>& tls = t.options().tls) {
    m->Family("pscore_tls_handshakes_total", "counter", "Native TLS handshakes, completed or failed (closed before done).");
    m->Sample("pscore_tls_handshakes_total", "result=\"ok\"", s.tls_handshakes);
    m->Sample("pscore_tls_handshakes_total", "result=\"failed\"", s.tls_failures);
    const int64_t left = tls->SecondsToExpiry();
    m->Family("pscore_tls_cert_expiry_seconds", "gauge", "Seconds until this process's TLS certificate expires (0: expired).");
    // The CN is a certificate's subject: quotes and backslashes are escaped for the label.
    std::string cn;
    for (char ch : tls->identity()) {
      if (ch == '"' || ch == '\\') cn += '\\';
      if (ch == '\n') { cn += "\\n"; continue; }
      cn += ch;
    }
    m->Sample("pscore_tls_cert_expiry_seconds", "cn=\"" + cn + "\"", left > 0 ? static_cast<uint64_t>(left) : 0);
  }
}

}  // namespace pscore::node
