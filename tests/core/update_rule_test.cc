#include <vector>

// Our headers first: glog defines its own CHECK, and catch.hpp must come last so that CHECK
// below is Catch's (reports and continues) rather than glog's (aborts the binary).
#include "pscore/core/update_rule.h"

#include <catch2/catch.hpp>

namespace pscore::core {
namespace {

TEST_CASE("each update rule gives the same values in place and into a new block", "[core][update_rule]") {
  const std::vector<float> stored = {1.0f, -2.0f, 0.5f};
  const std::vector<float> pushed = {4.0f, 2.0f, -1.0f};
  struct Case {
    UpdateRule rule;
    std::vector<float> want;
  };
  for (const Case& c : {Case{UpdateRule::kAssign, {4.0f, 2.0f, -1.0f}}, Case{UpdateRule::kSum, {5.0f, 0.0f, -0.5f}},
                        Case{UpdateRule::kSgd, {-1.0f, -3.0f, 1.0f}}}) {
    std::vector<float> in_place = stored;
    ApplyRule(c.rule, 0.5f, in_place.data(), pushed.data(), in_place.size());
    std::vector<float> into(stored.size(), 99.0f);
    ApplyRuleInto(c.rule, 0.5f, stored.data(), pushed.data(), stored.size(), into.data());
    CHECK(in_place == c.want);
    CHECK(into == c.want);
  }
}

}  // namespace
}  // namespace pscore::core
