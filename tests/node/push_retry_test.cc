// Workers ride through a lost server link: a push whose answer never came is sent again
// with the same push id and applied once (by the same server, or by one restarted from its
// data_dir, whose journal kept the id), and a part whose server stays away fails after
// recovery_timeout with a status naming the server and the tries; a push whose answer was
// lost while a scale-out began is split for the new server count and still applied once
// (its parts name it as their origin; the new owner received its window with the entries).
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pscore/core/key_range.h"
#include "multiproc/process.h"  // TempDir
#include "node/full_disk.h"
#include "node/poll_until.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;
using pscore::testing::PollUntil;
constexpr auto kDeadline = std::chrono::seconds(30);

template <typename T>
T Await(std::future<T>&& f, Duration timeout = kDeadline) {
  if (f.wait_for(timeout) != std::future_status::ready) FAIL("no answer within the deadline");
  return f.get();
}

// A server whose links fail on built-in pushes: the first `apply_then_drop` pushes are
// handed to the handler thread, and their link is closed once the push is applied and
// before its answer is written (the answer is lost, the push is not); after those, with `refuse_after`, every data request's link is
// closed before it is served. Pushes of kFloats floats (over 16 KiB) always go to the
// handler thread, never run inline on the loop.
class AnswerDroppingServer : public ServerNode {
 public:
  AnswerDroppingServer(NodeOptions o, core::ParamStore::Options store, int apply_then_drop, bool refuse_after)
      : ServerNode(std::move(o), store), drops_left_(apply_then_drop), refuse_after_(refuse_after) {}
  std::atomic<int> applied_then_dropped{0};

 protected:
  void OnPeerRequest(comm::ConnId conn, comm::Frame&& frame) override {
    const bool push = frame.meta.cmd() == pb::SEND_DATA && frame.meta.handler() == kPushHandler;
    if (push && drops_left_ > 0) {
      const core::PushId id{frame.meta.push_id().writer(), frame.meta.push_id().incarnation(),
                            frame.meta.push_id().seq()};
      ServerNode::OnPeerRequest(conn, std::move(frame));
      // The loop thread waits (bounded) until the handler thread applied the push: its
      // answer, posted to this loop, then finds the link closed.
      const auto until = std::chrono::steady_clock::now() + 10s;
      while (!push_window().Applied(id) && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(1ms);
      }
      if (!push_window().Applied(id)) return;  // not applied (refused or held): left alone
      --drops_left_;
      messenger().transport().Close(conn, Status(Code::kUnavailable, "test: answer dropped"));
      ++applied_then_dropped;
      return;
    }
    if (frame.meta.cmd() == pb::SEND_DATA && refuse_after_ && applied_then_dropped > 0) {
      messenger().transport().Close(conn, Status(Code::kUnavailable, "test: refused"));
      return;
    }
    ServerNode::OnPeerRequest(conn, std::move(frame));
  }

 private:
  int drops_left_;  // loop thread
  const bool refuse_after_;
};

constexpr size_t kFloats = 8192;  // 32 KiB a push

std::vector<float> Filled(float v) { return std::vector<float>(kFloats, v); }

core::ParamStore::Options SumStore() {
  core::ParamStore::Options o;
  o.rule = core::UpdateRule::kSum;
  return o;
}

