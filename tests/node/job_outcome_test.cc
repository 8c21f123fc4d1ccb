// A job's outcome as the members and the admin surface see it, in one process: a worker
// that stops without finishing fails the job; the survivors' FINISH and termination say
// so, naming it, and the admin status and /v1/cluster report it after the exit.
#include <sys/socket.h>

#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "pscore/node/common/node.h"
#include "pscore/node/scheduler/ranktable_hub.h"
#include "pscore/node/scheduler/scheduler_http.h"
#include "pscore/node/scheduler/scheduler_node.h"

#include "node/raw_link.h"
#include "comm/test_util.h"  // last: Catch's CHECK wins over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;
using comm::testing::RawSocket;

SchedulerOptions SchedOpts() {
  SchedulerOptions o;
  o.worker_num = 2;
  o.server_num = 1;
  o.heartbeat_interval = 50ms;
  o.heartbeat_timeout = 500ms;
  return o;
}

NodeOptions Opts(pb::NodeRole role, int sched_port, std::string id) {
  NodeOptions o;
  o.role = role;
  o.scheduler_port = sched_port;
  o.node_id = std::move(id);
  o.heartbeat_interval = 50ms;
  o.connect_timeout = 5s;
  return o;
}

// A member spoken by hand: registers as worker `id` (incarnation 7) and then says nothing.
struct RawWorker {
  RawWorker(int port, const std::string& id) : link(std::make_unique<pscore::testing::RawLink>(port, "raw-" + id)) {
    reg.set_ip("127.0.0.1");
    reg.set_port(1);
    reg.set_node_id(id);
    reg.set_role(pb::WORKER);
    reg.set_incarnation(7);
    reg.set_protocol_version(kProtocolVersion);
    reg.set_requested_rank(-1);
  }
  Status Register() { return link->Call(pb::REGISTER, reg).status(); }
  std::unique_ptr<pscore::testing::RawLink> link;
  pb::RegisterMessage reg;
};

Status AdminStop(int port) {
  pscore::testing::RawLink admin(port, "raw-admin");
  pb::AdminRequest req;
  req.set_op("stop");
  return admin.Call(pb::ADMIN, req).status();
}

// GET over a fresh connection; the body of the answer ("" if none within 5 s).
std::string HttpGet(int port, const std::string& target) {
  RawSocket s;
  if (!s.Connect(port)) return "";
  if (!s.SendAll("GET " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) return "";
  std::string all;
  char buf[4096];
  for (;;) {
    ssize_t r = ::recv(s.fd(), buf, sizeof(buf), 0);
    if (r <= 0) break;
    all.append(buf, static_cast<size_t>(r));
  }
  const size_t split = all.find("\r\n\r\n");
  return split == std::string::npos ? "" : all.substr(split + 4);
}

pb::AdminResponse AdminStatus(SchedulerNode& sched) {
  auto done = std::make_shared<std::promise<pb::AdminResponse>>();
  pb::AdminRequest req;
  req.set_op("status");
  REQUIRE(sched.loop()->Run(
      [&sched, req, done] { sched.Admin(req, [done](Status, pb::AdminResponse r) { done->set_value(r); }); }));
  auto fut = done->get_future();
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  return fut.get();
}

}  // namespace

