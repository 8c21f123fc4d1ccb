#include "pscore/core/role_names.h"

namespace pscore::core {

std::string RoleLabel(pb::NodeRole role) {
  switch (role) {
    case pb::SERVER: return "server";
    case pb::WORKER: return "worker";
    case pb::SCHEDULER: return "scheduler";
    case pb::ADMIN_CLIENT: return "admin";
    default: return std::to_string(static_cast<int>(role));
  }
}

std::optional<pb::NodeRole> ParseRoleLabel(std::string_view name) {
  for (pb::NodeRole role : {pb::SCHEDULER, pb::SERVER, pb::WORKER}) {
    if (name == RoleLabel(role)) return role;
  }
  return std::nullopt;
}

}  // namespace pscore::core
