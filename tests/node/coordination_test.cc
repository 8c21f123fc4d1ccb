// In-process coordination tests with real sockets (issue 6): the membership barrier,
// incarnations and the in-error policy, KV and barriers through nodes, error delivery
// (also to late joiners), the shutdown barrier, the device topology, and two stress runs
// (3 x 1,000 concurrent KvSet; 64 nodes x 100 barrier rounds).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <limits>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/frame.h"
#include "pscore/comm/messenger.h"
#include "pscore/core/state_file.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"

#include "node/raw_link.h"  // last: pulls in Catch

namespace pscore::node {
namespace {

using namespace std::chrono_literals;
using EventPred = std::function<bool(const pb::ClusterEventMessage&)>;

SchedulerOptions SchedOpts(int workers, int servers, Duration interval = 100ms, Duration timeout = 5s) {
  SchedulerOptions o;
  o.worker_num = workers;
  o.server_num = servers;
  o.heartbeat_interval = interval;
  o.heartbeat_timeout = timeout;
  return o;
}

NodeOptions MemberOpts(pb::NodeRole role, int sched_port, const std::string& id, Duration interval = 100ms) {
  NodeOptions o;
  o.role = role;
  o.scheduler_port = sched_port;
  o.node_id = id;
  o.heartbeat_interval = interval;
  o.connect_timeout = 10s;
  o.request_timeout = 10s;
  o.handler_threads = 0;
  return o;
}

// The cluster events one node heard (callbacks on its loop thread, reads on the test's).
class EventLog {
 public:
  void Add(const pb::ClusterEventMessage& ev) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(ev);
    cv_.notify_all();
  }
  bool WaitFor(const EventPred& pred, Duration timeout, pb::ClusterEventMessage* out = nullptr) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      for (const auto& ev : events_) {
        if (!pred(ev)) continue;
        if (out != nullptr) *out = ev;
        return true;
      }
      return false;
    });
  }
  int Count(const EventPred& pred) {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(std::count_if(events_.begin(), events_.end(), pred));
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<pb::ClusterEventMessage> events_;
};

EventPred Kind(pb::ClusterEventMessage::Kind kind, const std::string& node_id) {
  return [kind, node_id](const pb::ClusterEventMessage& ev) { return ev.kind() == kind && ev.node_id() == node_id; };
}

struct Member {
  std::unique_ptr<Node> node;
  EventLog events;
};

// A scheduler (on its own loop) and its members (each on its own loop, or all on
// `member_loop`); stops every member, then the scheduler, even when the test fails.
class TestCluster {
 public:
  explicit TestCluster(SchedulerOptions opts, comm::EventLoop* member_loop = nullptr)
      : loop_(member_loop), sched_(std::move(opts)) {
    REQUIRE(sched_.Start().ok());
  }
  ~TestCluster() {
    for (auto it = members_.rbegin(); it != members_.rend(); ++it) (*it)->node->Stop();
    sched_.Stop();
  }
  // Adds (does not start) a member; `tweak` may edit its options.
  Member& Add(pb::NodeRole role, const std::string& id, const std::function<void(NodeOptions&)>& tweak = {}) {
    NodeOptions o = MemberOpts(role, sched_.port(), id);
    if (tweak) tweak(o);
    auto m = std::make_unique<Member>();
    if (role == pb::SERVER) {
      m->node = std::make_unique<ServerNode>(o, core::ParamStore::Options(), loop_);
    } else {
      m->node = std::make_unique<WorkerNode>(o, loop_);
    }
    Member* raw = m.get();
    Node::Callbacks cb;
    cb.on_cluster_event = [raw](const pb::ClusterEventMessage& ev) { raw->events.Add(ev); };
    m->node->SetCallbacks(cb);
    members_.push_back(std::move(m));
    return *members_.back();
  }
  // Adds workers w0..w{n-1}, starts them and waits for READY.
  void StartWorkers(int n) {
    for (int i = 0; i < n; ++i) Add(pb::WORKER, "w" + std::to_string(i));
    for (auto& m : members_) REQUIRE(m->node->Start().ok());
    for (auto& m : members_) REQUIRE(m->node->WaitForReady(20s).ok());
  }
  Node& node(size_t i) { return *members_.at(i)->node; }
  Member& member(size_t i) { return *members_.at(i); }
  size_t size() const { return members_.size(); }
  SchedulerNode& sched() { return sched_; }

 private:
  comm::EventLoop* loop_;
  SchedulerNode sched_;
  std::vector<std::unique_ptr<Member>> members_;
};

// A bare protocol client on its own loop: registers with chosen incarnations and sends
// admin requests, which a Node cannot do.
class RawClient : public testing::RawLink {
 public:
  explicit RawClient(int port) : RawLink(port, "raw") {}
  Result<int> Register(const std::string& node_id, uint64_t incarnation) {
    pb::RegisterMessage msg;
    msg.set_ip("127.0.0.1");
    msg.set_port(1);
    msg.set_node_id(node_id);
    msg.set_role(pb::WORKER);
    msg.set_incarnation(incarnation);
    msg.set_protocol_version(node::kProtocolVersion);
    msg.set_requested_rank(-1);
    Result<comm::Frame> r = Call(pb::REGISTER, msg);
    pb::RegisterRespMessage resp;
    if (!r.ok()) return r.status();
    PSCORE_RETURN_IF_ERROR(ParsePayload(*r, &resp));
    return resp.rank_id();
  }
  Result<pb::AdminResponse> Admin(const std::string& op, std::vector<std::string> ids = {}) {
    pb::AdminRequest req;
    req.set_op(op);
    for (auto& id : ids) req.add_node_ids(id);
    Result<comm::Frame> r = Call(pb::ADMIN, req);
    if (!r.ok()) return r.status();
    pb::AdminResponse resp;
    PSCORE_RETURN_IF_ERROR(ParsePayload(*r, &resp));
    return resp;
  }
  // Waits until barrier `id`'s newest round has `arrived` arrivals (polling, with a deadline).
  bool WaitArrived(const std::string& id, int arrived) {
    for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;) {
      Result<pb::AdminResponse> r = Admin("barriers");
      for (int i = 0; r.ok() && i < r->barriers_size(); ++i) {
        const pb::BarrierInfo& b = r->barriers(i);
        if (b.id() == id && b.state() == "waiting" && b.arrived() >= arrived) return true;
      }
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
};

std::future<Status> BarrierAsync(Node& n, const std::string& id, Duration timeout,
                                 std::vector<std::string> participants = {}) {
  return std::async(std::launch::async, [&n, id, timeout, participants] {
    return n.Barrier(id, timeout, participants);
  });
}

// The status of a barrier call that must end long before its own deadline.
Status Soon(std::future<Status>& f) {
  if (f.wait_for(5s) != std::future_status::ready) return Status(Code::kTimeout, "still waiting");
  return f.get();
}

// The value of an asynchronous call's promise, or a test failure after 20 s.
template <typename T>
T Within20s(std::promise<T>& p) {
  std::future<T> f = p.get_future();
  if (f.wait_for(20s) != std::future_status::ready) FAIL("no callback within 20 s");
  return f.get();
}

// A value, or its error as text (so a failed call fails a comparison, not the process).
std::string Val(const Result<std::string>& r) { return r.ok() ? *r : "<" + r.status().ToString() + ">"; }

std::vector<std::string> Keys(const Result<std::vector<std::pair<std::string, std::string>>>& list) {
  std::vector<std::string> keys;
  if (!list.ok()) return {"<" + list.status().ToString() + ">"};
  for (auto& [k, v] : *list) keys.push_back(k);
  return keys;
}

}  // namespace