TEST_CASE("a worker lost before finishing fails the job: FINISH, termination, admin status and HTTP say so",
          "[node][net][outcome]") {
  SchedulerNode sched(SchedOpts());
  REQUIRE(sched.Start().ok());
  RankTableHub hub(&sched);
  SchedulerHttp http(&sched, &hub);
  REQUIRE(hub.Start().ok());
  Result<int> http_port = http.Start("127.0.0.1", 0);
  REQUIRE(http_port.ok());

  Node s0(Opts(pb::SERVER, sched.port(), "s0"), nullptr);
  Node w0(Opts(pb::WORKER, sched.port(), "w0"), nullptr);
  Node w1(Opts(pb::WORKER, sched.port(), "w1"), nullptr);
  for (Node* n : {&s0, &w0, &w1}) REQUIRE(n->Start().ok());
  for (Node* n : {&s0, &w0, &w1}) REQUIRE(n->WaitForReady(10s).ok());
  CHECK(AdminStatus(sched).job_result() == "running");

  auto f0 = std::async(std::launch::async, [&] { return s0.Finish(10s); });
  auto f1 = std::async(std::launch::async, [&] { return w0.Finish(10s); });
  w1.Stop();  // dies without finishing: silent from now on

  for (auto* f : {&f0, &f1}) {
    Status st = f->get();
    CHECK(st.code() == Code::kAborted);
    CHECK_THAT(st.message(), Catch::StartsWith("job failed: worker w1 lost (no heartbeat for "));
  }
  REQUIRE(sched.WaitForExit(5s).ok());
  for (Node* n : {&s0, &w0}) {
    Status end = n->WaitForTermination(5s);
    CHECK(end.code() == Code::kAborted);
    CHECK_THAT(end.message(), Catch::StartsWith("job failed: worker w1 lost (no heartbeat for "));
  }
  const core::JobOutcome outcome = sched.outcome();
  CHECK(outcome.result == core::JobOutcome::Result::kFailed);
  CHECK(outcome.failed_nodes == std::vector<std::string>{"w1"});

  const pb::AdminResponse status = AdminStatus(sched);
  CHECK(status.job_result() == "failed");
  CHECK_THAT(status.job_failure(), Catch::StartsWith("worker w1 lost (no heartbeat for "));
  REQUIRE(status.failed_nodes_size() == 1);
  CHECK(status.failed_nodes(0) == "w1");

  nlohmann::json j = nlohmann::json::parse(HttpGet(*http_port, "/v1/cluster"), nullptr, false);
  REQUIRE(j.is_object());
  CHECK(j["data"]["job_result"] == "failed");
  CHECK(j["data"]["failed_nodes"] == nlohmann::json::array({"w1"}));
  CHECK(j["data"]["job_failure"].get<std::string>().find("worker w1 lost") == 0);

  for (Node* n : {&s0, &w0}) n->Stop();
  http.Stop();
  hub.Stop();
  sched.Stop();
}

TEST_CASE("a job every node finishes ends finished everywhere", "[node][net][outcome]") {
  SchedulerNode sched(SchedOpts());
  REQUIRE(sched.Start().ok());
  Node s0(Opts(pb::SERVER, sched.port(), "s0"), nullptr);
  Node w0(Opts(pb::WORKER, sched.port(), "w0"), nullptr);
  Node w1(Opts(pb::WORKER, sched.port(), "w1"), nullptr);
  for (Node* n : {&s0, &w0, &w1}) REQUIRE(n->Start().ok());
  std::vector<std::future<Status>> finishes;
  for (Node* n : {&s0, &w0, &w1}) {
    finishes.push_back(std::async(std::launch::async, [n] {
      Status ready = n->WaitForReady(10s);
      return ready.ok() ? n->Finish(10s) : ready;
    }));
  }
  for (auto& f : finishes) CHECK(f.get().ok());
  REQUIRE(sched.WaitForExit(5s).ok());
  for (Node* n : {&s0, &w0, &w1}) CHECK(n->WaitForTermination(5s).ok());
  CHECK(sched.outcome().result == core::JobOutcome::Result::kFinished);
  CHECK(AdminStatus(sched).job_result() == "finished");
  for (Node* n : {&s0, &w0, &w1}) n->Stop();
  sched.Stop();
}

// w0 a member that beats; w1 registered by hand, silent past half the heartbeat timeout
// (4 s), then its link closes: a link that died quietly, as one its member gave up while
// the network was cut. Then the job is stopped, before w1 would time out.
struct QuietLinkJob {
  QuietLinkJob() {
    so.server_num = 0;
    so.heartbeat_timeout = 4s;
    sched = std::make_unique<SchedulerNode>(so);
    REQUIRE(sched->Start().ok());
    w0 = std::make_unique<Node>(Opts(pb::WORKER, sched->port(), "w0"), nullptr);
    REQUIRE(w0->Start().ok());
    w1 = std::make_unique<RawWorker>(sched->port(), "w1");
    REQUIRE(w1->Register().ok());
    REQUIRE(w0->WaitForReady(10s).ok());
    std::this_thread::sleep_for(2200ms);
    w1->link.reset();
    REQUIRE(AdminStop(sched->port()).ok());
  }
  ~QuietLinkJob() {
    w0->Stop();
    sched->Stop();
  }
  SchedulerOptions so = SchedOpts();
  std::unique_ptr<SchedulerNode> sched;
  std::unique_ptr<Node> w0;
  std::unique_ptr<RawWorker> w1;
};

