#include "pscore/core/status.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore {

TEST_CASE("status carries code and message - result holds value or error", "[core]") {
  Status ok = Status::Ok();
  CHECK(ok.ok());
  CHECK(ok.ToString() == "ok");
  Status bad(Code::kTimeout, "barrier b1: 2/3 arrived");
  CHECK_FALSE(bad.ok());
  CHECK(bad.ToString() == "timeout: barrier b1: 2/3 arrived");
  CHECK(CodeFromInt(static_cast<int32_t>(Code::kNotFound)) == Code::kNotFound);
  CHECK(CodeFromInt(9999) == Code::kInternal);

  Result<int> r = 7;
  REQUIRE(r.ok());
  CHECK(*r == 7);
  Result<int> e = Status(Code::kInvalidArgument, "x");
  CHECK(e.status().code() == Code::kInvalidArgument);
}

}  // namespace pscore