TEST_CASE("WaitForReady times out naming how many are missing - a late arrival in time is fine",
          "[node][net][coord]") {
  TestCluster c(SchedOpts(3, 0));
  c.Add(pb::WORKER, "w0");
  c.Add(pb::WORKER, "w1");
  Member& late = c.Add(pb::WORKER, "w2");
  REQUIRE(c.node(0).Start().ok());
  REQUIRE(c.node(1).Start().ok());
  Status st = c.node(0).WaitForReady(300ms);
  CHECK(st.code() == Code::kTimeout);
  CHECK_THAT(st.message(), Catch::Contains("1 node(s) missing") && Catch::Contains("1 workers"));
  auto waiting = std::async(std::launch::async, [&c] { return c.node(1).WaitForReady(20s); });
  std::this_thread::sleep_for(200ms);
  REQUIRE(late.node->Start().ok());
  REQUIRE(waiting.wait_for(20s) == std::future_status::ready);
  CHECK(waiting.get().ok());
  CHECK(c.node(0).WaitForReady(20s).ok());
  CHECK(late.node->WaitForReady(20s).ok());
}

TEST_CASE("incarnation: same one is a retry - a new one is an error the others hear of naming it - reset lets it in",
          "[node][net][coord][incarnation]") {
  TestCluster c(SchedOpts(3, 0, 100ms, 60s));  // the raw client never beats
  c.Add(pb::WORKER, "w0");
  c.Add(pb::WORKER, "w1");
  for (size_t i = 0; i < 2; ++i) REQUIRE(c.node(i).Start().ok());
  RawClient x(c.sched().port());
  Result<int> rank = x.Register("x", 100);
  REQUIRE(rank.ok());
  for (size_t i = 0; i < 2; ++i) REQUIRE(c.node(i).WaitForReady(20s).ok());

  // The same incarnation again: a harmless retry (same rank, nobody is told).
  Result<int> again = x.Register("x", 100);
  CHECK((again.ok() && *again == *rank));
  // A new incarnation: the old process's state is gone. Refused ABORTED, recorded in
  // error, and every other node hears NODE_ERROR naming x exactly once.
  Result<int> restarted = x.Register("x", 101);
  CHECK(restarted.status().code() == Code::kAborted);
  CHECK_THAT(restarted.status().message(), Catch::Contains("worker x restarted") && Catch::Contains("reset"));
  for (size_t i = 0; i < 2; ++i) {
    REQUIRE(c.member(i).events.WaitFor(Kind(pb::ClusterEventMessage::NODE_ERROR, "x"), 5s));
    CHECK(c.member(i).events.Count(Kind(pb::ClusterEventMessage::NODE_ERROR, "x")) == 1);
    CHECK(c.member(i).events.Count(Kind(pb::ClusterEventMessage::NODE_RESTARTED, "x")) == 0);
  }
  // In error: refused whatever the incarnation until a reset.
  Result<int> refused = x.Register("x", 101);
  CHECK(refused.status().code() == Code::kFailedPrecondition);
  CHECK_THAT(refused.status().message(), Catch::Contains("in error") && Catch::Contains("state of its old process is lost"));
  CHECK(x.Register("x", 100).status().code() == Code::kFailedPrecondition);
  CHECK(x.Admin("reset", {"nobody"}).status().code() == Code::kNotFound);
  REQUIRE(x.Admin("reset", {"x"}).ok());
  Result<int> back = x.Register("x", 101);
  REQUIRE(back.ok());
  CHECK(*back == *rank);
  for (size_t i = 0; i < 2; ++i) {
    REQUIRE(c.member(i).events.WaitFor(Kind(pb::ClusterEventMessage::NODE_RESTARTED, "x"), 5s));
  }

  // A reported error: the same incarnation is refused until reset.
  pb::ErrorReport err;
  err.set_node_id("x");
  err.set_error_code(9);
  err.set_message("device lost");
  REQUIRE(x.Call(pb::REPORT_ERROR, err).ok());
  Result<int> in_error = x.Register("x", 101);
  CHECK(in_error.status().code() == Code::kFailedPrecondition);
  CHECK_THAT(in_error.status().message(), Catch::Contains("device lost"));
  REQUIRE(x.Admin("reset", {"x"}).ok());
  CHECK(x.Register("x", 101).ok());
  Result<pb::AdminResponse> nodes = x.Admin("nodes");
  REQUIRE(nodes.ok());
  for (const pb::ServersMeta& m : nodes->nodes()) {
    if (m.node_id() == "x") CHECK(m.state() != pb::NODE_IN_ERROR);
  }
}

TEST_CASE("recoverable roles: a restart is admitted and heard as NODE_RESTARTED, errors stay with the member",
          "[node][net][coord][incarnation]") {
  SchedulerOptions so = SchedOpts(3, 0, 100ms, 60s);
  so.recoverable_roles = {pb::WORKER};
  TestCluster c(so);
  c.Add(pb::WORKER, "w0");
  c.Add(pb::WORKER, "w1");
  for (size_t i = 0; i < 2; ++i) REQUIRE(c.node(i).Start().ok());
  RawClient x(c.sched().port());
  REQUIRE(x.Register("x", 100).ok());
  for (size_t i = 0; i < 2; ++i) REQUIRE(c.node(i).WaitForReady(20s).ok());
  pb::ErrorReport err;
  err.set_node_id("x");
  err.set_error_code(9);
  err.set_message("device lost");
  REQUIRE(x.Call(pb::REPORT_ERROR, err).ok());
  // The others' barriers keep working meanwhile.
  std::future<Status> b0 = std::async(std::launch::async, [&] { return c.node(0).Barrier("pair", 20s, {"w0", "w1"}); });
  CHECK(c.node(1).Barrier("pair", 20s, {"w0", "w1"}).ok());
  CHECK(b0.get().ok());
  REQUIRE(x.Register("x", 101).ok());  // restarted: admitted at once
  for (size_t i = 0; i < 2; ++i) {
    REQUIRE(c.member(i).events.WaitFor(Kind(pb::ClusterEventMessage::NODE_RESTARTED, "x"), 5s));
    CHECK(c.member(i).events.Count(Kind(pb::ClusterEventMessage::NODE_ERROR, "x")) == 0);
  }
}

