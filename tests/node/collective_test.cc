// Server collectives: CollectiveSend/CollectiveRecv matched by (sender rank, tag) whatever
// the arrival order, and AllReduce over 4 servers against the serial sum. In-process
// nodes on 127.0.0.1, ephemeral ports.
#include <algorithm>
#include <atomic>
#include <thread>

#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;
constexpr auto kDeadline = std::chrono::seconds(30);

template <typename T>
T Await(std::future<T>& f, Duration timeout = kDeadline) {
  if (f.wait_for(timeout) != std::future_status::ready) FAIL("no answer within the deadline");
  return f.get();
}

// Scheduler + `servers` servers + one worker, READY; stopped by the destructor.
class ServerGroup {
 public:
  explicit ServerGroup(int servers) {
    SchedulerOptions so;
    so.worker_num = 1;
    so.server_num = servers;
    so.heartbeat_interval = 50ms;
    so.heartbeat_timeout = 3s;
    sched_ = std::make_unique<SchedulerNode>(so);
    REQUIRE(sched_->Start().ok());
    for (int i = 0; i < servers; ++i) {
      servers_.push_back(std::make_unique<ServerNode>(Opts("s" + std::to_string(i))));
      REQUIRE(servers_.back()->Start().ok());
    }
    worker_ = std::make_unique<WorkerNode>(Opts("w0"));
    REQUIRE(worker_->Start().ok());
    for (auto& s : servers_) REQUIRE(s->WaitForReady(kDeadline).ok());
    // Index by rank so tests can say "server of rank r".
    std::sort(servers_.begin(), servers_.end(), [](auto& a, auto& b) { return a->rank() < b->rank(); });
    for (int i = 0; i < servers; ++i) REQUIRE(servers_[i]->rank() == i);
  }
  ~ServerGroup() {
    if (worker_) worker_->Stop();
    for (auto& s : servers_) s->Stop();
    sched_->Stop();
  }
  ServerNode& rank(int r) { return *servers_[r]; }
  int size() const { return static_cast<int>(servers_.size()); }

 private:
  NodeOptions Opts(const std::string& id) {
    NodeOptions o;
    o.scheduler_port = sched_->port();
    o.node_id = id;
    o.heartbeat_interval = 50ms;
    o.connect_timeout = 10s;
    return o;
  }
  std::unique_ptr<SchedulerNode> sched_;
  std::vector<std::unique_ptr<ServerNode>> servers_;
  std::unique_ptr<WorkerNode> worker_;
};

std::string Str(const BufferPtr& b) { return b ? std::string(b->view()) : std::string(); }

}  // namespace

TEST_CASE("collective messages match by (sender, tag) whatever the arrival order", "[node][net][collective]") {
  ServerGroup g(2);
  ServerNode& a = g.rank(0);
  ServerNode& b = g.rank(1);

  SECTION("sent b then a, received a then b (both arrived before the receive)") {
    auto sb = a.CollectiveSend(1, "b", Buffer::FromString("payload-b"));
    auto sa = a.CollectiveSend(1, "a", Buffer::FromString("payload-a"));
    REQUIRE(Await(sb).ok());
    REQUIRE(Await(sa).ok());
    auto ra = b.CollectiveRecv(0, "a");
    auto rb = b.CollectiveRecv(0, "b");
    Result<BufferPtr> got_a = Await(ra);
    Result<BufferPtr> got_b = Await(rb);
    REQUIRE(got_a.ok());
    REQUIRE(got_b.ok());
    CHECK(Str(*got_a) == "payload-a");
    CHECK(Str(*got_b) == "payload-b");
  }
  SECTION("receives waiting first, sends in the other order") {
    auto ra = b.CollectiveRecv(0, "a");
    auto rb = b.CollectiveRecv(0, "b");
    auto sb = a.CollectiveSend(1, "b", Buffer::FromString("payload-b"));
    auto sa = a.CollectiveSend(1, "a", Buffer::FromString("payload-a"));
    CHECK(Await(sb).ok());
    CHECK(Await(sa).ok());
    Result<BufferPtr> got_a = Await(ra);
    Result<BufferPtr> got_b = Await(rb);
    REQUIRE(got_a.ok());
    REQUIRE(got_b.ok());
    CHECK(Str(*got_a) == "payload-a");
    CHECK(Str(*got_b) == "payload-b");
  }
  SECTION("the same tag from two senders is kept apart by sender rank") {
    auto from_b = b.CollectiveSend(0, "t", Buffer::FromString("from-1"));
    REQUIRE(Await(from_b).ok());
    auto to_self = a.CollectiveSend(0, "t", Buffer::FromString("from-0"));
    REQUIRE(Await(to_self).ok());
    auto r1 = a.CollectiveRecv(1, "t");
    auto r0 = a.CollectiveRecv(0, "t");
    Result<BufferPtr> g1 = Await(r1);
    Result<BufferPtr> g0 = Await(r0);
    REQUIRE(g1.ok());
    REQUIRE(g0.ok());
    CHECK(Str(*g1) == "from-1");
    CHECK(Str(*g0) == "from-0");
  }
  SECTION("a second unreceived message with the same tag is refused") {
    auto s1 = a.CollectiveSend(1, "dup", Buffer::FromString("1"));
    REQUIRE(Await(s1).ok());
    auto s2 = a.CollectiveSend(1, "dup", Buffer::FromString("2"));
    Status st = Await(s2);
    CHECK(st.code() == Code::kAlreadyExists);
    auto r = b.CollectiveRecv(0, "dup");
    Result<BufferPtr> got = Await(r);
    REQUIRE(got.ok());
    CHECK(Str(*got) == "1");
  }
}

