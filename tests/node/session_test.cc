// Scheduler sessions (issue 23, docs/coordination.md "Sessions"): the scheduler hands out a
// session at REGISTER; a restart without --state_dir opens a new one, a restart with it
// keeps it; a request carrying another session is refused kFailedPrecondition naming both,
// and a member so refused registers again by itself and re-issues its re-issuable calls.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/messenger.h"
#include "pscore/core/cluster_manager.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/worker/worker_node.h"
#include "node/test_options.h"

#include "node/raw_link.h"  // last: pulls in Catch

namespace pscore::node {
namespace {

using namespace std::chrono_literals;

SchedulerOptions SchedOpts(int workers) {
  SchedulerOptions o;
  o.worker_num = workers;
  o.server_num = 0;
  o.heartbeat_interval = 100ms;
  o.heartbeat_timeout = 20s;
  return o;
}

NodeOptions WorkerOpts(int sched_port, const std::string& id, Duration interval = 100ms) {
  NodeOptions o = testing::TestWorkerOptions(sched_port, id);
  o.heartbeat_interval = interval;
  o.recovery_timeout = 30s;
  return o;
}

uint64_t SessionOf(SchedulerNode& sched) {
  uint64_t id = 0;
  sched.loop()->RunAndWait([&] { id = sched.cluster().session_id(); });
  return id;
}

// A TRY_GET of `key` sent under `session` on a link of its own.
Result<comm::Frame> TryGetUnder(int port, uint64_t session, const std::string& key) {
  testing::RawLink link(port, "raw");
  pb::KvRequest req;
  req.set_op(pb::KvRequest::TRY_GET);
  req.set_key(key);
  pb::MessageMeta meta = MakeMeta(pb::KV_REQUEST, pb::WORKER, -1);
  meta.set_session_id(session);
  std::future<Result<comm::Frame>> f = link.CallAsync(meta, ToBuffer(req), 5s);
  if (f.wait_for(10s) != std::future_status::ready) return Status(Code::kTimeout, "no answer");
  return f.get();
}

TEST_CASE("sessions: a scheduler restarted without its state opens a new one - the old one is refused naming both - members register again",
          "[node][net][coord][session]") {
  auto sched = std::make_unique<SchedulerNode>(SchedOpts(2));
  REQUIRE(sched->Start().ok());
  const int port = sched->port();
  const uint64_t first = SessionOf(*sched);
  CHECK(first != 0);
  WorkerNode w0(WorkerOpts(port, "w0"));
  WorkerNode w1(WorkerOpts(port, "w1"));
  REQUIRE(w0.Start().ok());
  REQUIRE(w1.Start().ok());
  REQUIRE(w0.WaitForReady(20s).ok());
  REQUIRE(w0.KvSet("before", "1").ok());
  CHECK(TryGetUnder(port, first, "before").ok());  // the current session is accepted

  sched->Stop();
  sched.reset();
  SchedulerOptions so = SchedOpts(2);
  so.port = port;
  sched = std::make_unique<SchedulerNode>(so);
  REQUIRE(sched->Start().ok());
  const uint64_t second = SessionOf(*sched);
  CHECK(second != first);

  Result<comm::Frame> stale = TryGetUnder(port, first, "before");
  REQUIRE_FALSE(stale.ok());
  CHECK(stale.status().code() == Code::kFailedPrecondition);
  CHECK(core::IsStaleSession(stale.status()));
  CHECK_THAT(stale.status().message(), Catch::Contains(std::to_string(first)) &&
                                           Catch::Contains(std::to_string(second)) &&
                                           Catch::Contains("register again"));
  // The members register again (the old state is gone) and carry on in the new session.
  REQUIRE(w0.KvSet("after", "2").ok());
  // Named participants: the round waits for both whichever re-registers first.
  Status w0_passed;
  std::thread other([&] { w0_passed = w0.Barrier("b", 20s, {"w0", "w1"}); });
  Status w1_passed = w1.Barrier("b", 20s, {"w0", "w1"});
  other.join();
  INFO(w0_passed.ToString() << " / " << w1_passed.ToString());
  CHECK(w0_passed.ok());
  CHECK(w1_passed.ok());
  CHECK(w0.KvTryGet("before").status().code() == Code::kNotFound);
  Result<std::string> after = w1.KvTryGet("after");
  REQUIRE(after.ok());
  CHECK(*after == "2");
  CHECK(TryGetUnder(port, second, "after").ok());
  w0.Stop();
  w1.Stop();
  sched->Stop();
}

TEST_CASE("sessions: a scheduler restarted with --state_dir keeps its session - requests made under it are served",
          "[node][net][coord][session]") {
  char dir[] = "/tmp/pscore-session-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  SchedulerOptions so = SchedOpts(1);
  so.state_dir = dir;
  auto sched = std::make_unique<SchedulerNode>(so);
  REQUIRE(sched->Start().ok());
  const int port = sched->port();
  const uint64_t first = SessionOf(*sched);
  {
    WorkerNode w0(WorkerOpts(port, "w0"));
    REQUIRE(w0.Start().ok());
    REQUIRE(w0.KvSet("kept", "yes").ok());
    w0.Stop();
  }
  sched->Stop();
  sched.reset();
  so.port = port;
  sched = std::make_unique<SchedulerNode>(so);
  REQUIRE(sched->Start().ok());
  CHECK(SessionOf(*sched) == first);
  Result<comm::Frame> r = TryGetUnder(port, first, "kept");
  REQUIRE(r.ok());
  pb::KvResponse resp;
  REQUIRE(ParsePayload(*r, &resp).ok());
  CHECK(resp.value() == "yes");
  sched->Stop();
  sched.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// A scheduler stand-in whose session the test moves on while the link stays up: REGISTER is
// answered with the current session; any other request under another session is refused
// as the scheduler refuses it; KV_REQUEST and SEND_EVENT are answered OK and recorded.
class SessionScheduler {
 public:
  int port() const { return listener_.port(); }
  int registers() const { return registers_.load(); }
  void NewSession() { session_.fetch_add(1); }
  // The sessions the KV requests came with, in order.
  std::vector<uint64_t> kv_sessions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return kv_sessions_;
  }

 private:
  void OnRequest(comm::ConnId conn, const comm::Frame& frame) {
    rules_.set_session_id(session_.load());  // the scheduler's check, not a copy of it
    if (frame.meta.cmd() == pb::REGISTER) {
      registers_.fetch_add(1);
      pb::RegisterRespMessage resp;
      resp.set_rank_id(0);
      resp.set_session_id(session_.load());
      listener_.messenger().Reply(conn, frame.meta, resp).IgnoreError();
      return;
    }
    if (frame.meta.cmd() == pb::KV_REQUEST) {
      std::lock_guard<std::mutex> lock(mu_);
      kv_sessions_.push_back(frame.meta.session_id());
    }
    Status st = rules_.CheckSession(frame.meta.session_id());
    if (!st.ok()) {
      listener_.messenger().Reply(conn, frame.meta, st).IgnoreError();
      return;
    }
    if (frame.meta.cmd() == pb::HEARTBEAT) {
      listener_.messenger().Reply(conn, frame.meta, pb::HeartbeatRespMessage()).IgnoreError();
      return;
    }
    listener_.messenger().Reply(conn, frame.meta, Status::Ok()).IgnoreError();
  }

  SteadyClock clock_;
  core::ClusterManager rules_{core::ClusterConfig(), &clock_};  // loop thread
  std::atomic<int> registers_{0};
  std::atomic<uint64_t> session_{1};
  mutable std::mutex mu_;
  std::vector<uint64_t> kv_sessions_;
  testing::RawListener listener_{[this](comm::ConnId conn, comm::Frame&& frame) { OnRequest(conn, frame); }};
};

TEST_CASE("sessions: a member refused for a stale session registers again by itself - a KV call is re-issued, an event returns the refusal",
          "[node][net][coord][session]") {
  SessionScheduler sched;
  // Heartbeats every 30 s: only the calls below meet the new sessions.
  WorkerNode w(WorkerOpts(sched.port(), "w0", 30s));
  REQUIRE(w.Start().ok());
  CHECK(sched.registers() == 1);

  sched.NewSession();  // session 2
  CHECK(w.KvSet("k", "v").ok());  // refused under 1, registered again, re-issued under 2
  CHECK(sched.registers() == 2);
  CHECK(sched.kv_sessions() == std::vector<uint64_t>{1, 2});

  sched.NewSession();  // session 3
  Status refused = w.SendEvent(7, "payload");
  CHECK(refused.code() == Code::kFailedPrecondition);
  CHECK(core::IsStaleSession(refused));
  CHECK_THAT(refused.message(), Catch::Contains("stale session 2") && Catch::Contains("is 3"));
  // Registered again once the scheduler's answer is in (its count goes up on the request).
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       w.session() != 3 && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(5ms);
  }
  CHECK(w.session() == 3);
  CHECK(sched.registers() == 3);
  CHECK(w.SendEvent(7, "payload").ok());  // under session 3 now
  w.Stop();
}

}  // namespace
}  // namespace pscore::node
