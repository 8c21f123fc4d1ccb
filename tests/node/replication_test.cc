// Server replication (docs/reliability.md), in one process: with replicas=2 a push is
// applied by every live replica of its keys' range before the worker's future is ready;
// a server's loss marks it down in a new epoch, the next replica of each of its ranges
// serves them, and every acknowledged push is still there; a push forwarded twice (a
// retry after a lost answer) is applied once on the primary and the backup; a server back
// empty is rebuilt from its ranges' primaries while pushes go on, and its copy is complete;
// a scale-out or scale-in fills each range's new chain, so a server lost after it loses
// nothing; a backup that switched views for a scale before its primary still applies the
// primary's forwards, so each push is acknowledged and applied once.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "pscore/core/key_range.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"

#include "node/replicated_job.h"  // last: it pulls in Catch, whose CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;
using pscore::testing::Keys;
using pscore::testing::ReplicatedJob;
using pscore::testing::Stored;
using pscore::testing::SumStore;
constexpr auto kDeadline = std::chrono::seconds(60);

template <typename T>
T Await(std::future<T>&& f, Duration timeout = kDeadline) {
  if (f.wait_for(timeout) != std::future_status::ready) FAIL("no answer within the deadline");
  return f.get();
}

// A server that closes a worker's link once the worker's first built-in push is applied,
// before its answer is written: the worker sees the link lost and sends the push again.
class AnswerDroppingServer : public ServerNode {
 public:
  AnswerDroppingServer(NodeOptions o, core::ParamStore::Options store) : ServerNode(std::move(o), store) {}
  std::atomic<int> dropped{0};

 protected:
  void OnPeerRequest(comm::ConnId conn, comm::Frame&& frame) override {
    const bool push = frame.meta.cmd() == pb::SEND_DATA && frame.meta.handler() == kPushHandler;
    if (!push || dropped > 0) return ServerNode::OnPeerRequest(conn, std::move(frame));
    const core::PushId id{frame.meta.push_id().writer(), frame.meta.push_id().incarnation(),
                          frame.meta.push_id().seq()};
    ServerNode::OnPeerRequest(conn, std::move(frame));
    // The loop thread waits (bounded) until the handler thread applied it.
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (!push_window().Applied(id) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(1ms);
    }
    if (!push_window().Applied(id)) return;
    ++dropped;
    messenger().transport().Close(conn, Status(Code::kUnavailable, "test: answer dropped"));
  }
};

// A server whose switch for a scale-in the test starts by itself, before the scheduler
// announces any scale: it then holds the scale's view while its ranges' primaries still
// serve the old one, as a server that learned of the scale first does.
class EarlySwitchServer : public ServerNode {
 public:
  EarlySwitchServer(NodeOptions o, core::ParamStore::Options store) : ServerNode(std::move(o), store) {}
  // Switches for a scale-in of `leaving`; false when the move did not end in the deadline.
  bool SwitchForScaleIn(const std::vector<std::string>& leaving) {
    pb::ScaleInMessage msg;
    for (const std::string& id : leaving) msg.add_leaving_node_ids(id);
    auto moved = std::make_shared<std::promise<void>>();
    std::future<void> done = moved->get_future();
    loop()->RunAndWait([this, &msg, moved] { OnScaleInStart(msg, [moved] { moved->set_value(); }); });
    return done.wait_for(kDeadline) == std::future_status::ready;
  }
};

}  // namespace

TEST_CASE("replica chains: each range on R consecutive ranks and its primary the first live one", "[replication]") {
  CHECK(core::ReplicaChain(2, 3, 2) == std::vector<int>{2, 0});
  CHECK(core::ReplicaChain(0, 3, 5) == std::vector<int>{0, 1, 2});  // at most the server count
  CHECK(core::ReplicaChain(0, 3, 0) == std::vector<int>{0});
  CHECK(core::ReplicaChain(3, 3, 2).empty());
  CHECK(core::HoldsRange(0, 2, 3, 2));
  CHECK_FALSE(core::HoldsRange(1, 2, 3, 2));
  CHECK(core::PrimaryOf(1, 3, 2, {1, 1, 1}) == 1);
  CHECK(core::PrimaryOf(1, 3, 2, {1, 0, 1}) == 2);
  CHECK(core::PrimaryOf(2, 3, 2, {1, 1, 0}) == 0);
  CHECK(core::PrimaryOf(1, 3, 2, {1, 0, 0}) == -1);  // both copies down
  CHECK(core::PrimaryOf(1, 3, 2, {}) == 1);         // no liveness known: all live
}

