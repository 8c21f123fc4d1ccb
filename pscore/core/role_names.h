// A role's name as people read and type it: "server", "worker", "scheduler" in messages,
// logs, /metrics labels, JSON and flags. Any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "pscore/proto/comm.pb.h"

namespace pscore::core {

// "server", "worker", "scheduler" or "admin" (ADMIN_CLIENT); a number no role has (a peer
// of another version may send one) as its decimal digits.
std::string RoleLabel(pb::NodeRole role);

// The inverse of RoleLabel for the three roles a process runs as: "scheduler", "server"
// or "worker"; any other name (or "admin") is nullopt.
std::optional<pb::NodeRole> ParseRoleLabel(std::string_view name);

}  // namespace pscore::core