TEST_CASE("connect: protocol version mismatch refused naming both - heartbeats of a foreign incarnation or another link refused",
          "[node][net][coord][incarnation]") {
  TestCluster c(SchedOpts(2, 0, 100ms, 60s));  // the raw clients never beat on their own
  RawClient x(c.sched().port());
  pb::RegisterMessage reg;
  reg.set_ip("127.0.0.1");
  reg.set_port(1);
  reg.set_node_id("x");
  reg.set_role(pb::WORKER);
  reg.set_incarnation(7);
  reg.set_protocol_version(1);
  Result<comm::Frame> old = x.Call(pb::REGISTER, reg);
  REQUIRE_FALSE(old.ok());
  CHECK(old.status().code() == Code::kInvalidArgument);
  CHECK_THAT(old.status().message(), Catch::Contains("protocol version 1") &&
                                         Catch::Contains("version " + std::to_string(node::kProtocolVersion)));
  REQUIRE(x.Register("x", 7).ok());  // the same connection is still open

  pb::HeartbeatMessage hb;
  hb.set_node_id("x");
  hb.set_incarnation(7);
  CHECK(x.Call(pb::HEARTBEAT, hb).ok());
  hb.set_incarnation(8);
  Result<comm::Frame> foreign = x.Call(pb::HEARTBEAT, hb);
  REQUIRE_FALSE(foreign.ok());
  CHECK(foreign.status().code() == Code::kAborted);
  CHECK_THAT(foreign.status().message(), Catch::Contains("incarnation 8"));
  // Another connection does not take over x's live link, even with the right incarnation.
  RawClient y(c.sched().port());
  hb.set_incarnation(7);
  Result<comm::Frame> other = y.Call(pb::HEARTBEAT, hb);
  REQUIRE_FALSE(other.ok());
  CHECK(other.status().code() == Code::kFailedPrecondition);
  CHECK_THAT(other.status().message(), Catch::Contains("another connection"));
  CHECK(x.Call(pb::HEARTBEAT, hb).ok());
}

TEST_CASE("an unserved command number is named in the error - a peer that keeps sending them is disconnected",
          "[node][net][coord]") {
  TestCluster c(SchedOpts(1, 0));
  RawClient x(c.sched().port());
  auto unknown = [&x] {
    std::future<Result<comm::Frame>> f =
        x.CallAsync(MakeMeta(static_cast<pb::NodeCommand>(999), pb::WORKER, -1), nullptr, 5s);
    if (f.wait_for(10s) != std::future_status::ready) return Result<comm::Frame>(Status(Code::kTimeout, "no answer"));
    return f.get();
  };
  Result<comm::Frame> first = unknown();
  REQUIRE_FALSE(first.ok());
  CHECK(first.status().code() == Code::kInvalidArgument);
  CHECK_THAT(first.status().message(), Catch::Contains("command 999"));
  for (int i = 1; i < node::kMaxUnservedCommands; ++i) {
    Result<comm::Frame> again = unknown();
    CHECK(again.status().code() == Code::kInvalidArgument);
  }
  // The connection is closed now: the next call fails on the link, not with an answer.
  Result<comm::Frame> after = unknown();
  REQUIRE_FALSE(after.ok());
  CHECK(after.status().code() != Code::kInvalidArgument);
  pb::AdminRequest status;
  status.set_op("status");
  CHECK_FALSE(x.Call(pb::ADMIN, status).ok());
}

TEST_CASE("KV through nodes: set, overwrite, blocking get, timeout, try-get, sorted list, delete",
          "[node][net][coord]") {
  SchedulerOptions so = SchedOpts(3, 0);
  so.max_kv_value_bytes = 1024;
  TestCluster c(so);
  c.StartWorkers(3);
  Node &a = c.node(0), &b = c.node(1);

  REQUIRE(a.KvSet("job/conf", "1").ok());
  CHECK(Val(b.KvTryGet("/job//conf/")) == "1");  // normalised: same key
  Status exists = b.KvSet("job/conf", "2", /*overwrite=*/false);
  CHECK(exists.code() == Code::kAlreadyExists);
  CHECK(Val(a.KvTryGet("job/conf")) == "1");
  REQUIRE(b.KvSet("job/conf", "2").ok());
  CHECK(Val(a.KvGet("job/conf", 1s)) == "2");
  CHECK(a.KvSet("big", std::string(2000, 'x')).code() == Code::kInvalidArgument);
  CHECK(a.KvTryGet("missing").status().code() == Code::kNotFound);
  // A Get waiting on a missing key is answered by a later Set from another node; a
  // Delete in between does not disturb it.
  auto waiting = std::async(std::launch::async, [&b] { return b.KvGet("late/key", 20s); });
  std::this_thread::sleep_for(100ms);
  REQUIRE(a.KvDelete("late/key").ok());
  REQUIRE(c.node(2).KvSet("late/key", std::string("v\0w", 3)).ok());
  REQUIRE(waiting.wait_for(20s) == std::future_status::ready);
  CHECK(Val(waiting.get()) == std::string("v\0w", 3));
  Result<std::string> timed_out = a.KvGet("never", 200ms);
  CHECK(timed_out.status().code() == Code::kTimeout);
  CHECK_THAT(timed_out.status().message(), Catch::Contains("never"));
  for (const char* k : {"dir/b", "dir/a/2", "dir/a/1", "dir/c/x/y", "dirx", "dir", "dir!"}) {
    REQUIRE(a.KvSet(k, k).ok());
  }
  CHECK(Keys(b.KvList("dir")) == std::vector<std::string>{"dir/a/1", "dir/a/2", "dir/b", "dir/c/x/y"});
  REQUIRE(b.KvDelete("dir/a/").ok());  // the directory and everything under it
  CHECK(Keys(b.KvList("/dir/")) == std::vector<std::string>{"dir/b", "dir/c/x/y"});
  CHECK(Val(a.KvTryGet("dirx")) == "dirx");
  CHECK(a.KvDelete("no/such/key").ok());
}

TEST_CASE("KV through nodes: a store at its total cap refuses growth - a delete makes room", "[node][net][coord]") {
  SchedulerOptions so = SchedOpts(1, 0);
  so.max_kv_total_bytes = 4096;
  TestCluster c(so);
  c.StartWorkers(1);
  Node& a = c.node(0);
  for (const char* k : {"k1", "k2", "k3"}) REQUIRE(a.KvSet(k, std::string(1000, 'v')).ok());  // 3,006 bytes
  Status full = a.KvSet("k4", std::string(1100, 'v'));                                         // would be 4,108
  CHECK(full.code() == Code::kResourceExhausted);
  CHECK_THAT(full.message(), Catch::Contains("4096-byte cap"));
  CHECK(a.KvTryGet("k4").status().code() == Code::kNotFound);
  REQUIRE(a.KvDelete("k1").ok());
  REQUIRE(a.KvSet("k4", std::string(1100, 'v')).ok());
  CHECK(Val(a.KvTryGet("k4")) == std::string(1100, 'v'));
}

