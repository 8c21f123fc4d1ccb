// BlockingLink against a real Transport: round trips with payloads, the token handshake
// (right and wrong token), an answer that never comes (deadline), a peer that goes away.
#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include <string>

#include "comm/blocking_link.h"

namespace pscore::comm {
namespace {

using namespace std::chrono_literals;
using testing::EchoServer;
using testing::TestMeta;

}  // namespace

TEST_CASE("blocking link: round trips with payloads of many sizes, answers matched by request id",
          "[comm][net][blocking_link]") {
  EchoServer server;
  int port = server.Start();
  Result<std::unique_ptr<BlockingLink>> link = BlockingLink::Dial("127.0.0.1", port, BlockingLinkOptions());
  REQUIRE(link.ok());
  for (size_t size : {size_t{0}, size_t{1}, size_t{4096}, size_t{1} << 20}) {
    std::string body(size, 'a');
    for (size_t i = 0; i < size; ++i) body[i] = static_cast<char>('a' + i % 26);
    Result<Frame> r = (*link)->Call(TestMeta(1), size ? Buffer::FromString(body) : nullptr, 10s);
    REQUIRE(r.ok());
    CHECK(r->meta.is_response());
    CHECK((r->payload ? std::string(r->payload->view()) : std::string()) == body);
  }
  CHECK_FALSE((*link)->broken());
}

TEST_CASE("blocking link: the token handshake - right token served and wrong token refused",
          "[comm][net][blocking_link][auth]") {
  TransportOptions o;
  o.auth_token = "sesame";
  EchoServer server(o);
  int port = server.Start();
  BlockingLinkOptions right;
  right.auth_token = "sesame";
  Result<std::unique_ptr<BlockingLink>> ok = BlockingLink::Dial("127.0.0.1", port, right);
  REQUIRE(ok.ok());
  Result<Frame> r = (*ok)->Call(TestMeta(1), Buffer::FromString("hi"), 10s);
  REQUIRE(r.ok());
  CHECK(std::string(r->payload->view()) == "hi");

  BlockingLinkOptions wrong;
  wrong.auth_token = "open barley";
  Result<std::unique_ptr<BlockingLink>> refused = BlockingLink::Dial("127.0.0.1", port, wrong);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == Code::kPermissionDenied);
  CHECK_THAT(refused.status().message(), Catch::Contains("wrong cluster token proof"));
  // No token at all: the server's challenge is the first frame; a call is refused.
  Result<std::unique_ptr<BlockingLink>> none = BlockingLink::Dial("127.0.0.1", port, BlockingLinkOptions());
  REQUIRE(none.ok());  // the connect itself succeeds
  Result<Frame> denied = (*none)->Call(TestMeta(1), Buffer::FromString("hi"), 5s);
  CHECK_FALSE(denied.ok());
}

TEST_CASE("blocking link: an answer that never comes ends at the deadline and breaks the link",
          "[comm][net][blocking_link]") {
  EchoServer server;
  int port = server.Start();
  Result<std::unique_ptr<BlockingLink>> link = BlockingLink::Dial("127.0.0.1", port, BlockingLinkOptions());
  REQUIRE(link.ok());
  pb::MessageMeta silent = TestMeta(1, testing::kCmdSilent);
  const auto t0 = std::chrono::steady_clock::now();
  Result<Frame> r = (*link)->Call(silent, Buffer::FromString("x"), 300ms);
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(r.status().code() == Code::kTimeout);
  CHECK(took >= 300ms);
  CHECK(took < 10s);
  CHECK((*link)->broken());
  CHECK((*link)->Call(TestMeta(1), nullptr, 1s).status().code() == Code::kUnavailable);
}

TEST_CASE("blocking link: a peer that goes away fails the call with kUnavailable - not a hang",
          "[comm][net][blocking_link]") {
  auto server = std::make_unique<EchoServer>();
  int port = server->Start();
  Result<std::unique_ptr<BlockingLink>> link = BlockingLink::Dial("127.0.0.1", port, BlockingLinkOptions());
  REQUIRE(link.ok());
  REQUIRE((*link)->Call(TestMeta(1), nullptr, 10s).ok());
  server.reset();
  Result<Frame> r = (*link)->Call(TestMeta(1), Buffer::FromString("x"), 10s);
  CHECK(r.status().code() == Code::kUnavailable);
  CHECK((*link)->broken());
  // Nobody listening any more: the dial fails at once.
  BlockingLinkOptions quick;
  quick.connect_timeout = 2s;
  CHECK(BlockingLink::Dial("127.0.0.1", port, quick).status().code() == Code::kUnavailable);
}

}  // namespace pscore::comm