TEST_CASE("with replicas=2 a push is on both replicas of its range before it is acknowledged",
          "[replication][net]") {
  ReplicatedJob c(/*servers=*/2, /*replicas=*/2);
  const std::vector<uint64_t> keys = Keys(16);
  for (int round = 1; round <= 3; ++round) {
    // Small values (applied on the loop thread) and large ones (on the handler thread).
    const size_t len = round == 2 ? 32768 : 4;
    std::vector<float> values(keys.size() * len, 1.0f);
    if (round == 2) {
      REQUIRE(Await(c.worker->Push({100, 101}, std::vector<float>(2 * len, 2.0f))).ok());
      for (auto& s : c.servers) {
        CHECK(Stored(*s, 100) == std::vector<float>(len, 2.0f));
        CHECK(Stored(*s, 101) == std::vector<float>(len, 2.0f));
      }
      continue;
    }
    REQUIRE(Await(c.worker->Push(keys, values)).ok());
    // Acknowledged: every key is on both servers (each is the primary of one range and
    // the backup of the other), with every push so far.
    for (uint64_t k : keys) {
      INFO("key " << k << " round " << round);
      for (auto& s : c.servers) CHECK(Stored(*s, k) == std::vector<float>(len, round == 1 ? 1.0f : 2.0f));
    }
  }
  Result<PullResult> pulled = Await(c.worker->Pull(keys));
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>(keys.size() * 4, 2.0f));
}

TEST_CASE("with replicas=2 a server's loss promotes its backup and no acknowledged push is lost",
          "[replication][net]") {
  ReplicatedJob c(/*servers=*/3, /*replicas=*/2);
  const std::vector<uint64_t> keys = Keys(32);
  const std::vector<float> ones(keys.size() * 8, 1.0f);
  for (int i = 0; i < 5; ++i) REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  // Server rank 1 goes away (its heartbeats stop, its links close); its range's backup,
  // rank 2, becomes the primary once the scheduler has timed it out.
  const uint64_t epoch = c.worker->epoch();
  c.ByRank(1).Stop();
  for (int i = 0; i < 5; ++i) REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  Result<PullResult> pulled = Await(c.worker->Pull(keys));
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>(keys.size() * 8, 10.0f));
  CHECK(c.worker->epoch() > epoch);
  // The survivors hold every key of the ranges they serve with all ten pushes.
  for (uint64_t k : keys) {
    const int range = core::ServerForKey(k, 3);
    for (int rank : core::ReplicaChain(range, 3, 2)) {
      if (rank == 1) continue;
      INFO("key " << k << " on rank " << rank);
      CHECK(Stored(c.ByRank(rank), k) == std::vector<float>(8, 10.0f));
    }
  }
}

TEST_CASE("a push whose answer was lost is sent again and applied once on the primary and the backup",
          "[replication][net]") {
  const uint64_t key = 7;
  const int primary = core::ServerForKey(key, 2);
  ReplicatedJob c(/*servers=*/2, /*replicas=*/2, [&](NodeOptions o, int rank) -> std::unique_ptr<ServerNode> {
    if (rank == primary) return std::make_unique<AnswerDroppingServer>(std::move(o), SumStore());
    return std::make_unique<ServerNode>(std::move(o), SumStore());
  });
  auto& dropping = static_cast<AnswerDroppingServer&>(c.ByRank(primary));
  ServerNode& backup = c.ByRank(1 - primary);
  const size_t len = 8192;  // 32 KiB: applied on the handler thread
  REQUIRE(Await(c.worker->Push({key}, std::vector<float>(len, 1.0f))).ok());
  CHECK(dropping.dropped == 1);
  // Sent again with its id: the primary acknowledged the repeat without applying it and
  // forwarded it again; the backup applied it once.
  CHECK(dropping.repeated_pushes() == 1);
  CHECK(Stored(dropping, key) == std::vector<float>(len, 1.0f));
  CHECK(Stored(backup, key) == std::vector<float>(len, 1.0f));
  Result<PullResult> pulled = Await(c.worker->Pull({key}));
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>(len, 1.0f));
}

