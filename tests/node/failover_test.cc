// Failover of requests in flight to a silent server (docs/reliability.md, "Requests in
// flight to a silent server"), in one process: a server whose loop is frozen (no
// heartbeats, no answers, its sockets open: what SIGSTOP or a cut link look like to its
// peers) is timed out by the scheduler. With replicas=2 the pushes in flight to it go to
// its ranges' new primary at once and are applied there exactly once, also after the
// frozen server resumes and reads them; with replicas=1 they wait for it up to
// recovery_timeout and then fail naming it, or succeed once if it resumes in time. A
// PullSync in flight on its direct link to the silent primary is interrupted once the
// scheduler marks that server down and is answered by the promoted backup.
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pscore/core/key_range.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"

#include "node/replicated_job.h"  // last: it pulls in Catch, whose CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;
using pscore::testing::Keys;
using pscore::testing::ReplicatedJob;
using pscore::testing::ReplicatedJobOptions;
using pscore::testing::Stored;
constexpr auto kDeadline = std::chrono::seconds(60);
// Far beyond every bound a test here expects, and far below it: a request waiting out
// request_timeout would show as a wait this long.
constexpr auto kRequestTimeout = std::chrono::seconds(120);

template <typename T>
T Await(std::future<T>&& f, Duration timeout = kDeadline) {
  if (f.wait_for(timeout) != std::future_status::ready) FAIL("no answer within the deadline");
  return f.get();
}

// Holds a node's loop thread (bounded) until released: the node neither reads nor beats.
class Freeze {
 public:
  explicit Freeze(Node& node) {
    std::shared_future<void> go = release_.get_future().share();
    auto frozen = std::make_shared<std::promise<void>>();
    std::future<void> is_frozen = frozen->get_future();
    node.loop()->Post([go, frozen] {
      frozen->set_value();
      go.wait_for(std::chrono::seconds(90));
    });
    is_frozen.wait_for(std::chrono::seconds(30));
  }
  ~Freeze() { Release(); }
  void Release() {
    if (released_) return;
    released_ = true;
    release_.set_value();
  }

 private:
  std::promise<void> release_;
  bool released_ = false;
};

// Workers recover too; a request waits kRequestTimeout at most.
ReplicatedJobOptions FailoverJob(int servers, int replicas, Duration recovery_timeout) {
  ReplicatedJobOptions o;
  o.servers = servers;
  o.replicas = replicas;
  o.recoverable_roles = {pb::SERVER, pb::WORKER};
  o.recovery_timeout = recovery_timeout;
  o.request_timeout = kRequestTimeout;
  return o;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

TEST_CASE("with replicas=2 pushes in flight to a silent primary go to the promoted backup and are applied once",
          "[replication][failover][net]") {
  ReplicatedJob c(FailoverJob(/*servers=*/2, /*replicas=*/2, /*recovery_timeout=*/30s));
  const std::vector<uint64_t> keys = Keys(16);
  const size_t len = GENERATE(size_t{8}, size_t{8192});  // applied on the loop, on the handler thread
  const std::vector<float> ones(keys.size() * len, 1.0f);
  for (int i = 0; i < 3; ++i) REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  // Rank 0 falls silent with its sockets open; both ranges have parts in flight to it
  // (it is the primary of range 0 and the backup rank 1 forwards range 1's pushes to).
  ServerNode& silent = c.ByRank(0);
  ServerNode& survivor = c.ByRank(1);
  const uint64_t epoch = c.worker->epoch();
  const auto t0 = std::chrono::steady_clock::now();
  double took = 0;
  {
    Freeze freeze(silent);
    std::vector<std::future<Status>> pushes;
    for (int i = 0; i < 3; ++i) pushes.push_back(c.worker->Push(keys, ones));
    for (auto& p : pushes) {
      Status st = Await(std::move(p));
      INFO(st.ToString());
      REQUIRE(st.ok());
    }
    took = Seconds(t0);
    CHECK(c.worker->epoch() > epoch);
    // Answered by the survivor once the scheduler marked rank 0 down, not after the
    // request timeout.
    CHECK(took < std::chrono::duration<double>(kRequestTimeout).count() / 2);
    Result<PullResult> pulled = Await(c.worker->Pull(keys));
    REQUIRE(pulled.ok());
    CHECK(pulled->values == std::vector<float>(keys.size() * len, 6.0f));
    freeze.Release();
  }
  // The resumed server reads the pushes that waited in its socket, applies them and
  // forwards them with their ids: the survivor has them already and does not apply them
  // again. It hears that it is down and is kept out of its ranges.
  const auto settle = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < settle && silent.epoch() < c.worker->epoch()) {
    std::this_thread::sleep_for(20ms);
  }
  std::this_thread::sleep_for(500ms);
  for (uint64_t k : keys) {
    INFO("key " << k);
    CHECK(Stored(survivor, k) == std::vector<float>(len, 6.0f));
  }
  Result<PullResult> again = Await(c.worker->Pull(keys));
  REQUIRE(again.ok());
  CHECK(again->values == std::vector<float>(keys.size() * len, 6.0f));
  REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  Result<PullResult> last = Await(c.worker->Pull(keys));
  REQUIRE(last.ok());
  CHECK(last->values == std::vector<float>(keys.size() * len, 7.0f));
  WARN("pushes in flight to the silent primary acknowledged after " << took << " s");
}