TEST_CASE("KV asynchronous calls: many in flight, chained from callbacks, the same answers and errors",
          "[node][net][coord]") {
  SchedulerOptions so = SchedOpts(2, 0);
  so.max_kv_value_bytes = 1024;
  TestCluster c(so);
  c.StartWorkers(2);
  Node &a = c.node(0), &b = c.node(1);

  // 200 sets in flight at once from this thread, each then read back from its callback
  // (on the loop thread) with a chained get.
  constexpr int kCalls = 200;
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::string> got(kCalls);
  std::vector<Status> errors;
  for (int i = 0; i < kCalls; ++i) {
    const std::string key = "async/k" + std::to_string(i);
    a.KvSetAsync(key, "v" + std::to_string(i), true, [&, key, i](Status st) {
      CHECK(a.loop()->InLoopThread());
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(st);
        ++finished;
        cv.notify_all();
        return;
      }
      a.KvTryGetAsync(key, [&, i](Result<std::string> r) {
        std::lock_guard<std::mutex> lock(mu);
        if (r.ok()) {
          got[i] = *r;
        } else {
          errors.push_back(r.status());
        }
        ++finished;
        cv.notify_all();
      });
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, 20s, [&] { return finished == kCalls; }));
  }
  CHECK(errors.empty());
  for (int i = 0; i < kCalls; ++i) CHECK(got[i] == "v" + std::to_string(i));
  CHECK(Keys(b.KvList("async")).size() == static_cast<size_t>(kCalls));

  // Errors arrive as the blocking calls give them.
  std::promise<Status> exists;
  b.KvSetAsync("async/k0", "other", /*overwrite=*/false, [&](Status st) { exists.set_value(st); });
  CHECK(Within20s(exists).code() == Code::kAlreadyExists);
  std::promise<Status> too_big;
  b.KvSetAsync("async/big", std::string(2000, 'x'), true, [&](Status st) { too_big.set_value(st); });
  CHECK(Within20s(too_big).code() == Code::kInvalidArgument);
  std::promise<Result<std::string>> missing;
  b.KvTryGetAsync("async/missing", [&](Result<std::string> r) { missing.set_value(std::move(r)); });
  CHECK(Within20s(missing).status().code() == Code::kNotFound);
  std::promise<Result<std::string>> timed_out;
  b.KvGetAsync("async/never", 200ms, [&](Result<std::string> r) { timed_out.set_value(std::move(r)); });
  CHECK(Within20s(timed_out).status().code() == Code::kTimeout);

  // A waiting asynchronous get is answered by a later set from another node.
  std::promise<Result<std::string>> late;
  b.KvGetAsync("async/late", 20s, [&](Result<std::string> r) { late.set_value(std::move(r)); });
  std::this_thread::sleep_for(100ms);
  REQUIRE(a.KvSet("async/late", "here").ok());
  auto late_fut = late.get_future();
  REQUIRE(late_fut.wait_for(20s) == std::future_status::ready);
  CHECK(Val(late_fut.get()) == "here");
}

TEST_CASE("barriers through nodes: pass, timeout names the missing, mismatch fails at once, cancel",
          "[node][net][coord]") {
  TestCluster c(SchedOpts(3, 0));
  c.StartWorkers(3);
  RawClient admin(c.sched().port());

  SECTION("all pass, in rounds") {
    for (int round = 0; round < 5; ++round) {
      std::vector<std::future<Status>> f;
      for (size_t i = 0; i < 3; ++i) f.push_back(BarrierAsync(c.node(i), "epoch", 20s));
      for (auto& x : f) CHECK(Soon(x).ok());
    }
    Result<pb::AdminResponse> r = admin.Admin("barriers");
    REQUIRE(r.ok());
    REQUIRE(r->barriers_size() >= 1);
    const pb::BarrierInfo& last = r->barriers(r->barriers_size() - 1);
    CHECK(last.id() == "epoch");
    CHECK(last.generation() == 5);
    CHECK(last.state() == "passed");
    // Cancelling a passed barrier or an unknown one is an error.
    CHECK(c.node(0).CancelBarrier("epoch").code() == Code::kFailedPrecondition);
    CHECK(c.node(0).CancelBarrier("unknown").code() == Code::kFailedPrecondition);
  }
  SECTION("timeout: every waiter gets the same error naming the missing") {
    auto f0 = BarrierAsync(c.node(0), "b", 300ms);
    auto f1 = BarrierAsync(c.node(1), "b", 300ms);
    Status s0 = Soon(f0), s1 = Soon(f1);
    CHECK(s0.code() == Code::kTimeout);
    CHECK_THAT(s0.message(), Catch::Contains("2/3 arrived") && Catch::Contains("missing: w2"));
    CHECK(s1.ToString() == s0.ToString());
  }
  SECTION("a different participant set fails at once for everyone") {
    auto f0 = BarrierAsync(c.node(0), "b", 30s, {"w0", "w1", "w2"});
    REQUIRE(admin.WaitArrived("b", 1));
    Status s1 = c.node(1).Barrier("b", 30s, {"w1", "w0"});
    Status s0 = Soon(f0);
    CHECK(s1.code() == Code::kFailedPrecondition);
    CHECK(s0.code() == Code::kFailedPrecondition);
    CHECK_THAT(s0.message(), Catch::Contains("participant set mismatch"));
  }
  SECTION("a caller outside the set fails it at once for everyone") {
    auto f0 = BarrierAsync(c.node(0), "b", 30s, {"w0", "w1"});
    REQUIRE(admin.WaitArrived("b", 1));
    Status s2 = c.node(2).Barrier("b", 30s, {"w0", "w1"});
    CHECK(s2.code() == Code::kInvalidArgument);
    CHECK(Soon(f0).code() == Code::kInvalidArgument);
  }
  SECTION("cancel: waiters get cancelled; cancelling again is an error") {
    auto f0 = BarrierAsync(c.node(0), "b", 30s);
    auto f1 = BarrierAsync(c.node(1), "b", 30s);
    REQUIRE(admin.WaitArrived("b", 2));
    REQUIRE(c.node(2).CancelBarrier("b").ok());
    CHECK(Soon(f0).code() == Code::kCancelled);
    CHECK(Soon(f1).code() == Code::kCancelled);
    CHECK(c.node(2).CancelBarrier("b").code() == Code::kFailedPrecondition);
  }
  SECTION("a participant reporting an error fails it for all") {
    auto f0 = BarrierAsync(c.node(0), "b", 30s);
    auto f1 = BarrierAsync(c.node(1), "b", 30s);
    REQUIRE(admin.WaitArrived("b", 2));
    REQUIRE(c.node(2).ReportError(3, "out of memory").ok());
    Status s0 = Soon(f0);
    CHECK(s0.code() == Code::kAborted);
    CHECK_THAT(s0.message(), Catch::Contains("w2") && Catch::Contains("out of memory"));
    CHECK(Soon(f1).ToString() == s0.ToString());
  }
}

TEST_CASE("barriers asynchronous: all pass together, a timeout names the missing", "[node][net][coord]") {
  TestCluster c(SchedOpts(3, 0));
  c.StartWorkers(3);
  std::vector<std::promise<Status>> done(3);
  for (int i = 0; i < 3; ++i) {
    c.node(i).BarrierAsync("together", 10s, {}, [&done, i](Status st) { done[i].set_value(st); });
  }
  for (auto& p : done) {
    auto f = p.get_future();
    REQUIRE(f.wait_for(20s) == std::future_status::ready);
    CHECK(f.get().ok());
  }
  std::promise<Status> alone;
  c.node(0).BarrierAsync("alone", 200ms, {}, [&](Status st) { alone.set_value(st); });
  auto f = alone.get_future();
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  Status st = f.get();
  CHECK(st.code() == Code::kTimeout);
  CHECK_THAT(st.message(), Catch::Contains("w1"));
}

