// StateWriter (pscore/node/scheduler/state_writer.h): atomic replace, coalescing of a burst, draining at
// destruction, errors for an unusable directory; and an in-process scheduler with
// --state_dir that persists registrations and KV entries and restores them.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "pscore/comm/event_loop.h"
#include "pscore/core/state_file.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/scheduler/state_writer.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"
#include "node/full_disk.h"
#include "node/poll_until.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;
using pscore::testing::PollUntil;

class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/pscore-sw-XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string Slurp(const std::string& path) {
  Result<std::string> r = ReadStateFile(path);
  return r.ok() ? *r : std::string();
}

// A scheduler with --state_dir `dir` and its job of one worker and one server, READY.
struct StateJob {
  static SchedulerOptions Options(const std::string& dir) {
    SchedulerOptions so;
    so.worker_num = 1;
    so.server_num = 1;
    so.heartbeat_interval = 50ms;
    so.heartbeat_timeout = 2s;
    so.state_dir = dir;
    return so;
  }
  static NodeOptions Member(pb::NodeRole role, const std::string& id, int port) {
    NodeOptions o;
    o.role = role;
    o.node_id = id;
    o.scheduler_port = port;
    o.heartbeat_interval = 50ms;
    o.connect_timeout = 5s;
    return o;
  }
  explicit StateJob(const std::string& dir) : sched(Options(dir)) {
    REQUIRE(sched.Start().ok());
    worker = std::make_unique<WorkerNode>(Member(pb::WORKER, "w0", sched.port()));
    server = std::make_unique<ServerNode>(Member(pb::SERVER, "s0", sched.port()), core::ParamStore::Options());
    REQUIRE(worker->Start().ok());
    REQUIRE(server->Start().ok());
    REQUIRE(worker->WaitForReady(5s).ok());
  }
  ~StateJob() { Stop(); }
  void Stop() {
    worker->Stop();
    server->Stop();
    sched.Stop();
  }
  SchedulerNode sched;
  std::unique_ptr<WorkerNode> worker;
  std::unique_ptr<ServerNode> server;
};

}  // namespace

TEST_CASE("state writer replaces the file atomically and coalesces a burst", "[node][state]") {
  ScratchDir dir;
  REQUIRE_FALSE(dir.path().empty());
  const std::string path = StateFilePath(dir.path() + "/sub/dir");
  CHECK(ReadStateFile(path).status().code() == Code::kNotFound);
  {
    StateWriter writer(path);
    REQUIRE(writer.Start().ok());  // creates the directories
    CHECK(writer.idle());
    writer.Submit("first");
    REQUIRE(writer.Flush(5s).ok());
    CHECK(Slurp(path) == "first");
    CHECK(writer.writes() == 1);
    CHECK(writer.idle());
    for (int i = 0; i < 200; ++i) writer.Submit(std::string(4096, 'a') + std::to_string(i));
    REQUIRE(writer.Flush(10s).ok());
    CHECK(Slurp(path) == std::string(4096, 'a') + "199");  // the newest always lands
    CHECK(writer.writes() <= 201);
    CHECK(writer.failures() == 0);
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
    writer.Submit("last");  // pending at destruction: still written
  }
  CHECK(Slurp(path) == "last");
}

TEST_CASE("state writer numbers snapshots - written_through covers every one submitted before a write",
          "[node][state]") {
  ScratchDir dir;
  REQUIRE_FALSE(dir.path().empty());
  StateWriter writer(StateFilePath(dir.path()));
  std::atomic<int> woken{0};
  writer.SetOnWritten([&woken] { woken.fetch_add(1); });
  REQUIRE(writer.Start().ok());
  CHECK(writer.submitted() == 0);
  CHECK(writer.written_through() == 0);
  CHECK(writer.Submit("one") == 1);
  REQUIRE(writer.Flush(5s).ok());
  CHECK(writer.written_through() == 1);
  CHECK(woken.load() == 1);
  uint64_t last = 0;
  for (int i = 0; i < 50; ++i) last = writer.Submit("burst " + std::to_string(i));
  CHECK(last == 51);
  REQUIRE(writer.Flush(10s).ok());
  CHECK(writer.written_through() == 51);  // coalesced writes still cover every number
  CHECK(woken.load() >= 2);
  CHECK(woken.load() == static_cast<int>(writer.writes()));
}

