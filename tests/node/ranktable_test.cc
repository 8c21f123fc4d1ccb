// Rank-table hub and native subscribers: initial table, changes in order, unknown job,
// coalescing and dropping of a stalled subscriber, many subscribers, reconnecting after a
// scheduler restart and giving up.
#include <atomic>
#include <filesystem>
#include <future>

#include "node/ranktable_hub.h"
#include "node/ranktable_subscriber.h"
#include "node/scheduler_node.h"

#include "node/ranktable_fixture.h"  // last: pulls in Catch

namespace pscore::node {
namespace {

using namespace testing;

RankTableSubscriberOptions SubOpts(int port, std::string job = "job-7") {
  RankTableSubscriberOptions o;
  o.port = port;
  o.job_id = std::move(job);
  o.role = "worker";
  return o;
}

}  // namespace

TEST_CASE("native subscriber sees the initial table, then every change in order", "[node][net]") {
  SchedulerNode sched(SchedOpts(3, 1));
  REQUIRE(sched.Start().ok());
  RankTableHub hub(&sched);
  REQUIRE(hub.Start().ok());

  Collector got;
  // The callback runs on the subscriber's loop thread: no Catch assertion there (Catch is
  // not thread-safe; ThreadSanitizer reported it). Checked on this thread at the end.
  std::atomic<int> wrong_job{0};
  RankTableSubscriber sub(SubOpts(sched.port()), [&](const pb::RankTableStream& s) {
    if (s.jobid() != "job-7") ++wrong_job;
    got.Add(s.ranktable());
  });
  REQUIRE(sub.Start().ok());
  REQUIRE(got.WaitFor([](const std::string& t) { return WorkerHosts(t) == 0; }));
  CHECK(TableStatus(got.tables()[0]) == "initializing");

  Registrar reg(sched.port());
  REQUIRE(reg.Register("w0", pb::WORKER).ok());
  REQUIRE(reg.Register("w1", pb::WORKER).ok());
  REQUIRE(reg.Register("w2", pb::WORKER).ok());
  REQUIRE(reg.Register("s0", pb::SERVER).ok());
  REQUIRE(got.WaitFor([](const std::string& t) { return TableStatus(t) == "completed"; }));
  std::vector<std::string> tables = got.tables();
  // One table per change, in order: 0..3 worker hosts while initializing, then the
  // admission of s0, which makes the cluster READY in the same step.
  std::vector<int> hosts;
  for (auto& t : tables) hosts.push_back(WorkerHosts(t));
  REQUIRE((hosts == std::vector<int>{0, 1, 2, 3, 3}));
  for (int i = 0; i < 4; ++i) CHECK(TableStatus(tables[i]) == "initializing");
  CHECK(TableStatus(tables[4]) == "completed");
  CHECK(tables.back() == CurrentTable(sched, hub));
  // A harmless retry changes nothing and sends nothing.
  REQUIRE(reg.Register("w0", pb::WORKER).ok());
  std::this_thread::sleep_for(100ms);
  CHECK(got.size() == tables.size());
  sub.Stop();
  CHECK(wrong_job == 0);
  hub.Stop();
  sched.Stop();
}

TEST_CASE("subscribing to an unknown job is refused with a clear error", "[node][net]") {
  SchedulerNode sched(SchedOpts(1, 1));
  REQUIRE(sched.Start().ok());
  RankTableHub hub(&sched);
  REQUIRE(hub.Start().ok());
  RankTableSubscriber sub(SubOpts(sched.port(), "other-job"), [](const pb::RankTableStream&) {});
  Status st = sub.Start();
  CHECK(st.code() == Code::kNotFound);
  CHECK(st.message().find("other-job") != std::string::npos);
  CHECK(st.message().find("job-7") != std::string::npos);
  CHECK(OnLoop(*sched.loop(), [&] { return hub.num_subscribers(); }) == 0u);
  sched.Stop();
}

TEST_CASE("a timed-out node leaves the table and comes back when it re-registers", "[node][net]") {
  SchedulerOptions o = SchedOpts(2, 0);
  o.heartbeat_timeout = 300ms;
  o.recoverable_roles = {pb::WORKER};  // w1 comes back as a new incarnation
  SchedulerNode sched(o);
  REQUIRE(sched.Start().ok());
  RankTableHub hub(&sched);
  REQUIRE(hub.Start().ok());
  Collector got;
  RankTableSubscriber sub(SubOpts(sched.port()), [&](const pb::RankTableStream& s) { got.Add(s.ranktable()); });
  REQUIRE(sub.Start().ok());
  Registrar reg(sched.port());
  REQUIRE(reg.Register("w0", pb::WORKER).ok());
  REQUIRE(reg.Register("w1", pb::WORKER).ok());
  // Nobody heartbeats: both time out and leave the table.
  REQUIRE(got.WaitFor([](const std::string& t) { return WorkerHosts(t) == 0; }));
  const size_t before = got.size();
  REQUIRE(reg.Register("w1", pb::WORKER, 1, 2).ok());
  // w1 is back in a table; it does not beat either, so 300 ms later it times out again and a
  // slow test thread may only look after that: any table since the re-register counts.
  REQUIRE(got.WaitForAnySince(before, [](const std::string& t) { return WorkerHosts(t) == 1; }));
  sched.Stop();
}

TEST_CASE("a stalled subscriber is coalesced, does not delay another, and is dropped", "[node][net]") {
  SchedulerNode sched(SchedOpts(400, 1));
  REQUIRE(sched.Start().ok());
  RankTableHubOptions ho;
  ho.coalesce_bytes = 4096;
  ho.stall_timeout = 1500ms;
  RankTableHub hub(&sched, ho);
  REQUIRE(hub.Start().ok());
  WarningCapture warnings;

  // The stalled subscriber: subscribes over a raw socket with a tiny receive buffer, never reads.
  comm::testing::RawSocket stalled;
  REQUIRE(stalled.Connect(sched.port(), 4096));
  pb::ClientInfo info;
  info.set_jobid("job-7");
  info.set_role("worker");
  pb::MessageMeta meta = MakeMeta(pb::SUBSCRIBE_RANKTABLE, pb::ADMIN_CLIENT, 0);
  meta.set_request_id(1);
  REQUIRE(stalled.SendAll(comm::testing::EncodeFrame(meta, info.SerializeAsString())));

  Collector got;
  RankTableSubscriber sub(SubOpts(sched.port()), [&](const pb::RankTableStream& s) { got.Add(s.ranktable()); });
  REQUIRE(sub.Start().ok());
  Registrar reg(sched.port());
  for (int i = 0; i < 150; ++i) REQUIRE(reg.Register("w" + std::to_string(i), pb::WORKER, 8).ok());
  // The reader has every version up to the last, while the stalled one holds a backlog.
  std::string last = CurrentTable(sched, hub);
  REQUIRE(got.WaitForTable(last));
  CHECK(WorkerHosts(last) == 150);
  CHECK(got.size() == 151);  // the initial table plus one per registration, none skipped
  RankTableHubStats stats = OnLoop(*sched.loop(), [&] { return hub.stats(); });
  CHECK(stats.coalesced > 0);
  // Past the stall bound the stalled subscriber is dropped and its connection closed.
  bool dropped = false;
  for (int i = 0; i < 100 && !dropped; ++i) {
    dropped = OnLoop(*sched.loop(), [&] { return hub.stats().dropped; }) == 1;
    if (!dropped) std::this_thread::sleep_for(50ms);
  }
  CHECK(dropped);
  CHECK(warnings.Matching("rank table: dropping subscriber").size() == 1);
  CHECK(OnLoop(*sched.loop(), [&] { return hub.num_subscribers(); }) == 1u);
  // One more change still reaches the live subscriber.
  REQUIRE(reg.Register("late", pb::WORKER).ok());
  REQUIRE(got.WaitFor([](const std::string& t) { return WorkerHosts(t) == 151; }));
  sched.Stop();
}

TEST_CASE("a connection subscribes once - a repeated SUBSCRIBE or an oversized role is refused", "[node][net]") {
  SchedulerNode sched(SchedOpts(1, 1));
  REQUIRE(sched.Start().ok());
  RankTableHub hub(&sched);
  REQUIRE(hub.Start().ok());
  comm::testing::RawSocket s;
  REQUIRE(s.Connect(sched.port()));
  auto subscribe = [&](uint64_t request_id, const std::string& role) {
    pb::ClientInfo info;
    info.set_jobid("job-7");
    info.set_role(role);
    pb::MessageMeta meta = MakeMeta(pb::SUBSCRIBE_RANKTABLE, pb::ADMIN_CLIENT, 0);
    meta.set_request_id(request_id);
    REQUIRE(s.SendAll(comm::testing::EncodeFrame(meta, info.SerializeAsString())));
  };
  // The answer to request `id` (stream frames in between are skipped).
  auto answer = [&](uint64_t id) {
    for (int i = 0; i < 10; ++i) {
      pb::MessageMeta m;
      std::string payload;
      if (!s.RecvFrame(&m, &payload)) break;
      if (m.is_response() && m.request_id() == id) return m;
    }
    FAIL("no answer to request " << id);
    return pb::MessageMeta();
  };
  subscribe(1, std::string(1000, 'r'));
  CHECK(answer(1).status_code() == static_cast<int>(Code::kInvalidArgument));
  subscribe(2, "worker");
  CHECK(answer(2).status_code() == 0);
  for (uint64_t id = 3; id < 6; ++id) {
    subscribe(id, "worker");
    pb::MessageMeta again = answer(id);
    CHECK(again.status_code() == static_cast<int>(Code::kAlreadyExists));
  }
  CHECK(OnLoop(*sched.loop(), [&] { return hub.num_subscribers(); }) == 1u);
  sched.Stop();
}

TEST_CASE("250 native subscribers all get the final table", "[node][net]") {
  SchedulerNode sched(SchedOpts(20, 1));
  REQUIRE(sched.Start().ok());
  RankTableHub hub(&sched);
  REQUIRE(hub.Start().ok());
  comm::EventLoop subs_loop("subs");
  REQUIRE(subs_loop.Start().ok());
  constexpr int kSubs = 250;
  std::vector<Collector> got(kSubs);
  std::vector<std::unique_ptr<RankTableSubscriber>> subs;
  for (int i = 0; i < kSubs; ++i) {
    subs.push_back(std::make_unique<RankTableSubscriber>(
        SubOpts(sched.port()), [&got, i](const pb::RankTableStream& s) { got[i].Add(s.ranktable()); },
        nullptr, &subs_loop));
    REQUIRE(subs.back()->Start().ok());
  }
  CHECK(OnLoop(*sched.loop(), [&] { return hub.num_subscribers(); }) == static_cast<size_t>(kSubs));
  Registrar reg(sched.port());
  for (int i = 0; i < 20; ++i) REQUIRE(reg.Register("w" + std::to_string(i), pb::WORKER).ok());
  REQUIRE(reg.Register("s0", pb::SERVER).ok());
  std::string last = CurrentTable(sched, hub);
  CHECK(TableStatus(last) == "completed");
  for (int i = 0; i < kSubs; ++i) CHECK(got[i].WaitForTable(last));
  subs.clear();
  subs_loop.Stop().IgnoreError();
  sched.Stop();
}

TEST_CASE("a subscriber with reconnect_for follows a scheduler restart on the same port", "[node][net]") {
  char dir[] = "/tmp/pscore-ranktable-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  SchedulerOptions so = SchedOpts(2, 1);
  so.state_dir = dir;
  auto sched = std::make_unique<SchedulerNode>(so);
  REQUIRE(sched->Start().ok());
  auto hub = std::make_unique<RankTableHub>(sched.get());
  REQUIRE(hub->Start().ok());
  const int port = sched->port();

  Collector got;
  std::atomic<int> closes{0};
  RankTableSubscriberOptions o = SubOpts(port);
  o.reconnect_for = 20s;
  RankTableSubscriber sub(o, [&](const pb::RankTableStream& s) { got.Add(s.ranktable()); },
                          [&](const Status&) { closes.fetch_add(1); });
  REQUIRE(sub.Start().ok());
  {
    Registrar reg(port);
    REQUIRE(reg.Register("w0", pb::WORKER).ok());
    REQUIRE(got.WaitFor([](const std::string& t) { return WorkerHosts(t) == 1; }));
  }
  // The scheduler goes away and a new one takes its port and its state.
  hub.reset();
  sched->Stop();
  sched.reset();
  const size_t before = got.size();
  so.port = port;
  sched = std::make_unique<SchedulerNode>(so);
  REQUIRE(sched->Start().ok());
  hub = std::make_unique<RankTableHub>(sched.get());
  REQUIRE(hub->Start().ok());
  // Its current table (it remembers w0) arrives first, then its changes.
  REQUIRE(got.WaitForAnySince(before, [](const std::string& t) { return WorkerHosts(t) == 1; }));
  CHECK(sub.resubscribed() == 1);
  Registrar reg(port);
  REQUIRE(reg.Register("w1", pb::WORKER).ok());
  REQUIRE(got.WaitFor([](const std::string& t) { return WorkerHosts(t) == 2; }));
  CHECK(closes.load() == 0);
  sub.Stop();
  hub.reset();
  sched.reset();  // joins its state writer
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST_CASE("a reconnecting subscriber gives up after reconnect_for and says why", "[node][net]") {
  auto sched = std::make_unique<SchedulerNode>(SchedOpts(1, 1));
  REQUIRE(sched->Start().ok());
  RankTableHub hub(sched.get());
  REQUIRE(hub.Start().ok());
  std::promise<Status> closed;
  RankTableSubscriberOptions o = SubOpts(sched->port());
  o.reconnect_for = 600ms;
  o.timeout = 500ms;
  RankTableSubscriber sub(o, [](const pb::RankTableStream&) {}, [&](const Status& why) { closed.set_value(why); });
  REQUIRE(sub.Start().ok());
  hub.Stop();
  sched->Stop();
  const auto t0 = std::chrono::steady_clock::now();
  std::future<Status> f = closed.get_future();
  REQUIRE(f.wait_for(10s) == std::future_status::ready);
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited >= 500ms);  // it kept trying for about reconnect_for first
  Status why = f.get();
  INFO(why.ToString());
  CHECK_FALSE(why.ok());
  CHECK(sub.resubscribed() == 0);
}

}  // namespace pscore::node