TEST_CASE("a member whose link died quietly before the job ended is told when it comes back - the scheduler waits "
          "for it",
          "[node][net][outcome]") {
  QuietLinkJob job;
  CHECK(job.w0->WaitForTermination(5s).ok());
  CHECK_FALSE(job.sched->WaitForExit(500ms).ok());  // waiting for w1 (at most 3 heartbeat timeouts)
  CHECK(job.sched->cluster_state() == pb::CLUSTER_EXIT);
  job.w1->link = std::make_unique<pscore::testing::RawLink>(job.sched->port(), "raw-w1-again");
  Status again = job.w1->Register();
  CHECK(again.code() == Code::kFailedPrecondition);
  CHECK_THAT(again.message(), Catch::Contains("the job has ended"));
  CHECK(job.sched->WaitForExit(5s).ok());
}

TEST_CASE("a member whose link died quietly before the job ended and that never comes back - the scheduler exits "
          "after 3 heartbeat timeouts",
          "[node][net][outcome]") {
  QuietLinkJob job;
  CHECK_FALSE(job.sched->WaitForExit(1s).ok());
  CHECK(job.sched->WaitForExit(20s).ok());
}

// w1 beats once an hour: its link is up but has been quiet past half the heartbeat timeout
// when the job is stopped, so the scheduler cannot tell whether the end reached it. w1
// acknowledges the TERMINATE with a last heartbeat; the scheduler exits on it instead of
// waiting 3 heartbeat timeouts (12 s).
TEST_CASE("a member whose link was quiet when the job ended acknowledges the end - the scheduler exits without "
          "waiting",
          "[node][net][outcome]") {
  SchedulerOptions so = SchedOpts();
  so.server_num = 0;
  so.heartbeat_timeout = 4s;
  SchedulerNode sched(so);
  REQUIRE(sched.Start().ok());
  Node w0(Opts(pb::WORKER, sched.port(), "w0"), nullptr);
  NodeOptions quiet = Opts(pb::WORKER, sched.port(), "w1");
  quiet.heartbeat_interval = 1h;
  Node w1(quiet, nullptr);
  for (Node* n : {&w0, &w1}) REQUIRE(n->Start().ok());
  for (Node* n : {&w0, &w1}) REQUIRE(n->WaitForReady(10s).ok());
  std::this_thread::sleep_for(2200ms);
  REQUIRE(AdminStop(sched.port()).ok());
  for (Node* n : {&w0, &w1}) CHECK(n->WaitForTermination(5s).ok());
  CHECK(sched.WaitForExit(3s).ok());
  CHECK(sched.outcome().result == core::JobOutcome::Result::kStopped);
  for (Node* n : {&w0, &w1}) n->Stop();
  sched.Stop();
}

TEST_CASE("a member that closed a live link before the job ended left by choice - the scheduler does not wait for it",
          "[node][net][outcome]") {
  SchedulerOptions so = SchedOpts();
  so.server_num = 0;
  so.heartbeat_timeout = 20s;
  SchedulerNode sched(so);
  REQUIRE(sched.Start().ok());
  Node w0(Opts(pb::WORKER, sched.port(), "w0"), nullptr);
  REQUIRE(w0.Start().ok());
  RawWorker w1(sched.port(), "w1");
  REQUIRE(w1.Register().ok());
  w1.link.reset();  // just heard on: a close by choice
  REQUIRE(AdminStop(sched.port()).ok());
  CHECK(sched.WaitForExit(5s).ok());
  w0.Stop();
  sched.Stop();
}

}  // namespace pscore::node