class Cluster {
 public:
  explicit Cluster(int server_num = 1) {
    SchedulerOptions so;
    so.server_num = server_num;
    so.recoverable_roles = {pb::SERVER, pb::WORKER};  // servers restart with their node id here
    so.heartbeat_interval = 50ms;
    so.heartbeat_timeout = 3s;
    sched_ = std::make_unique<SchedulerNode>(so);
    REQUIRE(sched_->Start().ok());
  }
  ~Cluster() {
    if (worker) worker->Stop();
    for (auto& s : servers) s->Stop();
    sched_->Stop();
  }
  NodeOptions Opts(const std::string& id) const {
    NodeOptions o;
    o.scheduler_port = sched_->port();
    o.node_id = id;
    o.heartbeat_interval = 50ms;
    o.connect_timeout = 2s;
    o.handler_threads = 1;
    return o;
  }
  void StartWorker(Duration recovery_timeout, Duration connect_timeout = 2s) {
    NodeOptions o = Opts("w0");
    o.recovery_timeout = recovery_timeout;
    o.connect_timeout = connect_timeout;
    worker = std::make_unique<WorkerNode>(o);
    REQUIRE(worker->Start().ok());
    REQUIRE(worker->WaitForReady(kDeadline).ok());
    // The servers know the worker (their metadata lists it) before it pushes.
    for (auto& s : servers) REQUIRE(s->WaitForReady(kDeadline).ok());
  }
  float Value(uint64_t key) {
    Result<PullResult> r = Await(worker->Pull({key}));
    REQUIRE(r.ok());
    REQUIRE(r->values.size() == kFloats);
    return r->values[0];
  }

  SchedulerNode& sched() { return *sched_; }

  std::vector<std::unique_ptr<ServerNode>> servers;
  std::unique_ptr<WorkerNode> worker;

 private:
  std::unique_ptr<SchedulerNode> sched_;
};

// A server that keeps the first built-in push it gets unserved until Release: then (on its
// loop) it serves it and closes the link once the push is applied, before its answer is
// written. The test starts a scale in between, so the worker sends the push again only
// after the scale, split for the new server count.
class HeldPushServer : public ServerNode {
 public:
  HeldPushServer(NodeOptions o, core::ParamStore::Options store) : ServerNode(std::move(o), store) {}
  std::atomic<bool> holding{false};
  std::atomic<bool> dropped{false};

  void Release() {
    loop()->Run([this] {
      const core::PushId id{held_.meta.push_id().writer(), held_.meta.push_id().incarnation(),
                            held_.meta.push_id().seq()};
      ServerNode::OnPeerRequest(held_conn_, std::move(held_));
      const auto until = std::chrono::steady_clock::now() + 10s;
      while (!push_window().Applied(id) && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(1ms);
      }
      if (!push_window().Applied(id)) return;
      messenger().transport().Close(held_conn_, Status(Code::kUnavailable, "test: answer dropped"));
      dropped = true;
    });
  }

 protected:
  void OnPeerRequest(comm::ConnId conn, comm::Frame&& frame) override {
    const bool push = frame.meta.cmd() == pb::SEND_DATA && frame.meta.handler() == kPushHandler;
    if (!push || taken_) return ServerNode::OnPeerRequest(conn, std::move(frame));
    taken_ = true;
    held_conn_ = conn;
    held_ = std::move(frame);
    holding = true;
  }

 private:
  bool taken_ = false;  // loop thread
  comm::ConnId held_conn_ = 0;
  comm::Frame held_;
};

// A server that a worker cannot reach while `cut` is set: every link a worker dialled (its
// HELLO says WORKER) is closed at its first request (data or PING), unserved. Other
// servers' links to it work, so the scheduler and they hear it.
class WorkerCutServer : public ServerNode {
 public:
  WorkerCutServer(NodeOptions o, core::ParamStore::Options store) : ServerNode(std::move(o), store) {}
  std::atomic<bool> cut{false};
  std::atomic<int> dropped{0};

 protected:
  void OnPeerRequest(comm::ConnId conn, comm::Frame&& frame) override {
    if (frame.meta.cmd() == pb::HELLO) {
      from_worker_[conn] = frame.meta.role() == pb::WORKER;
    } else if (cut && from_worker_[conn]) {
      ++dropped;
      messenger().transport().Close(conn, Status(Code::kUnavailable, "test: link cut"));
      return;
    }
    ServerNode::OnPeerRequest(conn, std::move(frame));
  }

 private:
  std::unordered_map<comm::ConnId, bool> from_worker_;  // loop thread
};

