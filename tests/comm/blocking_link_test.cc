// BlockingLink against a real Transport: round trips with payloads, the token handshake
// (right and wrong token), an answer that never comes (deadline), a peer that goes away.
#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include <signal.h>

#include <string>
#include <thread>
#include <vector>

#include "pscore/comm/blocking_link.h"

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

TEST_CASE("blocking link: small answers are handed out in place - held ones never change",
          "[comm][net][blocking_link]") {
  EchoServer server;  // a Transport: it pads its answers, so their payloads lie aligned
  int port = server.Start();
  Result<std::unique_ptr<BlockingLink>> link = BlockingLink::Dial("127.0.0.1", port, BlockingLinkOptions());
  REQUIRE(link.ok());
  std::vector<std::string> sent;
  std::vector<BufferPtr> held;
  uint64_t total = 0;
  for (int i = 0; i < 300; ++i) {
    std::string body(static_cast<size_t>(i * 37 % 3000 + 1), '\0');
    for (size_t j = 0; j < body.size(); ++j) body[j] = static_cast<char>('a' + (i + j) % 26);
    Result<Frame> r = (*link)->Call(TestMeta(1), Buffer::FromString(body), 10s);
    REQUIRE(r.ok());
    REQUIRE(r->payload != nullptr);
    sent.push_back(std::move(body));
    held.push_back(r->payload);
    total += sent.back().size();
  }
  // Every answer kept is what was sent back, though the link read 299 more after it.
  int changed = 0;
  for (size_t i = 0; i < held.size(); ++i) changed += held[i]->view() != sent[i];
  CHECK(changed == 0);
  // Nearly all of them were views of the link's input buffer (one that arrived in two
  // reads would be copied; on loopback they come whole).
  INFO((*link)->payload_bytes_copied() << " of " << total << " payload bytes copied");
  CHECK((*link)->payload_bytes_copied() * 10 < total);
}

TEST_CASE("blocking link: answers of a peer that does not pad are copied where misaligned - and read right",
          "[comm][net][blocking_link]") {
  testing::RawListener listener;
  const int port = listener.Start();
  REQUIRE(port > 0);
  constexpr int kCalls = 40;
  uint64_t misaligned_bytes = 0;  // of answer payloads not 8-byte aligned in the stream
  bool peer_ok = true;
  std::thread peer([&] {
    testing::RawSocket s;
    if (!listener.Accept(&s)) {
      peer_ok = false;
      return;
    }
    uint64_t offset = 0;  // bytes written to the link so far
    for (int i = 0; i < kCalls && peer_ok; ++i) {
      pb::MessageMeta request;
      std::string payload;
      if (!s.RecvFrame(&request, &payload)) {
        peer_ok = false;
        break;
      }
      pb::MessageMeta answer;
      answer.set_request_id(request.request_id());
      answer.set_is_response(true);
      const std::string meta = answer.SerializeAsString();
      const std::string body = payload + std::string(static_cast<size_t>(i), 'z');
      if ((offset + kHeaderBytes + meta.size()) % kPayloadAlign != 0) misaligned_bytes += body.size();
      const std::string frame = EncodeHeader(FrameHeader{kMagic, static_cast<uint32_t>(meta.size()), body.size()}) +
                                meta + body;
      peer_ok = s.SendAll(frame);
      offset += frame.size();
    }
  });
  Result<std::unique_ptr<BlockingLink>> link = BlockingLink::Dial("127.0.0.1", port, BlockingLinkOptions());
  REQUIRE(link.ok());
  for (int i = 0; i < kCalls; ++i) {
    const std::string body = "call " + std::to_string(i) + " ";
    Result<Frame> r = (*link)->Call(TestMeta(1), Buffer::FromString(body), 10s);
    REQUIRE(r.ok());
    REQUIRE(r->payload != nullptr);
    CHECK(r->payload->view() == body + std::string(static_cast<size_t>(i), 'z'));
  }
  peer.join();
  CHECK(peer_ok);
  CHECK(misaligned_bytes > 0);
  CHECK((*link)->payload_bytes_copied() == misaligned_bytes);
}

TEST_CASE("blocking link: writing to a peer that is gone fails the call - SIGPIPE does not kill the process",
          "[comm][net][blocking_link]") {
  struct sigaction current {};
  REQUIRE(::sigaction(SIGPIPE, nullptr, &current) == 0);
  REQUIRE(current.sa_handler == SIG_DFL);
  testing::RawListener listener;
  const int port = listener.Start();
  REQUIRE(port > 0);
  Result<std::unique_ptr<BlockingLink>> link = BlockingLink::Dial("127.0.0.1", port, BlockingLinkOptions());
  REQUIRE(link.ok());
  testing::RawSocket gone;
  REQUIRE(listener.Accept(&gone));
  gone.Close();
  Status last;
  for (int i = 0; i < 50 && !(*link)->broken(); ++i) {
    last = (*link)->Notify(TestMeta(1), Buffer::Allocate(1 << 20), 5s);
    std::this_thread::sleep_for(5ms);
  }
  CHECK((*link)->broken());
  CHECK(last.code() == Code::kUnavailable);
}

}  // namespace pscore::comm
