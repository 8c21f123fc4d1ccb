// A server serves data only to members of the job, and the scheduler's broadcast of a new
// membership may reach a worker before the server: a HELLO from a node the server's
// metadata does not list yet is held (its frames queued) until the metadata lists it, and
// refused, frames answered with the reason, when the hold ends.
#include <future>
#include <memory>

#include "comm/messenger.h"
#include "core/kv_codec.h"
#include "node/scheduler_node.h"
#include "node/server_node.h"
#include "node/wire.h"
#include "node/worker_node.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;

// A bare link to a server: says HELLO as `node_id`, then sends one push of key 1.
class RawPeer {
 public:
  RawPeer(int port, const std::string& node_id) : loop_("raw-peer") {
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
    pb::HelloMessage hello;
    hello.set_node_id(node_id);
    hello.set_role(pb::WORKER);
    loop_.Post([this, hello] {
      messenger_->Notify(conn_, MakeMeta(pb::HELLO, pb::WORKER, -1), ToBuffer(hello)).IgnoreError();
    });
  }
  ~RawPeer() {
    std::promise<void> done;
    loop_.Post([this, &done] {
      messenger_->Shutdown();
      done.set_value();
    });
    if (done.get_future().wait_for(15s) != std::future_status::ready) FAIL("raw peer loop did not shut down");
    loop_.Stop().IgnoreError();
  }
  // Sends the push now; the future gets the answer's status.
  std::future<Status> Push() {
    auto promise = std::make_shared<std::promise<Status>>();
    auto fut = promise->get_future();
    const uint64_t key = 1;
    const uint32_t len = 1;
    const float value = 3.0f;
    BufferPtr payload = core::EncodeKvPairs(&key, 1, &len, &value, 1);
    loop_.Post([this, payload, promise] {
      pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::WORKER, -1);
      meta.set_handler(kPushHandler);
      messenger_->Call(conn_, meta, payload, 10s, [promise](Result<comm::Frame> r) { promise->set_value(r.status()); });
    });
    return fut;
  }

 private:
  comm::EventLoop loop_;
  std::unique_ptr<comm::Messenger> messenger_;
  comm::ConnId conn_ = 0;
};

NodeOptions Opts(pb::NodeRole role, int port, const std::string& id) {
  NodeOptions o;
  o.role = role;
  o.scheduler_port = port;
  o.node_id = id;
  o.heartbeat_interval = 500ms;  // the server holds an unknown HELLO for 1 s
  o.connect_timeout = 10s;
  return o;
}

}  // namespace

TEST_CASE("a HELLO from a node the server's metadata does not list yet is held until it does",
          "[node][net][dataplane]") {
  SchedulerOptions so;
  so.worker_num = 1;
  so.server_num = 1;
  so.heartbeat_interval = 500ms;
  SchedulerNode sched(so);
  REQUIRE(sched.Start().ok());
  ServerNode server(Opts(pb::SERVER, sched.port(), "s0"));
  REQUIRE(server.Start().ok());

  // w0's link says HELLO and pushes before w0 has even registered: the server has no
  // metadata listing it, so it holds the link and the push.
  RawPeer early(server.listen_port(), "w0");
  std::future<Status> push = early.Push();
  CHECK(push.wait_for(100ms) == std::future_status::timeout);
  WorkerNode worker(Opts(pb::WORKER, sched.port(), "w0"));
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(10s).ok());
  REQUIRE(push.wait_for(10s) == std::future_status::ready);
  CHECK(push.get().ok());
  auto pull = worker.Pull({1});
  REQUIRE(pull.wait_for(10s) == std::future_status::ready);
  Result<PullResult> r = pull.get();
  REQUIRE(r.ok());
  CHECK(r->values == std::vector<float>{3.0f});

  // A node that never joins: held for the hold time, then refused with the reason.
  RawPeer stranger(server.listen_port(), "stranger");
  const auto t0 = std::chrono::steady_clock::now();
  std::future<Status> refused = stranger.Push();
  REQUIRE(refused.wait_for(10s) == std::future_status::ready);
  Status st = refused.get();
  CHECK(std::chrono::steady_clock::now() - t0 >= 900ms);
  CHECK(st.code() == Code::kPermissionDenied);
  CHECK_THAT(st.message(), Catch::Contains("not a member"));
  auto again = worker.Pull({1});  // the job is intact
  REQUIRE(again.wait_for(10s) == std::future_status::ready);
  CHECK(again.get().ok());

  worker.Stop();
  server.Stop();
  sched.Stop();
}

}  // namespace pscore::node
