// A bare messenger link to one port, for tests that speak the protocol without a node:
// its own loop, one dialled connection, calls with deadlines; and a bare listener, the
// same for the other end (a stand-in scheduler). Include before Catch.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/node/common/wire.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {

class RawLink {
 public:
  RawLink(int port, const std::string& loop_name) : loop_(loop_name) {
    using namespace std::chrono_literals;
    messenger_ = std::make_unique<comm::Messenger>(&loop_, comm::TransportOptions(), comm::Messenger::Handlers());
    REQUIRE(loop_.Start().ok());
    auto connected = std::make_shared<std::promise<Result<comm::ConnId>>>();
    auto fut = connected->get_future();
    loop_.Post([this, port, connected] {
      messenger_->transport().Connect("127.0.0.1", port, comm::ConnectOptions(),
                                      [connected](Result<comm::ConnId> c) { connected->set_value(c); });
    });
    REQUIRE(fut.wait_for(15s) == std::future_status::ready);
    Result<comm::ConnId> c = fut.get();
    REQUIRE(c.ok());
    conn_ = *c;
  }
  ~RawLink() {
    using namespace std::chrono_literals;
    auto done = std::make_shared<std::promise<void>>();
    loop_.Post([this, done] {
      messenger_->Shutdown();
      done->set_value();
    });
    if (done->get_future().wait_for(15s) != std::future_status::ready) FAIL("raw link loop did not shut down");
    loop_.Stop().IgnoreError();
  }
  RawLink(const RawLink&) = delete;
  RawLink& operator=(const RawLink&) = delete;

  // Sends a request now; the future gets the answer (or the messenger's error).
  std::future<Result<comm::Frame>> CallAsync(pb::MessageMeta meta, BufferPtr payload, Duration timeout) {
    auto promise = std::make_shared<std::promise<Result<comm::Frame>>>();
    auto fut = promise->get_future();
    loop_.Post([this, meta, payload, timeout, promise] {
      messenger_->Call(conn_, meta, payload, timeout,
                       [promise](Result<comm::Frame> r) { promise->set_value(std::move(r)); });
    });
    return fut;
  }
  // A request as a worker with no rank; the answer within 10 s or kTimeout.
  Result<comm::Frame> Call(pb::NodeCommand cmd, const google::protobuf::MessageLite& msg) {
    using namespace std::chrono_literals;
    std::future<Result<comm::Frame>> fut = CallAsync(node::MakeMeta(cmd, pb::WORKER, -1), node::ToBuffer(msg), 5s);
    if (fut.wait_for(10s) != std::future_status::ready) return Status(Code::kTimeout, "raw call: no answer");
    return fut.get();
  }
  // A one-way message.
  void Notify(pb::MessageMeta meta, BufferPtr payload) {
    loop_.Post([this, meta, payload] { messenger_->Notify(conn_, meta, payload).IgnoreError(); });
  }
  // Introduces the link to a server as the worker `node_id` (HELLO): a member's data
  // requests are served on it.
  void HelloAsWorker(const std::string& node_id) {
    pb::HelloMessage hello;
    hello.set_node_id(node_id);
    hello.set_role(pb::WORKER);
    Notify(node::MakeMeta(pb::HELLO, pb::WORKER, -1), node::ToBuffer(hello));
  }

 private:
  comm::EventLoop loop_;
  std::unique_ptr<comm::Messenger> messenger_;
  comm::ConnId conn_ = 0;
};

// A messenger listening on an ephemeral port of 127.0.0.1, on its own loop: every request
// goes to `on_request` on that loop, which answers through messenger(). Declare it after
// whatever the handler uses, so it stops first.
class RawListener {
 public:
  using Handler = std::function<void(comm::ConnId, comm::Frame&&)>;
  explicit RawListener(Handler on_request) : loop_("fake-sched") {
    comm::Messenger::Handlers h;
    h.on_request = std::move(on_request);
    messenger_ = std::make_unique<comm::Messenger>(&loop_, comm::TransportOptions(), h);
    REQUIRE(loop_.Start().ok());
    Result<int> port = Status(Code::kInternal, "not listening");
    loop_.RunAndWait([&] { port = messenger_->transport().Listen("127.0.0.1", 0); });
    REQUIRE(port.ok());
    port_ = *port;
  }
  ~RawListener() {
    loop_.RunAndWait([this] { messenger_->Shutdown(); });
    loop_.Stop().IgnoreError();
  }
  RawListener(const RawListener&) = delete;
  RawListener& operator=(const RawListener&) = delete;

  int port() const { return port_; }
  comm::Messenger& messenger() { return *messenger_; }  // on the loop only

 private:
  comm::EventLoop loop_;
  std::unique_ptr<comm::Messenger> messenger_;
  int port_ = 0;
};

}  // namespace pscore::testing