// The server of rank `rank` in a cluster of WorkerCutServers.
WorkerCutServer& CutServerOfRank(Cluster& c, int rank) {
  for (auto& s : c.servers) {
    if (s->rank() == rank) return static_cast<WorkerCutServer&>(*s);
  }
  FAIL("no server has rank " << rank);
  return static_cast<WorkerCutServer&>(*c.servers[0]);
}

// Runs an admin operation on the scheduler's loop; its answer, or kTimeout after kDeadline.
Status Admin(SchedulerNode& s, pb::AdminRequest req) {
  auto p = std::make_shared<std::promise<Status>>();
  std::future<Status> f = p->get_future();
  s.loop()->Post([&s, req, p] { s.Admin(req, [p](Status st, pb::AdminResponse) { p->set_value(st); }); });
  if (f.wait_for(kDeadline) != std::future_status::ready) return Status(Code::kTimeout, "admin not answered");
  return f.get();
}

TEST_CASE("a push whose answer was lost with its link is sent again and applied once", "[node][net][retry]") {
  Cluster c;
  auto* server = new AnswerDroppingServer(c.Opts("s0"), SumStore(), /*apply_then_drop=*/1, /*refuse_after=*/false);
  c.servers.emplace_back(server);
  REQUIRE(server->Start().ok());
  c.StartWorker(10s);

  REQUIRE(Await(c.worker->Push({1}, Filled(1.0f))).ok());  // applied, answer lost, sent again
  REQUIRE(Await(c.worker->Push({1}, Filled(2.0f))).ok());  // an ordinary push after it
  REQUIRE(server->applied_then_dropped == 1);
  CHECK(server->repeated_pushes() == 1);  // the repeat was acknowledged, not applied
  CHECK(c.Value(1) == 3.0f);
}

TEST_CASE("a push applied by a server that died before answering is applied once by its restart from data_dir",
          "[node][net][retry][journal]") {
  testing::TempDir dir;
  Cluster c;
  NodeOptions so = c.Opts("s0");
  so.data_dir = dir.File("s0");
  auto* first = new AnswerDroppingServer(so, SumStore(), /*apply_then_drop=*/1, /*refuse_after=*/true);
  c.servers.emplace_back(first);
  REQUIRE(first->Start().ok());
  c.StartWorker(20s);

  std::future<Status> pushed = c.worker->Push({5}, Filled(1.0f));
  // The push is applied and journaled, its answer lost; the server answers nothing more.
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  for (;;) {
    const uint64_t key = 5;
    std::vector<uint32_t> lens;
    std::vector<float> values;
    if (first->applied_then_dropped > 0 && first->store().Pull(&key, 1, &lens, &values).ok() && values[0] == 1.0f) {
      break;
    }
    INFO("dropped " << first->applied_then_dropped << ", value " << (values.empty() ? -1.0f : values[0]));
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(5ms);
  }
  first->Stop();
  // Restarted from its data directory, on another port: the journal kept the push's id.
  NodeOptions again = c.Opts("s0");
  again.data_dir = so.data_dir;
  c.servers.push_back(std::make_unique<ServerNode>(again, SumStore()));
  ServerNode& second = *c.servers.back();
  REQUIRE(second.Start().ok());
  REQUIRE(Await(std::move(pushed)).ok());
  CHECK(second.repeated_pushes() == 1);
  CHECK(c.Value(5) == 1.0f);
  REQUIRE(Await(c.worker->Push({5}, Filled(2.0f))).ok());  // a new push is applied as usual
  CHECK(c.Value(5) == 3.0f);
}