TEST_CASE("a barrier participant that dies fails the barrier for all", "[node][net][coord]") {
  SchedulerOptions so = SchedOpts(3, 0, 100ms, 600ms);
  so.recoverable_roles = {pb::WORKER};  // w0 comes back as a new process below
  TestCluster c(so);
  c.StartWorkers(3);
  RawClient admin(c.sched().port());
  auto f0 = BarrierAsync(c.node(0), "b", 30s);
  auto f1 = BarrierAsync(c.node(1), "b", 30s);
  REQUIRE(admin.WaitArrived("b", 2));
  c.node(2).Stop();  // silent from now on: times out after 600 ms
  Status s0 = Soon(f0);
  CHECK(s0.code() == Code::kAborted);
  CHECK_THAT(s0.message(), Catch::Contains("w2") && Catch::Contains("heartbeat"));
  CHECK(Soon(f1).code() == Code::kAborted);
  // A node registering afterwards (w0, restarted) is told of the dead node at once.
  c.node(0).Stop();
  Member& again = c.Add(pb::WORKER, "w0");
  REQUIRE(again.node->Start().ok());
  CHECK(again.events.WaitFor(Kind(pb::ClusterEventMessage::NODE_TIMED_OUT, "w2"), 5s));
}

TEST_CASE("a barrier participant that shuts down fails the pending round at once for the others naming it",
          "[node][net][coord]") {
  TestCluster c(SchedOpts(2, 0));
  c.StartWorkers(2);
  RawClient admin(c.sched().port());
  auto f0 = BarrierAsync(c.node(0), "b", 60s, {"w0", "w1"});
  REQUIRE(admin.WaitArrived("b", 1));
  auto fin1 = std::async(std::launch::async, [&c] { return c.node(1).Finish(30s); });
  Status s0 = Soon(f0);  // long before its 60 s deadline
  CHECK(s0.code() == Code::kAborted);
  CHECK_THAT(s0.message(), Catch::Contains("participant w1") && Catch::Contains("shut down"));
  CHECK(c.node(0).Finish(30s).ok());
  CHECK(fin1.get().ok());
}

TEST_CASE("errors reach every other node within a heartbeat interval - a late joiner hears at once",
          "[node][net][coord]") {
  const Duration interval = 2s;  // long: the notices must be pushed, not ride on heartbeats
  TestCluster c(SchedOpts(5, 0, interval, 20s));
  for (int i = 0; i < 5; ++i) {
    c.Add(pb::WORKER, "w" + std::to_string(i), [interval](NodeOptions& o) { o.heartbeat_interval = interval; });
  }
  for (size_t i = 0; i < 4; ++i) REQUIRE(c.node(i).Start().ok());
  const auto sent = std::chrono::steady_clock::now();
  REQUIRE(c.node(0).ReportError(7, "disk full").ok());
  for (size_t i = 1; i < 4; ++i) {
    pb::ClusterEventMessage ev;
    const Duration left = interval - (std::chrono::steady_clock::now() - sent);
    REQUIRE(c.member(i).events.WaitFor(Kind(pb::ClusterEventMessage::NODE_ERROR, "w0"),
                                       std::max<Duration>(left, Duration::zero()), &ev));
    CHECK(ev.error_code() == 7);
    CHECK(ev.message() == "disk full");
    CHECK(ev.role() == pb::WORKER);
  }
  // w4 registers after the error was reported: the stored error is replayed to it.
  const auto joined = std::chrono::steady_clock::now();
  REQUIRE(c.node(4).Start().ok());
  pb::ClusterEventMessage ev;
  const Duration left = interval - (std::chrono::steady_clock::now() - joined);
  REQUIRE(c.member(4).events.WaitFor(Kind(pb::ClusterEventMessage::NODE_ERROR, "w0"),
                                     std::max<Duration>(left, Duration::zero()), &ev));
  CHECK(ev.error_code() == 7);
  CHECK(ev.message() == "disk full");
}

TEST_CASE("finish: a timeout names the stragglers, who are told - a second Finish after leaving fails",
          "[node][net][coord]") {
  TestCluster c(SchedOpts(3, 0));
  c.StartWorkers(3);
  auto f0 = std::async(std::launch::async, [&c] { return c.node(0).Finish(300ms); });
  auto f1 = std::async(std::launch::async, [&c] { return c.node(1).Finish(300ms); });
  Status s0 = Soon(f0), s1 = Soon(f1);
  CHECK(s0.code() == Code::kTimeout);
  CHECK_THAT(s0.message(), Catch::Contains("1 node(s) missing: w2"));
  CHECK(s1.code() == Code::kTimeout);
  pb::ClusterEventMessage told;
  REQUIRE(c.member(2).events.WaitFor(Kind(pb::ClusterEventMessage::NODE_ERROR, "w2"), 5s, &told));
  CHECK_THAT(told.message(), Catch::Contains("finish barrier timed out") && Catch::Contains("w2"));
  CHECK(told.error_code() == static_cast<int>(Code::kTimeout));
  // The straggler is in error: everyone hears of it, naming it.
  REQUIRE(c.member(0).events.WaitFor(Kind(pb::ClusterEventMessage::NODE_ERROR, "w2"), 5s));
  // The straggler arrives: w0 and w1 already joined, so the barrier passes and the job ends.
  CHECK(c.node(2).Finish(10s).ok());
  CHECK(c.sched().WaitForExit(10s).ok());
  CHECK(c.node(0).WaitForTermination(10s).ok());
  Status again = c.node(0).Finish(1s);
  CHECK(again.code() == Code::kFailedPrecondition);
  CHECK_THAT(again.message(), Catch::Contains("already left"));
}

TEST_CASE("FINISH waits are one per connection and end when their connection closes",
          "[node][net][coord]") {
  TestCluster c(SchedOpts(2, 0, 100ms, 60s));  // the raw clients never beat
  SchedulerNode& sched = c.sched();
  RawClient y(sched.port());
  REQUIRE(y.Register("y", 1).ok());
  pb::FinishMessage f;
  f.set_timeout_ms(3600 * 1000);  // an hour: only the close ends the wait
  {
    RawClient x(sched.port());
    REQUIRE(x.Register("x", 1).ok());
    f.set_node_id("x");
    std::future<Result<comm::Frame>> waiting = x.CallAsync(MakeMeta(pb::FINISH, pb::WORKER, -1), ToBuffer(f), 3600s);
    bool waits = false;
    for (auto deadline = std::chrono::steady_clock::now() + 10s;
         !waits && std::chrono::steady_clock::now() < deadline;) {
      waits = sched.finish_waiting() == 1;
      if (!waits) std::this_thread::sleep_for(5ms);
    }
    REQUIRE(waits);
    // A second FINISH on the same connection is refused at once, whichever node it names.
    f.set_node_id("y");
    Result<comm::Frame> second = x.Call(pb::FINISH, f);
    CHECK(second.status().code() == Code::kResourceExhausted);
    CHECK_THAT(second.status().message(), Catch::Contains("a FINISH for x already waits on this connection"));
    CHECK(sched.finish_waiting() == 1);
  }  // x's connection closes
  bool none = false;
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       !none && std::chrono::steady_clock::now() < deadline;) {
    none = sched.finish_waiting() == 0;
    if (!none) std::this_thread::sleep_for(5ms);
  }
  CHECK(none);  // withdrawn with its connection, not kept for its hour
  // x's FINISH stays recorded: y finishing ends the job.
  f.set_node_id("y");
  CHECK(y.Call(pb::FINISH, f).ok());
  CHECK(sched.WaitForExit(10s).ok());
}