TEST_CASE("with replicas=1 a push in flight to a silent server fails after recovery_timeout naming it",
          "[failover][net]") {
  ReplicatedJob c(FailoverJob(/*servers=*/2, /*replicas=*/1, /*recovery_timeout=*/4s));
  const std::vector<uint64_t> keys = Keys(16);
  const std::vector<float> ones(keys.size() * 8, 1.0f);
  REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  Freeze freeze(c.ByRank(1));
  const auto t0 = std::chrono::steady_clock::now();
  Status st = Await(c.worker->Push(keys, ones));
  const double took = Seconds(t0);
  freeze.Release();
  INFO(st.ToString());
  CHECK(st.code() == Code::kUnavailable);
  CHECK(st.message().find("server s1") != std::string::npos);
  CHECK(st.message().find("recovery_timeout 4000 ms") != std::string::npos);
  // recovery_timeout from the send, not request_timeout.
  CHECK(took >= 3.5);
  CHECK(took < std::chrono::duration<double>(kRequestTimeout).count() / 2);
}

TEST_CASE("with replicas=1 a push in flight to a server silent past its heartbeat timeout is applied once when it resumes",
          "[failover][net]") {
  ReplicatedJob c(FailoverJob(/*servers=*/2, /*replicas=*/1, /*recovery_timeout=*/30s));
  const std::vector<uint64_t> keys = Keys(16);
  const std::vector<float> ones(keys.size() * 8, 1.0f);
  REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  std::future<Status> push;
  {
    Freeze freeze(c.ByRank(1));
    push = c.worker->Push(keys, ones);
    // Past the heartbeat timeout: the scheduler times it out and the worker closes its link
    // (the push waits in the closed socket and is sent again on a new one).
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < until && c.worker->cluster_state() != pb::NODE_TIMEOUT) {
      std::this_thread::sleep_for(20ms);
    }
    CHECK(c.worker->cluster_state() == pb::NODE_TIMEOUT);
    std::this_thread::sleep_for(300ms);
  }
  Status st = Await(std::move(push));
  INFO(st.ToString());
  REQUIRE(st.ok());
  REQUIRE(c.worker->WaitForReady(kDeadline).ok());
  Result<PullResult> pulled = Await(c.worker->Pull(keys));
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>(keys.size() * 8, 2.0f));
}

// PullSync's direct way: the calling thread writes the request and blocks reading its own
// socket to the range's primary. Frozen, that primary answers nothing and closes nothing;
// the call is interrupted when the metadata marks the server down and goes to the
// promoted backup, instead of waiting out the request timeout.
TEST_CASE("with replicas=2 a PullSync in flight on its direct link to a silent primary is answered by the promoted "
          "backup before the request timeout",
          "[replication][failover][net]") {
  ReplicatedJob c(FailoverJob(/*servers=*/2, /*replicas=*/2, /*recovery_timeout=*/30s));
  // Keys of range 0 only: PullSync takes the direct way for keys on one server.
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; keys.size() < 8 && k < 100000; ++k) {
    if (core::ServerForKey(k, 2) == 0) keys.push_back(k);
  }
  REQUIRE(keys.size() == 8);
  const std::vector<float> ones(keys.size() * 4, 1.0f);
  for (int i = 0; i < 2; ++i) REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  Result<PullResult> first = c.worker->PullSync(keys);  // opens the direct link to rank 0
  REQUIRE(first.ok());
  CHECK(first->values == std::vector<float>(ones.size(), 2.0f));
  REQUIRE(c.worker->direct_pulls() == 1);
  const uint64_t epoch = c.worker->epoch();
  double took = 0;
  {
    Freeze freeze(c.ByRank(0));
    const auto t0 = std::chrono::steady_clock::now();
    std::future<Result<PullResult>> pull =
        std::async(std::launch::async, [&c, &keys] { return c.worker->PullSync(keys); });
    // The deadline is half the request timeout: a call that waited it out would miss it.
    if (pull.wait_for(kRequestTimeout / 2) != std::future_status::ready) {
      freeze.Release();  // lets the call end, so the test thread can join it
      pull.wait();
      FAIL("PullSync to the silent primary had no answer within half the request timeout");
    }
    took = Seconds(t0);
    Result<PullResult> pulled = pull.get();
    INFO(pulled.status().ToString());
    REQUIRE(pulled.ok());
    CHECK(pulled->values == std::vector<float>(ones.size(), 2.0f));
    CHECK(c.worker->epoch() > epoch);  // answered under the epoch that marked rank 0 down
    // The interrupted call took the loop's way: the direct count did not grow.
    CHECK(c.worker->direct_pulls() == 1);
    freeze.Release();
  }
  // Later calls read the promoted backup, directly again.
  Result<PullResult> again = c.worker->PullSync(keys);
  REQUIRE(again.ok());
  CHECK(again->values == std::vector<float>(ones.size(), 2.0f));
  WARN("PullSync in flight to the silent primary answered after " << took << " s");
}

}  // namespace pscore::node