// A server with a data_dir whose disk refuses the journal's next write.
struct FullDiskServer {
  FullDiskServer(Cluster& c, const testing::TempDir& dir, Duration recovery_timeout) {
    NodeOptions so = c.Opts("s0");
    so.data_dir = dir.File("s0");
    data_dir = so.data_dir;
    c.servers.push_back(std::make_unique<ServerNode>(so, SumStore()));
    server = c.servers.back().get();
    REQUIRE(server->Start().ok());
    c.StartWorker(recovery_timeout);
    REQUIRE(Await(c.worker->Push({5}, Filled(1.0f))).ok());
    full = std::make_unique<testing::FileSizeLimit>(testing::NewestSegmentBytes(data_dir) + 1024);
    REQUIRE(full->ok());
  }
  float Stored() const {
    const uint64_t key = 5;
    std::vector<uint32_t> lens;
    std::vector<float> values;
    REQUIRE(server->store().Pull(&key, 1, &lens, &values).ok());
    return values[0];
  }
  std::string data_dir;
  ServerNode* server = nullptr;
  std::unique_ptr<testing::FileSizeLimit> full;
};

TEST_CASE("a push the server cannot journal - its disk refuses the write - is sent again and applied once the disk takes it",
          "[node][net][retry][journal]") {
  testing::TempDir dir;
  Cluster c;
  FullDiskServer s(c, dir, 30s);
  std::future<Status> pushed = c.worker->Push({5}, Filled(2.0f));  // 32 KiB: past the room left
  // Refused (nothing applied), sent again, refused again.
  REQUIRE(PollUntil([&] { return s.server->journal_errors() >= 2; }, kDeadline));
  CHECK(pushed.wait_for(0s) == std::future_status::timeout);  // not acknowledged
  CHECK(s.Stored() == 1.0f);
  s.full->Lift();
  REQUIRE(Await(std::move(pushed)).ok());
  CHECK(s.server->repeated_pushes() == 0);  // none of the refused sends had been applied
  CHECK(c.Value(5) == 3.0f);
  // The journal holds both pushes once: a restart from the data_dir serves their sum.
  s.server->Stop();
  NodeOptions again = c.Opts("s0");
  again.data_dir = s.data_dir;
  c.servers.push_back(std::make_unique<ServerNode>(again, SumStore()));
  REQUIRE(c.servers.back()->Start().ok());
  CHECK(c.Value(5) == 3.0f);
}

TEST_CASE("a push the disk keeps refusing fails after recovery_timeout - the status says the server cannot journal it",
          "[node][net][retry][journal]") {
  testing::TempDir dir;
  Cluster c;
  FullDiskServer s(c, dir, 1500ms);
  Status push = Await(c.worker->Push({5}, Filled(2.0f)));
  REQUIRE_FALSE(push.ok());
  INFO("push: " << push);
  CHECK(push.code() == Code::kUnavailable);
  CHECK_THAT(push.message(), Catch::Contains("server s0 cannot journal the change"));
  CHECK_THAT(push.message(), Catch::Contains("File too large"));
  CHECK(s.server->journal_errors() >= 2);
  CHECK(s.Stored() == 1.0f);  // nothing of it applied
  s.full->Lift();
  REQUIRE(Await(c.worker->Push({5}, Filled(4.0f))).ok());  // the disk takes writes again
  CHECK(c.Value(5) == 5.0f);
}

TEST_CASE("a part whose server stays away fails after recovery_timeout - the status names the server and the tries",
          "[node][net][retry]") {
  Cluster c;
  c.servers.push_back(std::make_unique<ServerNode>(c.Opts("s-gone"), SumStore()));
  REQUIRE(c.servers.back()->Start().ok());
  c.StartWorker(1500ms);
  REQUIRE(Await(c.worker->Push({1}, Filled(1.0f))).ok());
  c.servers.back()->Stop();
  Status push = Await(c.worker->Push({1}, Filled(1.0f)));
  Result<PullResult> pull = Await(c.worker->Pull({1}));
  REQUIRE_FALSE(push.ok());
  INFO("push: " << push);
  CHECK(push.code() == Code::kUnavailable);
  CHECK_THAT(push.message(), Catch::Contains("s-gone (127.0.0.1:"));
  CHECK_THAT(push.message(), Catch::Contains("recovery_timeout 1500 ms"));
  CHECK_THAT(push.message(), Catch::Contains("times over"));
  REQUIRE_FALSE(pull.ok());
  CHECK_THAT(pull.status().message(), Catch::Contains("s-gone"));
  CHECK_THAT(push.message(), !Catch::Contains("sent 1 times"));  // retried, not failed at once
}

