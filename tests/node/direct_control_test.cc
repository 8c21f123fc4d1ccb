// Blocking coordination calls over the direct link (pscore/node/common/direct_control.h):
// DirectControl against a real scheduler (open, closed, a stale session, an interrupted
// call, the token handshake), and through nodes (the same answers as the loop's way, the
// order after an asynchronous call, Stop while a call waits).
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pscore/core/cluster_manager.h"
#include "pscore/node/common/direct_control.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/worker/worker_node.h"
#include "node/test_options.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;

SchedulerOptions Sched(int workers, const std::string& token = "") {
  SchedulerOptions o;
  o.worker_num = workers;
  o.server_num = 0;
  o.heartbeat_interval = 100ms;
  o.heartbeat_timeout = 5s;
  o.cluster_token = token;
  return o;
}

NodeOptions Member(int sched_port, const std::string& id, const std::string& token = "") {
  NodeOptions o = testing::TestWorkerOptions(sched_port, id);
  o.cluster_token = token;
  return o;
}

BufferPtr Kv(pb::KvRequest::Op op, const std::string& key, const std::string& value = "", int64_t timeout_ms = 0) {
  return testing::KvPayload(op, key, value, timeout_ms);
}

// A scheduler for one worker, and the options of that worker, w0.
struct OneWorker {
  explicit OneWorker(const std::string& token = "") : sched(Sched(1, token)) {
    REQUIRE(sched.Start().ok());
    options = Member(sched.port(), "w0", token);
  }
  ~OneWorker() { sched.Stop(); }
  SchedulerNode sched;
  NodeOptions options;
};

std::string ValueOf(const Result<comm::Frame>& answer) {
  REQUIRE(answer.ok());
  pb::KvResponse resp;
  REQUIRE(ParsePayload(*answer, &resp).ok());
  return resp.value();
}

TEST_CASE("direct control: closed until opened - answers, the scheduler's errors, a stale session left to the loop",
          "[node][net][coord]") {
  OneWorker f;
  DirectControl direct(f.options);

  CHECK_FALSE(direct.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::SET, "k", "v"), 5s).has_value());
  direct.Open(MakeMeta(pb::KV_REQUEST, pb::WORKER, 0));
  auto set = direct.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::SET, "k", "v"), 5s);
  REQUIRE(set.has_value());
  CHECK(set->ok());
  auto got = direct.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::TRY_GET, "k"), 5s);
  REQUIRE(got.has_value());
  CHECK(ValueOf(*got) == "v");
  // An error the scheduler answers is the call's answer.
  auto missing = direct.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::TRY_GET, "missing"), 5s);
  REQUIRE(missing.has_value());
  CHECK(missing->status().code() == Code::kNotFound);
  CHECK(direct.calls() == 3);

  // Under a session the scheduler does not know, nothing is done; the refusal names the
  // session the call carried (the node registers again and re-issues the loop's way).
  pb::MessageMeta stale = MakeMeta(pb::KV_REQUEST, pb::WORKER, 0);
  stale.set_session_id(0x5eed);
  direct.Open(stale);
  uint64_t carried = 0;
  auto refused = direct.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::SET, "k", "w"), 5s, &carried);
  REQUIRE(refused.has_value());
  CHECK(core::IsStaleSession(refused->status()));
  CHECK(carried == 0x5eed);
  direct.Open(MakeMeta(pb::KV_REQUEST, pb::WORKER, 0));
  CHECK(ValueOf(*direct.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::TRY_GET, "k"), 5s)) == "v");

  direct.Close("test");
  CHECK_FALSE(direct.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::TRY_GET, "k"), 5s).has_value());
  direct.Stop();
  direct.Open(MakeMeta(pb::KV_REQUEST, pb::WORKER, 0));  // never again after Stop
  CHECK_FALSE(direct.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::TRY_GET, "k"), 5s).has_value());
  CHECK(direct.calls() == 5);
}

TEST_CASE("direct control: Close ends a call waiting on the link at once - the next caller after Open gets a new one",
          "[node][net][coord]") {
  OneWorker f;
  DirectControl direct(f.options);
  direct.Open(MakeMeta(pb::KV_REQUEST, pb::WORKER, 0));
  // A GET of a key nobody sets waits at the scheduler for 30 s.
  auto waiting = std::async(std::launch::async, [&] {
    return direct.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::GET, "never", "", 30000), 32s);
  });
  CHECK(waiting.wait_for(300ms) == std::future_status::timeout);
  // The one link is out with that caller: another goes the loop's way.
  CHECK_FALSE(direct.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::TRY_GET, "k"), 5s).has_value());
  const auto t0 = std::chrono::steady_clock::now();
  direct.Close("the scheduler link was lost");
  REQUIRE(waiting.wait_for(5s) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK_FALSE(waiting.get().has_value());  // interrupted: the loop's way sends it again
  direct.Open(MakeMeta(pb::KV_REQUEST, pb::WORKER, 0));
  auto again = direct.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::SET, "k", "v"), 5s);
  REQUIRE(again.has_value());
  CHECK(again->ok());
  direct.Stop();
}