TEST_CASE("a backup that switched for a scale before its primary applies the primary's forwards: each push once",
          "[replication][scale][net]") {
  // Range 1 of 3 is held by ranks 1 (primary) and 2 (backup). Rank 2, leaving in the
  // scale-in, switches first; the primary, still on the old view, applies a worker's push
  // and forwards it. Refused there, the push would be answered unavailable although the
  // primary applied it, and the worker's re-send after the scale would apply it again.
  ReplicatedJob c(/*servers=*/3, /*replicas=*/2, [](NodeOptions o, int rank) -> std::unique_ptr<ServerNode> {
    if (rank == 2) return std::make_unique<EarlySwitchServer>(std::move(o), SumStore());
    return std::make_unique<ServerNode>(std::move(o), SumStore());
  });
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; keys.size() < 8; ++k) {
    if (core::ServerForKey(k, 3) == 1) keys.push_back(k);
  }
  auto& backup = static_cast<EarlySwitchServer&>(c.ByRank(2));
  ServerNode& primary = c.ByRank(1);
  const std::vector<float> ones(keys.size() * 4, 1.0f);
  REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  REQUIRE(backup.SwitchForScaleIn({backup.options().node_id}));
  // Before the worker's recovery_timeout (30 s): acknowledged, not retried until it gives up.
  for (int i = 0; i < 2; ++i) REQUIRE(Await(c.worker->Push(keys, ones), 20s).ok());
  for (uint64_t k : keys) {
    INFO("key " << k);
    CHECK(Stored(primary, k) == std::vector<float>(4, 3.0f));
    CHECK(Stored(backup, k) == std::vector<float>(4, 3.0f));
  }
  CHECK(primary.repeated_pushes() == 0);
  Result<PullResult> pulled = Await(c.worker->Pull(keys));
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>(keys.size() * 4, 3.0f));
}

namespace {

// Whether the worker's metadata marks server `node_id` alive.
bool AliveFor(WorkerNode& worker, const std::string& node_id) {
  const pb::SendMetadataMessage md = worker.metadata();
  for (const pb::ServersMeta& s : md.servers_meta()) {
    if (s.node_id() == node_id) return s.is_alive();
  }
  return false;
}

}  // namespace

