// Rank-table hub and native subscribers: initial table, changes in order, unknown job,
// coalescing and dropping of a stalled subscriber, many subscribers, reconnecting after a
// scheduler restart and giving up.
#include <atomic>
#include <condition_variable>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>
#include <filesystem>
#include <future>

#include "pscore/core/rank_table.h"
#include "pscore/node/common/ranktable_subscriber.h"
#include "pscore/node/scheduler/ranktable_hub.h"
#include "pscore/node/scheduler/scheduler_node.h"

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

TEST_CASE("native subscriber: nothing while members register - the first table is complete, then one version per change",
          "[node][net][ranktable]") {
  SchedulerNode sched(SchedOpts(3, 1));
  REQUIRE(sched.Start().ok());
  RankTableHub hub(&sched);
  REQUIRE(hub.Start().ok());

  Collector got;
  // The callback runs on the subscriber's loop thread: no Catch assertion there (Catch is
  // not thread-safe; ThreadSanitizer reported it). Checked on this thread at the end.
  std::atomic<int> wrong_job{0};
  std::mutex versions_mu;
  std::vector<uint64_t> versions;
  RankTableSubscriber sub(SubOpts(sched.port()), [&](const pb::RankTableStream& s) {
    if (s.jobid() != "job-7") ++wrong_job;
    {
      std::lock_guard<std::mutex> lock(versions_mu);
      versions.push_back(s.version());
    }
    got.Add(s.ranktable());
  });
  REQUIRE(sub.Start().ok());

  Registrar reg(sched.port());
  REQUIRE(reg.Register("w0", pb::WORKER).ok());
  REQUIRE(reg.Register("w1", pb::WORKER).ok());
  REQUIRE(reg.Register("w2", pb::WORKER).ok());
  // Three of four members are in: no table exists, none was sent (checked on the loop after
  // the registrations' rebuilds ran).
  CHECK(OnLoop(*sched.loop(), [&] { return hub.stats().versions; }) == 0u);
  CHECK(CurrentTable(sched, hub).empty());
  const auto last_in = std::chrono::steady_clock::now();
  REQUIRE(reg.Register("s0", pb::SERVER).ok());
  REQUIRE(got.WaitFor([](const std::string& t) { return TableStatus(t) == "completed"; }));
  INFO("first complete table " << std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::steady_clock::now() - last_in).count()
                               << " ms after the last member registered");
  std::vector<std::string> tables = got.tables();
  REQUIRE(tables.size() == 1);  // the first table the stream sent is the complete one
  CHECK(WorkerHosts(tables[0]) == 3);
  CHECK(nlohmann::json::parse(tables[0])["server_group_list"][1]["server_list"].size() == 1u);
  CHECK(core::CheckCompleteRankTable(nlohmann::json::parse(tables[0])).ok());
  CHECK(tables.back() == CurrentTable(sched, hub));
  // A harmless retry changes nothing and sends nothing.
  REQUIRE(reg.Register("w0", pb::WORKER).ok());
  CHECK(OnLoop(*sched.loop(), [&] { return hub.stats().versions; }) == 1u);
  sub.Stop();
  CHECK(got.size() == 1);
  {
    std::lock_guard<std::mutex> lock(versions_mu);
    CHECK(versions == std::vector<uint64_t>{1});
  }
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

