// A job's outcome as the members and the admin surface see it, in one process: a worker
// that stops without finishing fails the job; the survivors' FINISH and termination say
// so, naming it, and the admin status and /v1/cluster report it after the exit.
#include <sys/socket.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pscore/node/common/node.h"
#include "pscore/node/scheduler/ranktable_hub.h"
#include "pscore/node/scheduler/scheduler_http.h"
#include "pscore/node/scheduler/scheduler_node.h"

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

}  // namespace pscore::node