TEST_CASE("a dial to a server's old address ends when it restarts elsewhere - the part goes to the new one",
          "[node][net][retry]") {
  Cluster c;
  c.servers.push_back(std::make_unique<ServerNode>(c.Opts("s0"), SumStore()));
  REQUIRE(c.servers.back()->Start().ok());
  // A connect timeout past the test's deadline: only the membership change can end the dial.
  c.StartWorker(/*recovery_timeout=*/60s, /*connect_timeout=*/120s);
  REQUIRE(Await(c.worker->Push({1}, Filled(1.0f))).ok());
  c.servers.back()->Stop();
  // Sent while s0 is gone: the link is lost and the dial to its address is refused, again
  // and again, until the scheduler names s0's new address.
  std::future<Status> pushed = c.worker->Push({1}, Filled(2.0f));
  std::this_thread::sleep_for(300ms);
  c.servers.push_back(std::make_unique<ServerNode>(c.Opts("s0"), SumStore()));  // same id, new port
  REQUIRE(c.servers.back()->Start().ok());
  Status st = Await(std::move(pushed));
  INFO("push: " << st);
  REQUIRE(st.ok());
  CHECK(c.Value(1) == 2.0f);  // the restart kept nothing (no data_dir); the push reached it
}

TEST_CASE("a push whose answer was lost as a scale-out began is split for the new server count and applied once",
          "[node][net][retry][scale]") {
  Cluster c;
  auto* s0 = new HeldPushServer(c.Opts("s0"), SumStore());
  c.servers.emplace_back(s0);
  REQUIRE(s0->Start().ok());
  c.StartWorker(/*recovery_timeout=*/20s);
  // One key of each server's range once there are two.
  std::vector<uint64_t> keys;
  for (int want = 0; want < 2; ++want) {
    uint64_t k = 1;
    while (core::ServerForKey(k, 2) != want) k += uint64_t{1} << 58;
    keys.push_back(k);
  }
  std::vector<float> ones(2 * kFloats, 1.0f);
  std::future<Status> pushed = c.worker->Push(keys, ones);
  REQUIRE(PollUntil([&] { return s0->holding.load(); }, kDeadline));
  pb::AdminRequest out;
  out.set_op("scale_out");
  out.set_worker_num(1);
  out.set_server_num(2);
  REQUIRE(Admin(c.sched(), out).ok());
  REQUIRE(PollUntil([&] { return c.worker->cluster_state() == pb::CLUSTER_SCALE_OUT; }, kDeadline));
  // Applied under the one-server view, its answer lost: the worker holds it for the scale.
  s0->Release();
  REQUIRE(PollUntil([&] { return s0->dropped.load(); }, kDeadline));
  c.servers.push_back(std::make_unique<ServerNode>(c.Opts("s1"), SumStore()));
  REQUIRE(c.servers.back()->Start().ok());
  Status st = Await(std::move(pushed));
  INFO("push: " << st);
  REQUIRE(st.ok());
  REQUIRE(c.worker->server_count() == 2);
  // Sent again as two parts, one per server, each naming the lost part as its origin: the
  // old owner and the new one (which received the window with the moved entry) both
  // acknowledge without applying.
  Result<PullResult> pulled = Await(c.worker->Pull(keys));
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>(2 * kFloats, 1.0f));
  CHECK(s0->repeated_pushes() + c.servers.back()->repeated_pushes() == 2);
  REQUIRE(Await(c.worker->Push(keys, ones)).ok());  // a new push is applied as usual
  pulled = Await(c.worker->Pull(keys));
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>(2 * kFloats, 2.0f));
}

