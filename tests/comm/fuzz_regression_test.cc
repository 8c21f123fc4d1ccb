// Regression tests for inputs found by the fuzzers (tests/fuzz/, docs/fuzzing.md).
#include <future>
#include <memory>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/transport.h"

#include <catch2/catch.hpp>

namespace pscore::comm {
namespace {

// server_dispatch_fuzz, crash-17b4439e: a server asked by injected metadata to move keys
// dialled a peer; the node was stopped and destroyed while the connect was in flight, and
// the dial's callback (which captures the node) ran later, from OnConnect with
// UV_ECANCELED: a use after free. Shutdown answers an in-flight dial at once.
TEST_CASE("transport: Shutdown answers an in-flight dial before returning", "[comm][net][fuzz]") {
  EventLoop loop("regression");
  REQUIRE(loop.Start().ok());
  std::promise<bool> result;
  loop.Post([&loop, &result] {
    auto transport = std::make_unique<Transport>(&loop, TransportOptions{}, Transport::Handlers{});
    auto answered = std::make_shared<int>(0);
    auto code = std::make_shared<Code>(Code::kOk);
    // Nothing listens on port 1: the connect is refused, but only in a later iteration.
    transport->Connect("127.0.0.1", 1, ConnectOptions{}, [answered, code](Result<ConnId> r) {
      ++*answered;
      *code = r.status().code();
    });
    transport->Shutdown();
    bool ok = *answered == 1 && *code == Code::kCancelled;
    transport.reset();  // the owner goes; OnConnect must not call back into it
    result.set_value(ok);
  });
  auto fut = result.get_future();
  REQUIRE(fut.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  CHECK(fut.get());
  // Let OnConnect run (it only frees the dialer), then close the loop: no handle leaks.
  std::promise<void> later;
  loop.Post([&later] { later.set_value(); });
  later.get_future().wait();
  CHECK(loop.Stop().ok());
}

}  // namespace
}  // namespace pscore::comm