TEST_CASE("state writer reports a directory it cannot create", "[node][state]") {
  ScratchDir dir;
  REQUIRE_FALSE(dir.path().empty());
  const std::string file = dir.path() + "/plain";
  std::ofstream(file) << "x";
  StateWriter writer(StateFilePath(file + "/state"));
  Status st = writer.Start();
  CHECK(st.code() == Code::kUnavailable);
  CHECK_THAT(st.message(), Catch::Contains(file));
}

TEST_CASE("an in-process scheduler with a state dir restores nodes and KV after a stop",
          "[node][state][net]") {
  ScratchDir dir;
  REQUIRE_FALSE(dir.path().empty());
  SchedulerOptions so = StateJob::Options(dir.path());
  uint64_t epoch = 0;
  {
    StateJob job(dir.path());
    REQUIRE(job.worker->KvSet("a/b", "v1").ok());
    REQUIRE(job.worker->KvSet("a/c", "v2").ok());
    REQUIRE(job.worker->KvDelete("a/c").ok());
    epoch = job.sched.epoch();
    job.Stop();  // a clean stop has written what was pending when it returns
    Result<pb::PersistedState> st = core::ParseState(Slurp(StateFilePath(dir.path())));
    REQUIRE(st.ok());
    CHECK(st->nodes_size() == 2);
    REQUIRE(st->kv_size() == 1);
    CHECK(st->kv(0).key() == "a/b");
    CHECK(st->job_id() == "default");
  }

  so.port = 0;
  SchedulerNode again(so);
  REQUIRE(again.Start().ok());
  CHECK(again.cluster_state() == pb::CLUSTER_READY);
  CHECK(again.epoch() == epoch + 1);
  std::promise<std::pair<int, std::string>> seen;
  again.loop()->Run([&] {
    const core::NodeRecord* s0 = again.cluster().Find("s0");
    seen.set_value({static_cast<int>(again.cluster().Nodes().size()), s0 ? s0->node_id : ""});
  });
  auto [count, id] = seen.get_future().get();
  CHECK(count == 2);
  CHECK(id == "s0");
  again.Stop();

  so.job_id = "another";
  SchedulerNode wrong(so);
  Status bad = wrong.Start();
  CHECK(bad.code() == Code::kFailedPrecondition);
  CHECK_THAT(bad.message(), Catch::Contains(StateFilePath(dir.path())));
}

bool HasKey(const pb::PersistedState& st, const std::string& key) {
  for (const pb::KvEntry& e : st.kv()) {
    if (e.key() == key) return true;
  }
  return false;
}

TEST_CASE("a scheduler whose disk refuses the state file answers on, counts the refusals and writes the state once the disk has room",
          "[node][state][net]") {
  ScratchDir dir;
  REQUIRE_FALSE(dir.path().empty());
  StateJob job(dir.path());
  SchedulerNode& sched = job.sched;
  REQUIRE(job.worker->KvSet("before", "1").ok());
  const std::string path = StateFilePath(dir.path());
  CHECK(sched.state_write_failures() == 0);
  uint64_t writes = 0;  // done while the disk refused them: none
  {
    testing::FileSizeLimit full(16);  // no state file fits
    REQUIRE(full.ok());
    // Answered, though not on disk: the job runs on.
    REQUIRE(job.worker->KvSet("during", "2").ok());
    const uint64_t refused = sched.state_write_failures();
    CHECK(refused >= 1);
    // Tried again at later ticks, with nothing else changing.
    CHECK(PollUntil([&] { return sched.state_write_failures() >= refused + 2; }, 10s));
    Result<pb::PersistedState> on_disk = core::ParseState(Slurp(path));
    REQUIRE(on_disk.ok());  // the last file written is whole
    CHECK(HasKey(*on_disk, "before"));
    CHECK_FALSE(HasKey(*on_disk, "during"));
    writes = sched.state_writes();
  }
  // The disk has room again: a tick writes the state without any other change. (The file
  // is visible at its rename; the writer counts the write after the directory's fsync.)
  CHECK(PollUntil(
      [&] {
        Result<pb::PersistedState> st = core::ParseState(Slurp(path));
        return st.ok() && HasKey(*st, "during");
      },
      10s));
  CHECK(PollUntil([&] { return sched.state_writes() > writes; }, 10s));
}