TEST_CASE("topology: 11 servers and a worker get dense global ids by role, numeric rank, local id",
          "[node][net][coord]") {
  constexpr int kServers = 11;
  comm::EventLoop loop("shared");
  REQUIRE(loop.Start().ok());
  {
    TestCluster c(SchedOpts(1, kServers), &loop);
    auto two_devices = [](NodeOptions& o) {
      o.devices.resize(2);
      o.devices[0].set_local_id(1);  // out of order: the scheduler sorts them
      o.devices[0].set_device_ip("10.0." + o.node_id + ".1");
      o.devices[1].set_local_id(0);
      o.devices[1].set_device_ip("10.0." + o.node_id + ".0");
    };
    // Ranks asked for, from the highest down, so arrival order does not give the answer.
    for (int r = kServers - 1; r >= 0; --r) {
      c.Add(pb::SERVER, "s" + std::to_string(r), [&](NodeOptions& o) {
        two_devices(o);
        o.rank = r;
      });
    }
    c.Add(pb::WORKER, "w0", two_devices);
    for (size_t i = 0; i < c.size(); ++i) REQUIRE(c.node(i).Start().ok());
    for (size_t i = 0; i < c.size(); ++i) REQUIRE(c.node(i).WaitForReady(20s).ok());
    pb::SendMetadataMessage md = c.node(0).metadata();
    std::vector<std::tuple<int, int, int, int>> devs;  // (role order, rank, local, global)
    auto collect = [&devs](const auto& list, int role_order) {
      for (const pb::ServersMeta& m : list) {
        CHECK(m.node_id() == (role_order == 0 ? "s" : "w") + std::to_string(m.rank_id()));
        for (const pb::Device& d : m.devices()) devs.emplace_back(role_order, m.rank_id(), d.local_id(), d.global_id());
      }
    };
    collect(md.servers_meta(), 0);
    collect(md.workers_meta(), 1);
    REQUIRE(devs.size() == 2u * (kServers + 1));
    std::sort(devs.begin(), devs.end());
    for (size_t i = 0; i < devs.size(); ++i) CHECK(std::get<3>(devs[i]) == static_cast<int>(i));
    CHECK(devs[18] == std::make_tuple(0, 9, 0, 18));  // rank 10 comes after rank 9
    CHECK(devs[20] == std::make_tuple(0, 10, 0, 20));
    CHECK(devs[22] == std::make_tuple(1, 0, 0, 22));

    // A restart of s3 that declares another device list is refused.
    NodeOptions o = MemberOpts(pb::SERVER, c.sched().port(), "s3");
    o.devices.resize(1);
    o.devices[0].set_local_id(0);
    ServerNode changed(o, core::ParamStore::Options(), &loop);
    Status st = changed.Start();
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK_THAT(st.message(), Catch::Contains("changed its device list"));
  }
  CHECK(loop.Stop().ok());
}

TEST_CASE("timeouts from the wire up to the int64 limit are capped - scheduler_dispatch_fuzz overflow",
          "[node][net][coord][fuzz]") {
  // Found by scheduler_dispatch_fuzz under UBSan: a BARRIER with timeout_ms 4.8e14 overflowed
  // the conversion to nanoseconds. KV GET and FINISH took the same path.
  TestCluster c(SchedOpts(1, 0, 100ms, 60s));  // the raw client never beats
  RawClient x(c.sched().port());
  REQUIRE(x.Register("x", 1).ok());
  for (int64_t ms : {int64_t{483784042479615}, int64_t{1} << 62, std::numeric_limits<int64_t>::max()}) {
    INFO("timeout_ms " << ms);
    const std::string id = "b" + std::to_string(ms);
    // A barrier timeout over 24 hours is refused at once, naming the limit.
    pb::BarrierRequest b;
    b.set_id(id);
    b.set_node_id("x");
    b.set_timeout_ms(ms);
    b.add_participants("x");
    b.add_participants("y");
    Result<comm::Frame> refused = x.Call(pb::BARRIER, b);
    CHECK(refused.status().code() == Code::kInvalidArgument);
    CHECK_THAT(refused.status().message(), Catch::Contains("over the limit of 86400000 ms"));
    // A blocking KV get with the same timeout is answered by the set that follows it.
    pb::KvRequest get;
    get.set_op(pb::KvRequest::GET);
    get.set_key("k/" + id);
    get.set_timeout_ms(ms);
    std::future<Result<comm::Frame>> got = x.CallAsync(MakeMeta(pb::KV_REQUEST, pb::WORKER, -1), ToBuffer(get), 10s);
    pb::KvRequest set;
    set.set_op(pb::KvRequest::SET);
    set.set_key("k/" + id);
    set.set_value("v");
    REQUIRE(x.Call(pb::KV_REQUEST, set).ok());
    REQUIRE(got.wait_for(10s) == std::future_status::ready);
    Result<comm::Frame> r = got.get();
    REQUIRE(r.ok());
    pb::KvResponse resp;
    REQUIRE(ParsePayload(*r, &resp).ok());
    CHECK(resp.value() == "v");
  }
  // FINISH with such a timeout: x is the only member, so the barrier passes at once.
  pb::FinishMessage f;
  f.set_node_id("x");
  f.set_timeout_ms(std::numeric_limits<int64_t>::max());
  CHECK(x.Call(pb::FINISH, f).ok());
}

TEST_CASE("blocking KV gets of a connection that closes stop waiting - at most 4096 wait on one connection",
          "[node][net][coord]") {
  TestCluster c(SchedOpts(1, 0, 100ms, 60s));
  SchedulerNode& sched = c.sched();
  pb::KvRequest get;
  get.set_op(pb::KvRequest::GET);
  get.set_key("never/set");
  get.set_timeout_ms(3600 * 1000);  // an hour: only the close or the cap ends them
  constexpr int kCap = 4096;
  {
    RawClient x(sched.port());  // not even registered: any connection may ask
    std::vector<std::future<Result<comm::Frame>>> waiting;
    for (int i = 0; i < kCap; ++i) {
      waiting.push_back(x.CallAsync(MakeMeta(pb::KV_REQUEST, pb::WORKER, -1), ToBuffer(get), 3600s));
    }
    bool all_wait = false;
    for (int i = 0; i < 200 && !all_wait; ++i) {
      all_wait = sched.kv_gets_waiting() == kCap;
      if (!all_wait) std::this_thread::sleep_for(10ms);
    }
    REQUIRE(all_wait);
    // One more on the same connection is refused at once; another connection may still wait.
    std::future<Result<comm::Frame>> over = x.CallAsync(MakeMeta(pb::KV_REQUEST, pb::WORKER, -1), ToBuffer(get), 10s);
    REQUIRE(over.wait_for(10s) == std::future_status::ready);
    Result<comm::Frame> refused = over.get();
    CHECK(refused.status().code() == Code::kResourceExhausted);
    CHECK_THAT(refused.status().message(), Catch::Contains("4096 blocking KV gets already wait"));
    RawClient y(sched.port());
    std::future<Result<comm::Frame>> other = y.CallAsync(MakeMeta(pb::KV_REQUEST, pb::WORKER, -1), ToBuffer(get), 3600s);
    bool other_waits = false;
    for (int i = 0; i < 200 && !other_waits; ++i) {
      other_waits = sched.kv_gets_waiting() == kCap + 1;
      if (!other_waits) std::this_thread::sleep_for(10ms);
    }
    CHECK(other_waits);
  }  // both connections close
  bool none = false;
  for (int i = 0; i < 200 && !none; ++i) {
    none = sched.kv_gets_waiting() == 0;
    if (!none) std::this_thread::sleep_for(10ms);
  }
  CHECK(none);  // before, they waited out their hour
}