TEST_CASE("a worker cut off from one server reaches it through another - pushes applied once, pulls exact - and "
          "goes direct again once the cut ends",
          "[node][net][retry][relay]") {
  Cluster c(/*server_num=*/2);
  c.servers.emplace_back(new ServerNode(c.Opts("s0"), SumStore()));
  auto* cut = new WorkerCutServer(c.Opts("s1"), SumStore());
  c.servers.emplace_back(cut);
  for (auto& s : c.servers) REQUIRE(s->Start().ok());
  c.StartWorker(10s);
  ServerNode& relay = *c.servers[0];
  // A key of the cut server's, and a large one (2 MiB ZPushes, written from the caller's
  // vector: the relay receives them whole and forwards them).
  const int target = cut->rank();
  REQUIRE(target >= 0);
  uint64_t key = 0;
  while (core::ServerForKey(key, 2) != target) ++key;
  uint64_t big = key + 1;
  while (core::ServerForKey(big, 2) != target) ++big;
  constexpr size_t kBig = 512 * 1024;
  REQUIRE(Await(c.worker->Push({key}, Filled(1.0f))).ok());  // direct, before the cut
  // The relay holds a stale copy of the large key (as a server may, of keys it owned
  // before a scale): a relayed push must not be applied to it.
  relay.store().Insert(big, std::vector<float>(kBig, 0.0f));

  cut->cut = true;
  for (int i = 0; i < 5; ++i) REQUIRE(Await(c.worker->Push({key}, Filled(1.0f))).ok());
  auto threes = std::make_shared<const std::vector<float>>(kBig, 3.0f);
  REQUIRE(Await(c.worker->ZPush({big}, threes)).ok());
  REQUIRE(Await(c.worker->ZPush({big}, threes)).ok());
  CHECK(c.Value(key) == 6.0f);  // each push applied once
  Result<PullResult> pulled = Await(c.worker->Pull({big}));
  REQUIRE(pulled.ok());
  REQUIRE(pulled->values.size() == kBig);
  CHECK(pulled->values.front() == 6.0f);
  CHECK(pulled->values.back() == 6.0f);
  CHECK(cut->dropped > 0);
  // Nothing reached the cut server directly: every push went through the other server.
  CHECK(relay.relayed_requests() >= 7);
  CHECK(c.worker->relayed_parts() >= 7);
  CHECK(relay.relay_failures() == 0);
  // The relay applied none of it: its stale copy is as it was.
  CHECK(relay.store().num_keys() == 1);
  std::vector<uint32_t> lens;
  std::vector<float> held;
  REQUIRE(relay.store().Pull(&big, 1, &lens, &held).ok());
  CHECK(held == std::vector<float>(kBig, 0.0f));
  CHECK(cut->store().num_keys() == 2);

  cut->cut = false;
  // Within a few heartbeat intervals a probe finds the direct link and parts go there.
  bool direct = false;
  int pushes = 0;
  const auto until = std::chrono::steady_clock::now() + kDeadline;
  while (!direct && std::chrono::steady_clock::now() < until) {
    const uint64_t before = c.worker->relayed_parts();
    REQUIRE(Await(c.worker->Push({key}, Filled(1.0f))).ok());
    ++pushes;
    direct = c.worker->relayed_parts() == before;
    if (!direct) std::this_thread::sleep_for(20ms);
  }
  CHECK(direct);
  CHECK(c.Value(key) == 6.0f + pushes);
}

