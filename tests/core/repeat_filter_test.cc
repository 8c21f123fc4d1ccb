#include <string>

// Our headers first: glog defines its own CHECK, and catch.hpp must come last.
#include "pscore/core/repeat_filter.h"

#include <catch2/catch.hpp>

namespace pscore::core {

using namespace std::chrono_literals;

TEST_CASE("a repeated line is written once per period and the next one counts the repeats", "[core][log]") {
  FakeClock clock;
  RepeatFilter filter(30s, 16);
  CHECK(filter.Admit("s2", "quota full (2/2)", clock.Now()) == std::optional<int64_t>(0));
  for (int i = 0; i < 29; ++i) {
    clock.Advance(1s);
    CHECK_FALSE(filter.Admit("s2", "quota full (2/2)", clock.Now()).has_value());
  }
  // Another subject is not held back by s2's lines.
  CHECK(filter.Admit("s3", "quota full (2/2)", clock.Now()) == std::optional<int64_t>(0));
  clock.Advance(1s);  // 30 s after s2's first line
  CHECK(filter.Admit("s2", "quota full (2/2)", clock.Now()) == std::optional<int64_t>(29));
  clock.Advance(1s);
  CHECK_FALSE(filter.Admit("s2", "quota full (2/2)", clock.Now()).has_value());
}

TEST_CASE("a changed message is written at once with the repeats of the one before", "[core][log]") {
  FakeClock clock;
  RepeatFilter filter(30s, 16);
  REQUIRE(filter.Admit("s2", "scale-in running", clock.Now()).has_value());
  clock.Advance(1s);
  CHECK_FALSE(filter.Admit("s2", "scale-in running", clock.Now()).has_value());
  clock.Advance(1s);
  CHECK(filter.Admit("s2", "quota full (1/1)", clock.Now()) == std::optional<int64_t>(1));
  clock.Advance(1s);
  CHECK_FALSE(filter.Admit("s2", "quota full (1/1)", clock.Now()).has_value());
}

TEST_CASE("a forgotten subject's next line is written - the subjects remembered are bounded", "[core][log]") {
  FakeClock clock;
  RepeatFilter filter(30s, 4);
  REQUIRE(filter.Admit("s2", "quota full", clock.Now()).has_value());
  filter.Forget("s2");
  CHECK(filter.Admit("s2", "quota full", clock.Now()) == std::optional<int64_t>(0));
  for (int i = 0; i < 100; ++i) filter.Admit("stranger" + std::to_string(i), "bad rank", clock.Now());
  CHECK(filter.subjects() <= 4);
}

}  // namespace pscore::core