TEST_CASE("barrier arrivals of a connection that closes are withdrawn - the others keep waiting",
          "[node][net][coord]") {
  TestCluster c(SchedOpts(1, 0, 100ms, 60s));
  RawClient y(c.sched().port());
  auto arrive = [](RawClient& link, const std::string& node) {
    pb::BarrierRequest b;
    b.set_id("b");
    b.set_node_id(node);
    b.set_timeout_ms(3600 * 1000);  // an hour: only a close or the last arrival ends it
    for (const char* p : {"x", "y", "z"}) b.add_participants(p);
    return link.CallAsync(MakeMeta(pb::BARRIER, pb::WORKER, -1), ToBuffer(b), 3600s);
  };
  std::future<Result<comm::Frame>> from_y = arrive(y, "y");
  {
    RawClient x(c.sched().port());
    std::future<Result<comm::Frame>> from_x = arrive(x, "x");
    REQUIRE(y.WaitArrived("b", 2));
  }  // x's connection closes
  bool withdrawn = false;
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       !withdrawn && std::chrono::steady_clock::now() < deadline;) {
    Result<pb::AdminResponse> r = y.Admin("barriers");
    REQUIRE(r.ok());
    REQUIRE(r->barriers_size() == 1);
    withdrawn = r->barriers(0).arrived() == 1;
    if (withdrawn) CHECK(std::vector<std::string>(r->barriers(0).missing().begin(), r->barriers(0).missing().end()) ==
                         std::vector<std::string>{"x", "z"});
    if (!withdrawn) std::this_thread::sleep_for(5ms);
  }
  REQUIRE(withdrawn);
  // z arriving does not pass the round: the departed x does not count.
  RawClient z(c.sched().port());
  std::future<Result<comm::Frame>> from_z = arrive(z, "z");
  REQUIRE(y.WaitArrived("b", 2));
  CHECK(from_y.wait_for(0s) == std::future_status::timeout);
  // x comes back on a new connection: the round passes for all three.
  RawClient x2(c.sched().port());
  Result<comm::Frame> back = arrive(x2, "x").get();
  CHECK(back.ok());
  REQUIRE(from_y.wait_for(10s) == std::future_status::ready);
  CHECK(from_y.get().ok());
  REQUIRE(from_z.wait_for(10s) == std::future_status::ready);
  CHECK(from_z.get().ok());
}

TEST_CASE("a scheduler answer over max_message_bytes becomes an error answer - the caller fails at once",
          "[node][net][coord]") {
  SchedulerOptions so = SchedOpts(1, 0, 100ms, 60s);
  so.max_message_bytes = 4096;
  TestCluster c(so);
  RawClient x(c.sched().port());
  for (int i = 0; i < 3; ++i) {
    pb::KvRequest set;
    set.set_op(pb::KvRequest::SET);
    set.set_key("dir/k" + std::to_string(i));
    set.set_value(std::string(2000, 'v'));
    REQUIRE(x.Call(pb::KV_REQUEST, set).ok());
  }
  pb::KvRequest list;
  list.set_op(pb::KvRequest::LIST);
  list.set_key("dir");
  // A deadline of an hour: only an answer ends the call before the test's own wait.
  std::future<Result<comm::Frame>> f = x.CallAsync(MakeMeta(pb::KV_REQUEST, pb::WORKER, -1), ToBuffer(list), 3600s);
  REQUIRE(f.wait_for(10s) == std::future_status::ready);
  Result<comm::Frame> r = f.get();
  CHECK(r.status().code() == Code::kResourceExhausted);
  CHECK_THAT(r.status().message(), Catch::Contains("over max_message_bytes 4096"));
  CHECK_THAT(r.status().message(), Catch::Contains("KV_REQUEST"));
  // A list that fits is answered.
  pb::KvRequest del;
  del.set_op(pb::KvRequest::DELETE);
  del.set_key("dir/k0");
  REQUIRE(x.Call(pb::KV_REQUEST, del).ok());
  Result<comm::Frame> small = x.Call(pb::KV_REQUEST, list);
  REQUIRE(small.ok());
  pb::KvResponse resp;
  REQUIRE(ParsePayload(*small, &resp).ok());
  CHECK(resp.entries_size() == 2);
}

// A scheduler stand-in that swallows the first REGISTER and answers the later ones (rank 0);
// nothing else is answered.
class SwallowingScheduler {
 public:
  int port() const { return listener_.port(); }
  int registers() const { return registers_.load(); }

 private:
  std::atomic<int> registers_{0};
  testing::RawListener listener_{[this](comm::ConnId conn, comm::Frame&& frame) {
    if (frame.meta.cmd() != pb::REGISTER) return;
    if (registers_.fetch_add(1) == 0) return;
    pb::RegisterRespMessage resp;
    resp.set_rank_id(0);
    listener_.messenger().Reply(conn, frame.meta, resp).IgnoreError();
  }};
};

TEST_CASE("a REGISTER that times out while the link stays up is sent again - the node registers",
          "[node][net][coord]") {
  SwallowingScheduler sched;
  NodeOptions o = MemberOpts(pb::WORKER, sched.port(), "w0", 1s);
  o.request_timeout = 300ms;  // the swallowed REGISTER times out soon
  o.connect_timeout = 5s;
  WorkerNode w(o);
  Status started = w.Start();  // returns once registered, or kTimeout after connect_timeout + 5 s
  CHECK(started.ok());
  CHECK(sched.registers() >= 2);
  w.Stop();
}

TEST_CASE("a REGISTER with a port out of range or too many devices is refused - the state file stays loadable",
          "[node][net][coord]") {
  TestCluster c(SchedOpts(1, 0));
  RawClient x(c.sched().port());
  auto reg = [&](int port, int devices) {
    pb::RegisterMessage msg;
    msg.set_ip("127.0.0.1");
    msg.set_port(port);
    msg.set_node_id("w0");
    msg.set_role(pb::WORKER);
    msg.set_incarnation(1);
    msg.set_protocol_version(node::kProtocolVersion);
    msg.set_requested_rank(-1);
    for (int i = 0; i < devices; ++i) msg.add_devices()->set_local_id(i);
    return x.Call(pb::REGISTER, msg);
  };
  for (int port : {70000, -1}) {
    Result<comm::Frame> r = reg(port, 0);
    CHECK(r.status().code() == Code::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("not in [0, 65535]"));
  }
  Result<comm::Frame> many = reg(1, core::kMaxStateDevicesPerNode + 1);
  CHECK(many.status().code() == Code::kInvalidArgument);
  CHECK_THAT(many.status().message(), Catch::Contains("at most 4096 per node"));
  REQUIRE(reg(1, 2).ok());  // in range: registered
}

