// MetricsText: builds a Prometheus text-format 0.0.4 page (a HELP and TYPE line per family,
// then its samples), and the transport families every role exports. Used by SchedulerHttp
// and MemberHttp on their node's loop thread; a plain value, owned by the caller.
#pragma once

#include <cstdint>
#include <string>

#include "pscore/comm/transport.h"

namespace pscore::node {

class MetricsText {
 public:
  void Family(const std::string& name, const char* type, const char* help);
  void Sample(const std::string& name, const std::string& labels, uint64_t value);
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

// The cmd label of a command number: its NodeCommand name, CMD_<n> for an unknown number,
// OTHER for the transport's overflow slot.
std::string CommandLabel(int cmd);

// Loop thread of `t`: pscore_messages_total, pscore_bytes_total (by direction and command),
// pscore_wire_bytes_total and pscore_protocol_errors_total.
void AppendTransportMetrics(const comm::Transport& t, MetricsText* m);

}  // namespace pscore::node