TEST_CASE("direct control: with a cluster token the link passes the handshake - a wrong token goes the loop's way",
          "[node][net][coord]") {
  OneWorker f("s3cret");
  DirectControl direct(f.options);
  direct.Open(MakeMeta(pb::KV_REQUEST, pb::WORKER, 0));
  auto set = direct.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::SET, "k", "v"), 5s);
  REQUIRE(set.has_value());
  CHECK(set->ok());
  NodeOptions bad = Member(f.sched.port(), "w1", "wrong");
  DirectControl refused(bad);
  refused.Open(MakeMeta(pb::KV_REQUEST, pb::WORKER, 0));
  CHECK_FALSE(refused.TryCall(pb::KV_REQUEST, Kv(pb::KvRequest::TRY_GET, "k"), 5s).has_value());
  CHECK(refused.calls() == 0);
  direct.Stop();
  refused.Stop();
}

// Two workers: w0 with the direct way, w1 with every call through its loop.
struct TwoWorkers {
  explicit TwoWorkers(const std::string& token = "") : sched(Sched(2, token)) {
    REQUIRE(sched.Start().ok());
    NodeOptions direct = Member(sched.port(), "w0", token);
    NodeOptions via_loop = Member(sched.port(), "w1", token);
    via_loop.direct_control_calls = false;
    nodes.push_back(std::make_unique<WorkerNode>(direct));
    nodes.push_back(std::make_unique<WorkerNode>(via_loop));
    for (auto& n : nodes) REQUIRE(n->Start().ok());
    for (auto& n : nodes) REQUIRE(n->WaitForReady(20s).ok());
  }
  ~TwoWorkers() {
    for (auto& n : nodes) n->Stop();
    sched.Stop();
  }
  SchedulerNode sched;
  std::vector<std::unique_ptr<WorkerNode>> nodes;
};

TEST_CASE("direct control through nodes: blocking KV and barriers go direct with the loop's answers - off keeps them on the loop",
          "[node][net][coord]") {
  TwoWorkers c;
  WorkerNode &a = *c.nodes[0], &b = *c.nodes[1];
  const uint64_t before = a.direct_control_calls();
  REQUIRE(a.KvSet("conf/x", "1").ok());
  CHECK(b.KvGet("conf/x", 1s).value() == "1");
  REQUIRE(b.KvSet("conf/y", "2").ok());
  CHECK(a.KvGet("conf/y", 1s).value() == "2");
  CHECK(a.KvTryGet("missing").status().code() == Code::kNotFound);
  CHECK(b.KvTryGet("missing").status().code() == Code::kNotFound);
  CHECK(a.KvGet("never", 100ms).status().code() == Code::kTimeout);
  auto listed = a.KvList("conf");
  REQUIRE(listed.ok());
  CHECK(listed->size() == 2);
  // Both reach the same barrier rounds, one each way.
  for (int round = 0; round < 5; ++round) {
    auto other = std::async(std::launch::async, [&] { return b.Barrier("sync", 10s); });
    CHECK(a.Barrier("sync", 10s).ok());
    CHECK(other.get().ok());
  }
  REQUIRE(a.KvDelete("conf/x").ok());
  CHECK(b.KvTryGet("conf/x").status().code() == Code::kNotFound);
  // Every call of w0 above went direct (set, get, try-get, get timeout, list, 5 barriers,
  // delete); w1's went through its loop.
  CHECK(a.direct_control_calls() - before == 11);
  CHECK(b.direct_control_calls() == 0);
}

TEST_CASE("direct control through nodes: a blocking call after an asynchronous one of its thread sees it",
          "[node][net][coord]") {
  TwoWorkers c;
  WorkerNode& a = *c.nodes[0];
  for (int i = 0; i < 300; ++i) {
    // Not waited for: the blocking read right after must still come after it.
    a.KvSetAsync("order", std::to_string(i), true, [](Status) {});
    Result<std::string> got = a.KvTryGet("order");
    REQUIRE(got.ok());
    REQUIRE(*got == std::to_string(i));
  }
}

TEST_CASE("direct control through nodes: Stop ends a blocking GET waiting on the direct link at once",
          "[node][net][coord]") {
  TwoWorkers c;
  WorkerNode& a = *c.nodes[0];
  REQUIRE(a.KvSet("warm", "1").ok());  // the direct link is open and idle
  const uint64_t before = a.direct_control_calls();
  auto waiting = std::async(std::launch::async, [&] { return a.KvGet("never/set", 30s); });
  CHECK(waiting.wait_for(300ms) == std::future_status::timeout);
  const auto t0 = std::chrono::steady_clock::now();
  a.Stop();
  REQUIRE(waiting.wait_for(5s) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(waiting.get().status().code() == Code::kCancelled);
  CHECK(a.direct_control_calls() == before);  // the waiting call was not answered directly
}

}  // namespace
}  // namespace pscore::node
