#include <string>

// Our headers first: glog defines its own CHECK, and catch.hpp must come last so that CHECK
// below is Catch's (reports and continues) rather than glog's (aborts the binary).
#include "pscore/core/role_names.h"

#include <catch2/catch.hpp>

namespace pscore::core {

TEST_CASE("role labels are lower case and parse back for the roles a process runs as", "[core][role]") {
  CHECK(RoleLabel(pb::SERVER) == "server");
  CHECK(RoleLabel(pb::WORKER) == "worker");
  CHECK(RoleLabel(pb::SCHEDULER) == "scheduler");
  CHECK(RoleLabel(pb::ADMIN_CLIENT) == "admin");
  CHECK(RoleLabel(static_cast<pb::NodeRole>(7)) == "7");  // a number no role has, from a newer peer

  for (pb::NodeRole role : {pb::SERVER, pb::WORKER, pb::SCHEDULER}) {
    CHECK(ParseRoleLabel(RoleLabel(role)) == role);
  }
  CHECK_FALSE(ParseRoleLabel("admin").has_value());
  CHECK_FALSE(ParseRoleLabel("SERVER").has_value());
  CHECK_FALSE(ParseRoleLabel("").has_value());
  CHECK_FALSE(ParseRoleLabel("7").has_value());
}

}  // namespace pscore::core