TEST_CASE("KV values of every length class come back byte for byte - blocking and asynchronous sets, held and awaited gets",
          "[node][net][coord]") {
  // A SET's value, and a GET answer's, is appended to the encoded message by hand (its
  // length a varint of 1, 2, 3 bytes): each length at a varint boundary, with every byte
  // value, both ways of sending, answered from the store and from the set that wakes a GET.
  TestCluster c(SchedOpts(1, 0));
  c.StartWorkers(1);
  Node& a = c.node(0);
  for (size_t len : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{16383}, size_t{16384}, size_t{1} << 20}) {
    std::string value(len, '\0');
    for (size_t i = 0; i < len; ++i) value[i] = static_cast<char>((i * 131 + len) & 0xff);
    const std::string key = "len/" + std::to_string(len);
    INFO("length " << len);
    REQUIRE(a.KvSet(key, value).ok());
    CHECK(Val(a.KvTryGet(key)) == value);
    CHECK(a.KvSet(key, "other", /*overwrite=*/false).code() == Code::kAlreadyExists);
    std::promise<Status> set;
    a.KvSetAsync(key + "/async", value, /*overwrite=*/false, [&set](Status st) { set.set_value(st); });
    std::future<Status> set_done = set.get_future();
    REQUIRE(set_done.wait_for(15s) == std::future_status::ready);
    REQUIRE(set_done.get().ok());
    CHECK(Val(a.KvGet(key + "/async", 1s)) == value);
    // A GET that waits for the key is answered from the set that wakes it.
    std::promise<Result<std::string>> later;
    a.KvGetAsync(key + "/later", 10s, [&later](Result<std::string> got) { later.set_value(std::move(got)); });
    for (auto deadline = std::chrono::steady_clock::now() + 10s;
         c.sched().kv_gets_waiting() == 0 && std::chrono::steady_clock::now() < deadline;) {
      std::this_thread::sleep_for(1ms);
    }
    REQUIRE(c.sched().kv_gets_waiting() == 1);
    REQUIRE(a.KvSet(key + "/later", value).ok());
    std::future<Result<std::string>> got = later.get_future();
    REQUIRE(got.wait_for(15s) == std::future_status::ready);
    CHECK(Val(got.get()) == value);
  }
}

TEST_CASE("a peer that asks for large KV values and never reads is closed at the queued-output cap - the scheduler lives on",
          "[node][net][coord]") {
  // Each GET of "big" is answered at once with 1 MiB; the 4 MiB cap closes the connection
  // inside such an answer. The GET handler used its per-connection set after that answer,
  // which OnClose had erased (ASan: heap-use-after-free).
  SchedulerOptions so = SchedOpts(1, 0);
  so.max_queued_write_bytes = 4 << 20;
  TestCluster c(so);
  c.StartWorkers(1);
  REQUIRE(c.node(0).KvSet("big", std::string(1 << 20, 'v')).ok());
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  int rcvbuf = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(c.sched().port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  pb::KvRequest get;
  get.set_op(pb::KvRequest::GET);
  get.set_key("big");
  get.set_timeout_ms(1000);
  const std::string body = get.SerializeAsString();
  std::string wire;
  for (int i = 1; i <= 64; ++i) {
    pb::MessageMeta meta = MakeMeta(pb::KV_REQUEST, pb::WORKER, -1);
    meta.set_request_id(static_cast<uint64_t>(i));
    const std::string m = meta.SerializeAsString();
    wire += comm::EncodeHeader(comm::FrameHeader{comm::kMagic, static_cast<uint32_t>(m.size()), body.size()}) + m + body;
  }
  REQUIRE(::send(fd, wire.data(), wire.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(wire.size()));
  std::this_thread::sleep_for(1s);  // not reading: the answers pile up past the cap
  bool ended = false;
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!ended && std::chrono::steady_clock::now() < deadline) {
    char buf[65536];
    ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) ended = true;
  }
  ::close(fd);
  CHECK(ended);
  CHECK(c.sched().kv_gets_waiting() == 0);
  Result<std::string> again = c.node(0).KvGet("big", 5s);
  REQUIRE(again.ok());
  CHECK(again->size() == (1u << 20));
}

TEST_CASE("stress: 3 nodes x 1,000 concurrent KvSet to distinct keys, then List returns all 3,000",
          "[node][net][coord]") {
  constexpr int kNodes = 3, kThreads = 4, kPerNode = 1000;
  TestCluster c(SchedOpts(kNodes, 0));
  c.StartWorkers(kNodes);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int n = 0; n < kNodes; ++n) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&c, &failed, n, t] {
        for (int i = t; i < kPerNode; i += kThreads) {
          const std::string key = "stress/n" + std::to_string(n) + "/" + std::to_string(i);
          if (!c.node(n).KvSet(key, key).ok()) ++failed;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  CHECK(failed.load() == 0);
  auto list = c.node(0).KvList("stress");
  REQUIRE(list.ok());
  CHECK(list->size() == kNodes * kPerNode);
  CHECK(std::is_sorted(list->begin(), list->end()));
  CHECK(std::all_of(list->begin(), list->end(), [](const auto& kv) { return kv.first == kv.second; }));
}

TEST_CASE("stress: 64 nodes x 100 barrier rounds all pass", "[node][net][coord]") {
  constexpr int kNodes = 64, kRounds = 100;
  comm::EventLoop loop("shared");
  REQUIRE(loop.Start().ok());
  {
    TestCluster c(SchedOpts(kNodes, 0, 200ms, 10s), &loop);
    for (int i = 0; i < kNodes; ++i) c.Add(pb::WORKER, "w" + std::to_string(i));
    for (size_t i = 0; i < c.size(); ++i) REQUIRE(c.node(i).Start().ok());
    for (size_t i = 0; i < c.size(); ++i) REQUIRE(c.node(i).WaitForReady(20s).ok());
    std::atomic<int> passed{0};
    std::mutex mu;
    std::string first_failure;
    std::vector<std::thread> threads;
    for (int i = 0; i < kNodes; ++i) {
      threads.emplace_back([&, i] {
        for (int r = 0; r < kRounds; ++r) {
          Status st = c.node(i).Barrier("round", 30s);
          if (!st.ok()) {
            std::lock_guard<std::mutex> lock(mu);
            if (first_failure.empty()) first_failure = "w" + std::to_string(i) + ": " + st.ToString();
            return;
          }
          ++passed;
        }
      });
    }
    for (auto& t : threads) t.join();
    INFO(first_failure);
    CHECK(passed.load() == kNodes * kRounds);
  }
  CHECK(loop.Stop().ok());
}

}  // namespace pscore::node