TEST_CASE("a relay timed out with a relayed push unread - the push goes through the next relay, later pushes stay "
          "behind it, the stale copy is not applied again",
          "[node][net][retry][relay]") {
  Cluster c(/*server_num=*/3);
  std::atomic<bool> relay_timed_out{false};
  for (const char* id : {"s0", "s1", "s2"}) {
    core::ParamStore::Options assign;
    assign.rule = core::UpdateRule::kAssign;  // the last push applied is the value pulled
    c.servers.emplace_back(new WorkerCutServer(c.Opts(id), assign));
  }
  for (auto& s : c.servers) REQUIRE(s->Start().ok());
  c.StartWorker(10s);
  // Server rank 0 is cut; rank 1, the next live server, relays for it.
  WorkerCutServer& cut = CutServerOfRank(c, 0);
  WorkerCutServer& relay = CutServerOfRank(c, 1);
  WorkerCutServer& next = CutServerOfRank(c, 2);
  const std::string relay_id = relay.options().node_id;
  c.sched().AddEventListener([&relay_timed_out, relay_id](const core::Event& e) {
    if (e.kind == core::Event::Kind::kNodeTimedOut && e.node_id == relay_id) relay_timed_out = true;
  });
  uint64_t key = 0;
  while (core::ServerForKey(key, 3) != 0) ++key;
  cut.cut = true;
  REQUIRE(Await(c.worker->Push({key}, Filled(1.0f))).ok());
  REQUIRE(relay.relayed_requests() == 1);

  // The relay's loop stalls past the heartbeat timeout (3 s) with push B unread in its
  // socket: the scheduler times it out while it still holds B.
  std::atomic<bool> stalled{false};
  relay.loop()->Post([&stalled] {
    stalled = true;
    std::this_thread::sleep_for(4500ms);
  });
  REQUIRE(PollUntil([&stalled] { return stalled.load(); }, 5000ms));
  auto b = c.worker->Push({key}, Filled(2.0f));
  REQUIRE(PollUntil([&relay_timed_out] { return relay_timed_out.load(); }, 5000ms));
  // C, issued after B, is applied after it: B is sent again through the next relay and C
  // follows it there.
  auto push_c = c.worker->Push({key}, Filled(3.0f));
  REQUIRE(Await(std::move(b)).ok());
  REQUIRE(Await(std::move(push_c)).ok());
  CHECK(next.relayed_requests() >= 2);
  CHECK(c.Value(key) == 3.0f);
  // Once its loop runs again the old relay reads the stale B and forwards it: the cut
  // server knows its push id and does not apply it over C.
  const uint64_t repeats = cut.repeated_pushes();
  REQUIRE(PollUntil([&cut, repeats] { return cut.repeated_pushes() > repeats; }, 10000ms));
  CHECK(relay.relayed_requests() == 2);
  CHECK(c.Value(key) == 3.0f);
  CHECK(cut.store().num_keys() == 1);
}