TEST_CASE("a scheduler on a shared loop writes its last KV sets when stopped - before Stop returns",
          "[node][state][net]") {
  ScratchDir dir;
  REQUIRE_FALSE(dir.path().empty());
  comm::EventLoop loop("shared");
  REQUIRE(loop.Start().ok());
  SchedulerOptions so;
  so.worker_num = 1;
  so.server_num = 0;
  // Ticks 1 s apart: a KV set that finds the writer busy waits for Stop, not for a tick.
  so.heartbeat_interval = 4s;
  so.heartbeat_timeout = 20s;
  so.state_dir = dir.path();
  SchedulerNode sched(so, &loop);
  REQUIRE(sched.Start().ok());
  NodeOptions wo;
  wo.role = pb::WORKER;
  wo.node_id = "w0";
  wo.scheduler_port = sched.port();
  wo.heartbeat_interval = 1s;
  wo.connect_timeout = 5s;
  WorkerNode worker(wo);
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(10s).ok());
  constexpr int kSets = 50;  // the writer is busy (fsync) for most of them
  for (int i = 0; i < kSets; ++i) REQUIRE(worker.KvSet("k/" + std::to_string(i), std::to_string(i)).ok());
  worker.Stop();
  sched.Stop();
  Result<pb::PersistedState> st = core::ParseState(Slurp(StateFilePath(dir.path())));
  REQUIRE(st.ok());
  CHECK(st->kv_size() == kSets);
  loop.Stop().IgnoreError();
}

TEST_CASE("a scheduler on a shared loop stopped and destroyed with a write's wake-up queued - the loop runs on",
          "[node][state][net]") {
  // The writer thread posts a wake-up to the loop after each write; Stop writes once more.
  // Here the loop is held busy until the scheduler is destroyed (or 3 s pass), so that
  // wake-up is still queued then: it must not touch the destroyed scheduler (ASan).
  ScratchDir dir;
  REQUIRE_FALSE(dir.path().empty());
  comm::EventLoop loop("shared");
  REQUIRE(loop.Start().ok());
  SchedulerOptions so;
  so.worker_num = 1;
  so.server_num = 0;
  so.heartbeat_interval = 1s;
  so.heartbeat_timeout = 10s;
  so.state_dir = dir.path();
  auto sched = std::make_unique<SchedulerNode>(so, &loop);
  REQUIRE(sched->Start().ok());
  std::atomic<bool> go{false}, destroyed{false};
  std::promise<void> held;
  auto hold = [&] {
    // Queued behind Stop's own closure: keeps the writer's wake-up waiting behind it.
    const auto deadline = std::chrono::steady_clock::now() + 3s;
    while (!destroyed.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    held.set_value();
  };
  loop.Post([&] {
    while (!go.load()) std::this_thread::yield();
    loop.Post(hold);
  });
  std::thread stopper([&] { sched->Stop(); });
  // Lets Stop queue its closure before the loop is released (the test holds without it).
  std::this_thread::sleep_for(100ms);
  go = true;
  stopper.join();
  sched.reset();
  destroyed = true;
  REQUIRE(held.get_future().wait_for(10s) == std::future_status::ready);
  // The loop runs what is still queued, then stops cleanly.
  std::promise<void> after;
  REQUIRE(loop.Post([&] { after.set_value(); }));
  CHECK(after.get_future().wait_for(10s) == std::future_status::ready);
  CHECK(loop.Stop().ok());
  Result<pb::PersistedState> st = core::ParseState(Slurp(StateFilePath(dir.path())));
  CHECK(st.ok());
}

}  // namespace pscore::node
