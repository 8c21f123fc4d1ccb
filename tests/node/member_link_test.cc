// A server serves data only to members of the job, and the scheduler's broadcast of a new
// membership may reach a worker before the server: a HELLO from a node the server's
// metadata does not list yet is held (its frames queued) until the metadata lists it, and
// refused, frames answered with the reason, when the hold ends.
#include <future>
#include <memory>

#include "pscore/core/kv_codec.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"

#include "node/raw_link.h"  // last: pulls in Catch

namespace pscore::node {
namespace {

using namespace std::chrono_literals;

// A bare link to a server that says HELLO as `node_id`.
class RawPeer : public testing::RawLink {
 public:
  RawPeer(int port, const std::string& node_id) : RawLink(port, "raw-peer") { HelloAsWorker(node_id); }
  // Sends a push of 3.0 to key 1 now; the future gets the answer.
  std::future<Result<comm::Frame>> Push() {
    const uint64_t key = 1;
    const uint32_t len = 1;
    const float value = 3.0f;
    pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::WORKER, -1);
    meta.set_handler(kPushHandler);
    return CallAsync(meta, core::EncodeKvPairs(&key, 1, &len, &value, 1), 10s);
  }
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
  std::future<Result<comm::Frame>> push = early.Push();
  CHECK(push.wait_for(100ms) == std::future_status::timeout);
  WorkerNode worker(Opts(pb::WORKER, sched.port(), "w0"));
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(10s).ok());
  REQUIRE(push.wait_for(10s) == std::future_status::ready);
  CHECK(push.get().status().ok());
  auto pull = worker.Pull({1});
  REQUIRE(pull.wait_for(10s) == std::future_status::ready);
  Result<PullResult> r = pull.get();
  REQUIRE(r.ok());
  CHECK(r->values == std::vector<float>{3.0f});

  // A node that never joins: held for the hold time, then refused with the reason.
  RawPeer stranger(server.listen_port(), "stranger");
  const auto t0 = std::chrono::steady_clock::now();
  std::future<Result<comm::Frame>> refused = stranger.Push();
  REQUIRE(refused.wait_for(10s) == std::future_status::ready);
  Status st = refused.get().status();
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
