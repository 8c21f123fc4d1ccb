// Handoff: a blocking call's answer handed from the loop thread to the caller waiting for it.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "pscore/node/common/handoff.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;

TEST_CASE("handoff: a value put before the taker comes is taken at once, and a second put is dropped", "[node][handoff]") {
  Handoff<std::string> h;
  h.Put("first");
  h.Put("second");
  std::optional<std::string> got = h.TakeFor(0s);
  REQUIRE(got.has_value());
  CHECK(*got == "first");
}

// Take waits the same way without a bound; coordination_test's KvSet without overwrite covers it.
TEST_CASE("handoff: a taker asleep in TakeFor wakes with the value another thread puts", "[node][handoff]") {
  for (int round = 0; round < 200; ++round) {
    auto h = std::make_shared<Handoff<int>>();
    std::thread putter([h, round] {
      if (round % 2 == 0) std::this_thread::sleep_for(100us);  // after the taker sleeps, or before
      h->Put(round);
    });
    std::optional<int> got = h->TakeFor(10s);
    REQUIRE(got.has_value());
    CHECK(*got == round);
    putter.join();
  }
}

TEST_CASE("handoff: TakeFor gives up after its timeout, and a later put still lands", "[node][handoff]") {
  auto h = std::make_shared<Handoff<int>>();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(h->TakeFor(50ms).has_value());
  CHECK(std::chrono::steady_clock::now() - t0 >= 50ms);
  std::thread putter([h] { h->Put(7); });  // after the taker gave up: it still lands (the putter shares h)
  putter.join();
  std::optional<int> late = h->TakeFor(10s);
  REQUIRE(late.has_value());
  CHECK(*late == 7);
}

}  // namespace
}  // namespace pscore::node