TEST_CASE("a route around a cut survives a scale-in that renumbers its target - every push applied once",
          "[node][net][retry][relay][scale]") {
  Cluster c(/*server_num=*/3);
  for (const char* id : {"s0", "s1", "s2"}) c.servers.emplace_back(new WorkerCutServer(c.Opts(id), SumStore()));
  for (auto& s : c.servers) REQUIRE(s->Start().ok());
  c.StartWorker(/*recovery_timeout=*/20s);
  // Rank 2 is cut off from the worker and relayed through rank 0; rank 1 leaves, so the
  // cut server becomes rank 1 while its route was keyed by rank 2.
  WorkerCutServer& cut = CutServerOfRank(c, 2);
  WorkerCutServer& relay = CutServerOfRank(c, 0);
  WorkerCutServer& leaving = CutServerOfRank(c, 1);
  // Two keys of each server's range under three servers, spread over the id space (under
  // two servers they change hands).
  std::vector<uint64_t> keys;
  for (int want = 0; want < 3; ++want) {
    int found = 0;
    for (uint64_t k = 1; found < 2; k += uint64_t{1} << 57) {
      if (core::ServerForKey(k, 3) != want) continue;
      keys.push_back(k);
      ++found;
    }
  }
  std::vector<float> ones(keys.size() * kFloats, 1.0f);
  cut.cut = true;
  int pushes = 0;
  auto push = [&] {
    Status st = Await(c.worker->Push(keys, ones));
    INFO("push " << pushes << ": " << st);
    REQUIRE(st.ok());
    ++pushes;
  };
  for (int i = 0; i < 3; ++i) push();
  const uint64_t relayed_before = relay.relayed_requests();
  CHECK(relayed_before >= 3);

  pb::AdminRequest req;
  req.set_op("scale_in");
  req.add_node_ids(leaving.options().node_id);
  REQUIRE(Admin(c.sched(), req).ok());
  // The worker pushes on while the servers migrate and renumber.
  const auto until = std::chrono::steady_clock::now() + kDeadline;
  while (c.worker->server_count() != 2 || c.worker->cluster_state() != pb::CLUSTER_READY) {
    REQUIRE(std::chrono::steady_clock::now() < until);
    push();
  }
  REQUIRE(leaving.WaitForTermination(15s).ok());
  CHECK(cut.rank() == 1);
  CHECK(relay.rank() == 0);
  // The cut server, now rank 1, is still reached only through the relay.
  const uint64_t relayed_scaled = relay.relayed_requests();
  const int dropped_scaled = cut.dropped;
  for (int i = 0; i < 3; ++i) push();
  CHECK(relay.relayed_requests() > relayed_scaled);
  CHECK(relay.relay_failures() == 0);
  CHECK(cut.dropped >= dropped_scaled);
  // Every push applied once to every key, wherever the key lives now.
  Result<PullResult> pulled = Await(c.worker->Pull(keys));
  REQUIRE(pulled.ok());
  CHECK(pulled->values == std::vector<float>(keys.size() * kFloats, static_cast<float>(pushes)));
  CHECK(cut.store().num_keys() + relay.store().num_keys() == keys.size());
}

TEST_CASE("a route to a server that a scale-in removes ends - pulls take the direct way again",
          "[node][net][retry][relay][scale]") {
  Cluster c(/*server_num=*/3);
  for (const char* id : {"s0", "s1", "s2"}) c.servers.emplace_back(new WorkerCutServer(c.Opts(id), SumStore()));
  for (auto& s : c.servers) REQUIRE(s->Start().ok());
  c.StartWorker(/*recovery_timeout=*/20s);
  WorkerCutServer* cut = &CutServerOfRank(c, 2);
  uint64_t key = 1;
  while (core::ServerForKey(key, 3) != 2) key += uint64_t{1} << 57;
  cut->cut = true;
  REQUIRE(Await(c.worker->Push({key}, Filled(1.0f))).ok());
  REQUIRE(c.worker->relayed_parts() >= 1);
  // While a route exists PullSync takes the loop's way (a direct pull could overtake a
  // relayed push).
  const uint64_t direct_before = c.worker->direct_pulls();
  REQUIRE(c.worker->PullSync({key}).ok());
  CHECK(c.worker->direct_pulls() == direct_before);

  pb::AdminRequest req;
  req.set_op("scale_in");
  req.add_node_ids(cut->options().node_id);
  REQUIRE(Admin(c.sched(), req).ok());
  REQUIRE(cut->WaitForTermination(15s).ok());
  REQUIRE(PollUntil([&c] { return c.worker->server_count() == 2 && c.worker->cluster_state() == pb::CLUSTER_READY; },
                    kDeadline));
  // The key moved to a server the worker reaches; no route is left, so PullSync goes over
  // its direct link again, and the push is there once.
  bool direct = false;
  const auto until = std::chrono::steady_clock::now() + kDeadline;
  while (!direct && std::chrono::steady_clock::now() < until) {
    const uint64_t before = c.worker->direct_pulls();
    Result<PullResult> pulled = c.worker->PullSync({key});
    REQUIRE(pulled.ok());
    REQUIRE(pulled->values == Filled(1.0f));
    direct = c.worker->direct_pulls() > before;
    if (!direct) std::this_thread::sleep_for(20ms);
  }
  CHECK(direct);
}

}  // namespace
}  // namespace pscore::node