TEST_CASE("with replicas=2 a server back empty is rebuilt while pushes go on, and its copy is complete",
          "[replication][resync][net]") {
  ReplicatedJob c(/*servers=*/3, /*replicas=*/2);
  const std::vector<uint64_t> keys = Keys(48);
  const std::vector<float> ones(keys.size() * 8, 1.0f);
  int acked = 0;
  for (int i = 0; i < 3; ++i, ++acked) REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  // Rank 1 is lost (it holds range 1, chain 1 2, and backs up range 0, chain 0 1); pushes
  // go on to the promoted primaries.
  ServerNode& lost = c.ByRank(1);
  lost.Stop();
  for (int i = 0; i < 3; ++i, ++acked) REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  // It comes back empty (a new process with its node id): resyncing, while a thread
  // keeps pushing.
  NodeOptions o = c.Opts("s1");
  o.rank = 1;
  ServerNode* replaced = nullptr;
  for (auto& s : c.servers) {
    if (s.get() != &lost) continue;
    s = std::make_unique<ServerNode>(o, SumStore());
    replaced = s.get();
  }
  REQUIRE(replaced != nullptr);
  ServerNode& back = *replaced;
  std::atomic<bool> stop{false};
  std::atomic<int> pushed{0};
  std::atomic<bool> failed{false};
  std::thread pusher([&] {
    while (!stop) {
      // No Catch2 assertion off the test's thread: a failure is recorded and checked there.
      std::future<Status> f = c.worker->Push(keys, ones);
      if (f.wait_for(kDeadline) != std::future_status::ready || !f.get().ok()) {
        failed = true;
        return;
      }
      ++pushed;
    }
  });
  REQUIRE(back.Start().ok());
  const auto until = std::chrono::steady_clock::now() + kDeadline;
  while (!AliveFor(*c.worker, "s1") && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  const bool alive = AliveFor(*c.worker, "s1");
  // A few pushes more once it is a live replica again (it is the primary of range 1).
  const int at_alive = pushed.load();
  while (alive && !failed && pushed < at_alive + 3 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  stop = true;
  pusher.join();
  REQUIRE(alive);
  REQUIRE_FALSE(failed);
  acked += pushed.load();
  CHECK(pushed > 0);
  // Its copy is complete: every key of the ranges it holds has every acknowledged push.
  const std::vector<float> want(8, static_cast<float>(acked));
  for (uint64_t k : keys) {
    if (!core::HoldsRange(1, core::ServerForKey(k, 3), 3, 2)) continue;
    INFO("key " << k);
    CHECK(Stored(back, k) == want);
  }
  // The other replica of its range is lost now: the rebuilt copy serves range 1 and
  // range 0's backup is gone too (range 0 lives on on rank 0), every sum still there.
  c.ByRank(2).Stop();
  Result<PullResult> pulled = Await(c.worker->Pull(keys));
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>(keys.size() * 8, static_cast<float>(acked)));
}

namespace {

Status Admin(SchedulerNode& s, pb::AdminRequest req) {
  auto p = std::make_shared<std::promise<Status>>();
  std::future<Status> f = p->get_future();
  s.loop()->Post([&s, req, p] { s.Admin(req, [p](Status st, pb::AdminResponse) { p->set_value(st); }); });
  if (f.wait_for(kDeadline) != std::future_status::ready) return Status(Code::kTimeout, "admin not answered");
  return f.get();
}

bool WaitReady(SchedulerNode& s, WorkerNode& w, int servers) {
  const auto until = std::chrono::steady_clock::now() + kDeadline;
  while (std::chrono::steady_clock::now() < until) {
    if (s.cluster_state() == pb::CLUSTER_READY && w.server_count() == servers) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// Every key is on each member of its range's chain under `n` servers with `sum`.
void CheckChains(ReplicatedJob& c, const std::vector<uint64_t>& keys, int n, float sum, size_t len) {
  for (uint64_t k : keys) {
    for (int rank : core::ReplicaChain(core::ServerForKey(k, n), n, 2)) {
      INFO("key " << k << " on rank " << rank << " of " << n);
      CHECK(Stored(c.ByRank(rank), k) == std::vector<float>(len, sum));
    }
  }
  // Once READY under the new view (each server applies it on its own loop), a server out of
  // a key's chain drops its copy.
  auto held_elsewhere = [&] {
    for (uint64_t k : keys) {
      const std::vector<int> chain = core::ReplicaChain(core::ServerForKey(k, n), n, 2);
      for (int rank = 0; rank < n; ++rank) {
        if (std::find(chain.begin(), chain.end(), rank) == chain.end() && !Stored(c.ByRank(rank), k).empty()) {
          return true;
        }
      }
    }
    return false;
  };
  const auto until = std::chrono::steady_clock::now() + kDeadline;
  while (held_elsewhere() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  CHECK_FALSE(held_elsewhere());
}

}  // namespace

TEST_CASE("with replicas=2 a scale-out fills each range's new chain, and a server lost after it loses nothing",
          "[replication][scale][net]") {
  ReplicatedJob c(/*servers=*/2, /*replicas=*/2);
  const std::vector<uint64_t> keys = Keys(48);
  const std::vector<float> ones(keys.size() * 4, 1.0f);
  for (int i = 0; i < 3; ++i) REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  pb::AdminRequest req;
  req.set_op("scale_out");
  req.set_worker_num(1);
  req.set_server_num(3);
  REQUIRE(Admin(*c.sched, req).ok());
  NodeOptions o = c.Opts("s2");
  c.servers.push_back(std::make_unique<ServerNode>(o, SumStore()));
  REQUIRE(c.servers.back()->Start().ok());
  REQUIRE(WaitReady(*c.sched, *c.worker, 3));
  for (int i = 0; i < 3; ++i) REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  CheckChains(c, keys, 3, 6.0f, 4);
  // Any one server lost now: every range keeps a full copy.
  c.ByRank(1).Stop();
  Result<PullResult> pulled = Await(c.worker->Pull(keys));
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>(keys.size() * 4, 6.0f));
}

TEST_CASE("with replicas=2 a scale-in fills each range's new chain, and a server lost after it loses nothing",
          "[replication][scale][net]") {
  ReplicatedJob c(/*servers=*/3, /*replicas=*/2);
  const std::vector<uint64_t> keys = Keys(48);
  const std::vector<float> ones(keys.size() * 4, 1.0f);
  for (int i = 0; i < 3; ++i) REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  pb::AdminRequest req;
  req.set_op("scale_in");
  req.add_node_ids("s2");
  REQUIRE(Admin(*c.sched, req).ok());
  REQUIRE(WaitReady(*c.sched, *c.worker, 2));
  for (int i = 0; i < 3; ++i) REQUIRE(Await(c.worker->Push(keys, ones)).ok());
  for (uint64_t k : keys) {
    INFO("key " << k);
    CHECK(Stored(c.ByRank(0), k) == std::vector<float>(4, 6.0f));
    CHECK(Stored(c.ByRank(1), k) == std::vector<float>(4, 6.0f));
  }
  c.ByRank(0).Stop();
  Result<PullResult> pulled = Await(c.worker->Pull(keys));
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>(keys.size() * 4, 6.0f));
}

}  // namespace pscore::node