TEST_CASE("AllReduce over 4 servers equals the serial sum on every server", "[node][net][collective]") {
  ServerGroup g(4);
  constexpr size_t kLen = 10000;
  auto input = [](int rank) {
    std::vector<float> v(kLen);
    for (size_t i = 0; i < kLen; ++i) v[i] = 0.001f * static_cast<float>((i * 7 + rank * 13) % 1000) - 0.3f * rank;
    return v;
  };
  // The serial sum in rank order, the order AllReduce promises (bit-identical results).
  std::vector<float> expected(kLen, 0.0f);
  for (int r = 0; r < 4; ++r) {
    std::vector<float> part = input(r);
    for (size_t i = 0; i < kLen; ++i) expected[i] += part[i];
  }
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<float>> data(4);
    std::vector<std::future<Status>> done;
    for (int r = 0; r < 4; ++r) {
      data[r] = input(r);
      ServerNode* s = &g.rank(r);
      std::vector<float>* d = &data[r];
      std::string tag = "grad-" + std::to_string(round);
      done.push_back(std::async(std::launch::async, [s, d, tag] { return s->AllReduce(tag, d, 20s); }));
    }
    for (auto& f : done) REQUIRE(Await(f).ok());
    for (int r = 0; r < 4; ++r) {
      INFO("round " << round << " server " << r);
      CHECK(data[r] == expected);
    }
  }
}

TEST_CASE("AllReduce with mismatched lengths fails instead of summing garbage", "[node][net][collective]") {
  ServerGroup g(2);
  std::vector<float> d0(10, 1.0f), d1(11, 1.0f);
  auto f0 = std::async(std::launch::async, [&] { return g.rank(0).AllReduce("bad", &d0, 10s); });
  auto f1 = std::async(std::launch::async, [&] { return g.rank(1).AllReduce("bad", &d1, 10s); });
  Status s0 = Await(f0);
  Status s1 = Await(f1);
  CHECK(s0.code() == Code::kInvalidArgument);
  CHECK(s1.code() == Code::kInvalidArgument);
}

TEST_CASE("AllReduce that others never join fails at its deadline - its receive withdrawn",
          "[node][net][collective]") {
  ServerGroup g(4);
  std::vector<float> d(10, 1.0f);
  Status st = g.rank(0).AllReduce("lonely", &d, 1s);
  CHECK(st.code() == Code::kTimeout);
  CHECK_THAT(st.message(), Catch::Contains("nothing from server rank 1 within 1000 ms"));
  CHECK(d == std::vector<float>(10, 1.0f));  // untouched
  // The receive it gave up is gone: what rank 1 sends now waits for a new receive.
  auto sent = g.rank(1).CollectiveSend(0, "lonely", Buffer::FromString("late"));
  REQUIRE(Await(sent).ok());
  auto received = g.rank(0).CollectiveRecv(1, "lonely");
  Result<BufferPtr> late = Await(received);
  REQUIRE(late.ok());
  CHECK(Str(*late) == "late");
}

}  // namespace pscore::node

namespace pscore::node {

TEST_CASE("a receive from a server that times out fails at once - later ones too - and live ranks still deliver",
          "[node][net][collective]") {
  ServerGroup g(3);
  auto from_dead = g.rank(0).CollectiveRecv(2, "never");
  auto from_live = g.rank(0).CollectiveRecv(1, "kept");
  auto before = g.rank(2).CollectiveSend(0, "sent-before", Buffer::FromString("early"));
  REQUIRE(Await(before).ok());
  g.rank(2).Stop();  // as if killed: no FINISH, its heartbeats stop (the scheduler's timeout is 3 s)

  // Answered when the scheduler declares rank 2 timed out, not at the caller's deadline.
  Result<BufferPtr> dead = Await(from_dead, 20s);
  CHECK(dead.status().code() == Code::kUnavailable);
  CHECK_THAT(dead.status().message(), Catch::Contains("server rank 2 (s2) timed out"));
  // A receive issued afterwards fails at once; what rank 2 sent before it died is delivered.
  auto later = g.rank(0).CollectiveRecv(2, "after");
  CHECK(Await(later, 5s).status().code() == Code::kUnavailable);
  auto early = g.rank(0).CollectiveRecv(2, "sent-before");
  Result<BufferPtr> got = Await(early, 5s);
  REQUIRE(got.ok());
  CHECK(Str(*got) == "early");
  // The receive from the live rank 1 still waits, and gets its message.
  CHECK(from_live.wait_for(0s) == std::future_status::timeout);
  auto sent = g.rank(1).CollectiveSend(0, "kept", Buffer::FromString("alive"));
  REQUIRE(Await(sent).ok());
  Result<BufferPtr> live = Await(from_live);
  REQUIRE(live.ok());
  CHECK(Str(*live) == "alive");
}

}  // namespace pscore::node
