// A role's name as flags, the Python binding and launchers spell it: the inverse of
// RoleLabel (wire.h) for the three roles a process runs as. Header only; any thread.
#pragma once

#include <optional>
#include <string>

#include "pscore/proto/comm.pb.h"

namespace pscore::node {

// "scheduler", "server" or "worker"; any other name (or "admin") is nullopt.
inline std::optional<pb::NodeRole> ParseRoleLabel(const std::string& name) {
  if (name == "scheduler") return pb::SCHEDULER;
  if (name == "server") return pb::SERVER;
  if (name == "worker") return pb::WORKER;
  return std::nullopt;
}

}  // namespace pscore::node
