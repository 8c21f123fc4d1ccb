// A job with TLS on every link, in process: members register under the node id their
// certificate names; a member claiming another node id with a valid certificate is
// refused at REGISTER (permission_denied), and so is a HELLO to a server naming another
// member; the job finishes unaffected. Admin commands need a certificate whose CN the
// scheduler lists (SchedulerOptions::tls_admin_cns): a member's gets only "status".
#include <future>
#include <set>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/node/common/admin_client.h"
#include "pscore/node/common/node.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "comm/tls_pki.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;

NodeOptions Opts(pb::NodeRole role, int sched_port, std::string id, std::shared_ptr<comm::TlsContext> tls) {
  NodeOptions o;
  o.role = role;
  o.scheduler_port = sched_port;
  o.node_id = std::move(id);
  o.heartbeat_interval = 50ms;
  o.connect_timeout = 5s;
  o.tls = std::move(tls);
  return o;
}

}  // namespace

TEST_CASE("tls: members register under their certificate's name and an impostor is refused while the job finishes",
          "[node][net][tls]") {
  comm::testing::TestPki pki;
  SchedulerOptions so;
  so.worker_num = 1;
  so.server_num = 1;
  so.heartbeat_interval = 50ms;
  so.heartbeat_timeout = 2s;
  so.tls = pki.Context("scheduler", "scheduler");
  SchedulerNode sched(so);
  REQUIRE(sched.Start().ok());
  auto server_tls = pki.Context("s0", "s0");
  ServerNode server(Opts(pb::SERVER, sched.port(), "s0", server_tls));
  Node worker(Opts(pb::WORKER, sched.port(), "w0", pki.Context("w0", "w0")), nullptr);
  REQUIRE(server.Start().ok());
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(10s).ok());
  REQUIRE(server.WaitForReady(10s).ok());

  // s0's certificate, another node's id.
  Node impostor(Opts(pb::SERVER, sched.port(), "s9", server_tls), nullptr);
  Status st = impostor.Start();
  CHECK(st.code() == Code::kPermissionDenied);
  CHECK_THAT(st.message(), Catch::Contains("does not match the TLS certificate") && Catch::Contains("CN=s0"));
  impostor.Stop();

  // w0's certificate, a HELLO to the server naming s0: refused.
  {
    comm::EventLoop loop("hello-client");
    REQUIRE(loop.Start().ok());
    comm::TransportOptions to;
    to.tls = pki.Context("w0b", "w0");
    comm::Messenger client(&loop, to, comm::Messenger::Handlers());
    auto answer = std::make_shared<std::promise<Status>>();
    loop.Post([&, answer] {
      client.transport().Connect("127.0.0.1", server.listen_port(), comm::ConnectOptions(), [&, answer](Result<comm::ConnId> c) {
        if (!c.ok()) return answer->set_value(c.status());
        pb::HelloMessage hello;
        hello.set_node_id("s0");
        hello.set_role(pb::SERVER);
        client.Call(*c, MakeMeta(pb::HELLO, pb::SERVER, 0), ToBuffer(hello), 5s,
                    [answer](Result<comm::Frame> r) { answer->set_value(r.status()); });
      });
    });
    auto f = answer->get_future();
    REQUIRE(f.wait_for(20s) == std::future_status::ready);
    Status hs = f.get();
    CHECK(hs.code() == Code::kPermissionDenied);
    CHECK_THAT(hs.message(), Catch::Contains("does not match the TLS certificate (CN=w0)"));
    REQUIRE(loop.Stop().ok());
  }

  // The members still talk through the scheduler: a KV round trip over TLS.
  REQUIRE(worker.KvSet("tls/key", std::string(100000, 'v')).ok());
  Result<std::string> back = server.KvGet("tls/key", 5s);
  REQUIRE(back.ok());
  CHECK(*back == std::string(100000, 'v'));
  CHECK(server.cluster_state() == pb::CLUSTER_READY);

  auto f1 = std::async(std::launch::async, [&] { return worker.Finish(10s); });
  auto f2 = std::async(std::launch::async, [&] { return server.Finish(10s); });
  CHECK(f1.get().ok());
  CHECK(f2.get().ok());
  CHECK(sched.WaitForExit(5s).ok());
  worker.Stop();
  server.Stop();
  sched.Stop();
}

TEST_CASE("tls: admin commands need a certificate named in tls_admin_cns - a member's certificate gets status only",
          "[node][net][tls]") {
  comm::testing::TestPki pki;
  SchedulerOptions so;
  so.worker_num = 1;
  so.server_num = 0;
  so.heartbeat_interval = 50ms;
  so.heartbeat_timeout = 2s;
  so.tls = pki.Context("scheduler", "scheduler");
  so.tls_admin_cns = {"admin", "ops"};
  SchedulerNode sched(so);
  REQUIRE(sched.Start().ok());
  Node worker(Opts(pb::WORKER, sched.port(), "w0", pki.Context("w0", "w0")), nullptr);
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(10s).ok());

  auto client = [&](const std::string& cn) {
    AdminClientOptions o;
    o.scheduler_port = sched.port();
    o.timeout = 5s;
    o.tls = pki.Context("client-" + cn, cn);
    return std::make_unique<AdminClient>(o);
  };
  // The member's own certificate: status is answered, every other command refused.
  auto member = client("w0");
  REQUIRE(member->Connect().ok());
  CHECK(member->Admin("status").ok());
  for (const std::string op : {"nodes", "barriers", "stop"}) {
    Result<pb::AdminResponse> r = member->Admin(op);
    INFO(op << ": " << r.status());
    CHECK(r.status().code() == Code::kPermissionDenied);
    CHECK_THAT(r.status().message(), Catch::Contains("admin '" + op + "' refused") && Catch::Contains("(CN=w0)") &&
                                         Catch::Contains("not an admin certificate (--tls_admin_cns=admin,ops)"));
  }
  CHECK(worker.cluster_state() == pb::CLUSTER_READY);  // the refused stop did nothing
  // The listed names are answered.
  for (const std::string cn : {"admin", "ops"}) {
    auto op = client(cn);
    REQUIRE(op->Connect().ok());
    Result<pb::AdminResponse> r = op->Admin("nodes");
    INFO(cn << ": " << r.status());
    REQUIRE(r.ok());
    CHECK(r->nodes_size() == 1);
  }
  auto admin = client("admin");
  REQUIRE(admin->Connect().ok());
  CHECK(admin->Admin("stop").ok());
  CHECK(sched.WaitForExit(10s).ok());
  worker.Stop();
  sched.Stop();
}

}  // namespace pscore::node