TEST_CASE("a timed-out member sends no partial table - its return with the same table is no new version",
          "[node][net][ranktable]") {
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
  REQUIRE(got.WaitFor([](const std::string& t) { return WorkerHosts(t) == 2; }));
  // Nobody heartbeats: both time out, the membership is incomplete, nothing is published.
  auto timed_out = [&] {
    return OnLoop(*sched.loop(), [&] { return sched.cluster().state() == pb::NODE_TIMEOUT; });
  };
  for (auto deadline = std::chrono::steady_clock::now() + 20s; !timed_out() && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(timed_out());
  CHECK(OnLoop(*sched.loop(), [&] { return hub.stats().versions; }) == 1u);
  CHECK(got.size() == 1);
  // Both come back as they were: READY again with the same table, so no new version.
  REQUIRE(reg.Register("w0", pb::WORKER).ok());
  REQUIRE(reg.Register("w1", pb::WORKER, 1, 2).ok());
  CHECK(OnLoop(*sched.loop(), [&] { return hub.stats().versions; }) == 1u);
  sub.Stop();
  CHECK(got.size() == 1);
  CHECK(core::CheckCompleteRankTable(nlohmann::json::parse(got.tables()[0])).ok());
  sched.Stop();
}

TEST_CASE("a stalled subscriber is coalesced, does not delay another, and is dropped", "[node][net]") {
  SchedulerNode sched(SchedOpts(150, 0));
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
  // READY: the first table. Each worker then moves to another address: a version each.
  for (int i = 0; i < 150; ++i) {
    REQUIRE(reg.Register("w" + std::to_string(i), pb::WORKER, 8, 1, "10.1.0." + std::to_string(i)).ok());
  }
  // The reader has every version up to the last, while the stalled one holds a backlog.
  std::string last = CurrentTable(sched, hub);
  REQUIRE(got.WaitForTable(last));
  CHECK(WorkerHosts(last) == 150);
  CHECK(MovedHosts(last) == 150);
  CHECK(got.size() == 151);  // the first complete table plus one per move, none skipped
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
  REQUIRE(reg.Register("w0", pb::WORKER, 8, 1, "10.2.0.0").ok());
  REQUIRE(got.WaitFor([](const std::string& t) { return t.find("\"10.2.0.0\"") != std::string::npos; }));
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
    REQUIRE(reg.Register("w1", pb::WORKER).ok());
    REQUIRE(reg.Register("s0", pb::SERVER).ok());
    REQUIRE(got.WaitFor([](const std::string& t) { return WorkerHosts(t) == 2; }));
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
  // Its current table (it remembers the members, READY) arrives first, then its changes.
  REQUIRE(got.WaitForAnySince(before, [](const std::string& t) {
    return WorkerHosts(t) == 2 && TableStatus(t) == "completed";
  }));
  CHECK(sub.resubscribed() == 1);
  Registrar reg(port);
  REQUIRE(reg.Register("w1", pb::WORKER, 1, 1, "10.3.0.1").ok());  // w1 moves: a new table
  REQUIRE(got.WaitFor([](const std::string& t) { return t.find("\"10.3.0.1\"") != std::string::npos; }));
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

namespace pscore::node {
namespace {

// What a subscriber's on_close saw (loop thread writes, the test thread waits).
class Closes {
 public:
  void Add(const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back(why);
    cv_.notify_all();
  }
  bool WaitForOne(std::chrono::milliseconds timeout = 20s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return !seen_.empty(); });
  }
  std::vector<Status> seen() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Status> seen_;
};

}  // namespace

TEST_CASE("publisher registration: a second Register of the job ends the first stream naming why - the new one and "
          "anonymous streams go on",
          "[node][net][ranktable]") {
  SchedulerNode sched(SchedOpts(1, 1));
  REQUIRE(sched.Start().ok());
  RankTableHub hub(&sched);
  REQUIRE(hub.Start().ok());

  Collector anon_got;
  RankTableSubscriber anon(SubOpts(sched.port()), [&](const pb::RankTableStream& s) { anon_got.Add(s.ranktable()); });
  REQUIRE(anon.Start().ok());

  // The first publisher registers, then subscribes under its registration. It would
  // subscribe again after a lost stream; an ended one it must not.
  Collector first_got;
  Closes first_closed;
  RankTableSubscriberOptions o1 = SubOpts(sched.port());
  o1.role = "publisher";
  o1.reconnect_for = 20s;
  RankTableSubscriber first(o1, [&](const pb::RankTableStream& s) { first_got.Add(s.ranktable()); },
                            [&](const Status& why) { first_closed.Add(why); });
  Result<uint64_t> r1 = first.Register();
  REQUIRE(r1.ok());
  CHECK(*r1 == 1u);
  REQUIRE(first.Start().ok());

  Registrar reg(sched.port());
  REQUIRE(reg.Register("w0", pb::WORKER).ok());
  REQUIRE(reg.Register("s0", pb::SERVER).ok());
  const std::string table1 = CurrentTable(sched, hub);
  REQUIRE(TableStatus(table1) == "completed");
  REQUIRE(first_got.WaitForTable(table1));
  REQUIRE(anon_got.WaitForTable(table1));

  // The job registers again: the first stream ends with kAborted naming both registrations.
  Collector second_got;
  RankTableSubscriberOptions o2 = SubOpts(sched.port());
  o2.role = "publisher-2";
  RankTableSubscriber second(o2, [&](const pb::RankTableStream& s) { second_got.Add(s.ranktable()); });
  Result<uint64_t> r2 = second.Register();
  REQUIRE(r2.ok());
  CHECK(*r2 == 2u);
  REQUIRE(first_closed.WaitForOne());
  Status why = first_closed.seen()[0];
  INFO(why.ToString());
  CHECK(why.code() == Code::kAborted);
  CHECK(why.message().find("registration 1 of job 'job-7'") != std::string::npos);
  CHECK(why.message().find("superseded by registration 2") != std::string::npos);
  CHECK(why.message().find("'publisher-2'") != std::string::npos);

  // The new registration's stream gets the current table at once, then the changes.
  REQUIRE(second.Start().ok());
  REQUIRE(second_got.WaitForTable(table1));
  REQUIRE(reg.Register("w0", pb::WORKER, 1, 1, "10.4.0.1").ok());  // w0 moves: a new table
  const std::string table2 = CurrentTable(sched, hub);
  REQUIRE(table2 != table1);
  REQUIRE(second_got.WaitForTable(table2));
  REQUIRE(anon_got.WaitForTable(table2));
  CHECK(anon_got.size() == 2);  // the anonymous stream never noticed the registrations
  CHECK(first_got.size() == 1);
  CHECK(first.resubscribed() == 0);
  CHECK(first.lost() == 0);
  CHECK(first_closed.seen().size() == 1);
  RankTableHubStats stats = OnLoop(*sched.loop(), [&] { return hub.stats(); });
  CHECK(stats.registrations == 2u);
  CHECK(stats.superseded == 1u);
  CHECK(OnLoop(*sched.loop(), [&] { return hub.num_subscribers(); }) == 2u);

  // Subscribing under the superseded registration, or one never issued, is refused.
  RankTableSubscriberOptions stale = SubOpts(sched.port());
  stale.registration = 1;
  RankTableSubscriber stale_sub(stale, [](const pb::RankTableStream&) {});
  Status st = stale_sub.Start();
  CHECK(st.code() == Code::kAborted);
  CHECK(st.message().find("superseded by registration 2") != std::string::npos);
  RankTableSubscriberOptions future = SubOpts(sched.port());
  future.registration = 9;
  RankTableSubscriber future_sub(future, [](const pb::RankTableStream&) {});
  st = future_sub.Start();
  CHECK(st.code() == Code::kNotFound);
  CHECK(st.message().find("job 'job-7' has no registration 9") != std::string::npos);
  CHECK(OnLoop(*sched.loop(), [&] { return hub.num_subscribers(); }) == 2u);
  second.Stop();
  anon.Stop();
  first.Stop();
  hub.Stop();
  sched.Stop();
}

TEST_CASE("publisher registration: an unregistered job, another job and oversized names are refused by name",
          "[node][net][ranktable]") {
  SchedulerNode sched(SchedOpts(1, 1));
  REQUIRE(sched.Start().ok());
  RankTableHub hub(&sched);
  REQUIRE(hub.Start().ok());

  // Subscribing under a registration while the job has none: kNotFound naming the job.
  RankTableSubscriberOptions o = SubOpts(sched.port());
  o.registration = 1;
  RankTableSubscriber early(o, [](const pb::RankTableStream&) {});
  Status st = early.Start();
  CHECK(st.code() == Code::kNotFound);
  CHECK(st.message().find("job 'job-7' is not registered") != std::string::npos);

  // Registering another job: kNotFound naming it and the job served.
  RankTableSubscriber other(SubOpts(sched.port(), "other-job"), [](const pb::RankTableStream&) {});
  Result<uint64_t> r = other.Register();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kNotFound);
  CHECK(r.status().message().find("'other-job'") != std::string::npos);
  CHECK(r.status().message().find("'job-7'") != std::string::npos);

  // No job id, or names past their bounds: kInvalidArgument, and nothing registered.
  RankTableSubscriber nameless(SubOpts(sched.port(), ""), [](const pb::RankTableStream&) {});
  r = nameless.Register();
  CHECK(r.status().code() == Code::kInvalidArgument);
  RankTableSubscriber long_job(SubOpts(sched.port(), std::string(kMaxRankTableJobIdBytes + 1, 'j')),
                               [](const pb::RankTableStream&) {});
  r = long_job.Register();
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK(r.status().message().find("jobId of 257 bytes") != std::string::npos);
  st = long_job.Start();
  CHECK(st.code() == Code::kInvalidArgument);
  RankTableSubscriberOptions long_role = SubOpts(sched.port());
  long_role.role = std::string(kMaxRankTableRoleBytes + 1, 'r');
  RankTableSubscriber long_role_sub(long_role, [](const pb::RankTableStream&) {});
  r = long_role_sub.Register();
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK(OnLoop(*sched.loop(), [&] { return hub.registration(); }) == 0u);
  CHECK(OnLoop(*sched.loop(), [&] { return hub.stats().registrations; }) == 0u);

  // A registration made now lets the early subscriber in under it.
  RankTableSubscriber publisher(SubOpts(sched.port()), [](const pb::RankTableStream&) {});
  r = publisher.Register();
  REQUIRE(r.ok());
  CHECK(*r == 1u);
  CHECK(early.Start().ok());
  CHECK(OnLoop(*sched.loop(), [&] { return hub.num_subscribers(); }) == 1u);
  early.Stop();
  hub.Stop();
  sched.Stop();
}

}  // namespace pscore::node
