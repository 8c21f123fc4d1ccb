// The scheduler's side of server replication (ClusterManager with replicas >= 2, fake
// clock, no sockets): a server's timeout publishes a new epoch marking it down, a lost
// server whose ranges all keep a live copy does not fail the job (one whose ranges lost
// every copy does), a server that comes back is resyncing (not alive) until it reports
// its ranges copied, and the server count is scaled only while every server is live.
#include <string>
#include <vector>

#include "pscore/core/cluster_manager.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::core {
namespace {

using std::chrono::seconds;

RegisterRequest Req(const std::string& id, pb::NodeRole role, uint64_t inc = 100, int port = 7000) {
  RegisterRequest req;
  req.node_id = id;
  req.role = role;
  req.ip = "10.0.0.1";
  req.port = port;
  req.incarnation = inc;
  return req;
}

// s0, s1, s2 + w0, READY, heartbeat timeout 30 s, `replicas` copies of each range; servers
// and workers recoverable (a restarted server is admitted, not recorded in error).
struct Job {
  explicit Job(int replicas) {
    ClusterConfig c;
    c.worker_num = 1;
    c.server_num = 3;
    c.replicas = replicas;
    c.recoverable_roles = {pb::SERVER, pb::WORKER};
    c.heartbeat_timeout = seconds(30);
    cm = std::make_unique<ClusterManager>(c, &clock);
    for (auto [id, role] : {std::pair{"s0", pb::SERVER}, {"s1", pb::SERVER}, {"s2", pb::SERVER}, {"w0", pb::WORKER}}) {
      REQUIRE(cm->Register(Req(id, role)).ok());
    }
    REQUIRE(cm->state() == pb::CLUSTER_READY);
    cm->TakeEvents();
  }
  void Silence(const std::vector<std::string>& alive) {
    clock.Advance(seconds(31));
    for (const std::string& id : alive) REQUIRE(cm->Heartbeat(id).ok());
    cm->Tick();
  }
  bool Alive(const std::string& id) const {
    pb::SendMetadataMessage md = cm->BuildMetadata();
    for (const pb::ServersMeta& s : md.servers_meta()) {
      if (s.node_id() == id) return s.is_alive();
    }
    return false;
  }
  bool Resyncing(const std::string& id) const {
    pb::SendMetadataMessage md = cm->BuildMetadata();
    for (const pb::ServersMeta& s : md.servers_meta()) {
      if (s.node_id() == id) return s.resyncing();
    }
    return false;
  }
  FakeClock clock;
  std::unique_ptr<ClusterManager> cm;
};

bool Published(const std::vector<Event>& events) {
  for (const Event& e : events) {
    if (e.kind == Event::Kind::kMetadataChanged) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("replicas=2: a server's timeout publishes a new epoch marking it down", "[core][replication]") {
  Job job(2);
  const uint64_t epoch = job.cm->epoch();
  CHECK(job.cm->BuildMetadata().replicas() == 2);
  job.Silence({"s0", "s2", "w0"});
  CHECK(Published(job.cm->TakeEvents()));
  CHECK(job.cm->epoch() > epoch);
  CHECK_FALSE(job.Alive("s1"));
  CHECK(job.Alive("s0"));
}

TEST_CASE("replicas=1: a server's timeout publishes no new metadata", "[core][replication]") {
  Job job(1);
  const uint64_t epoch = job.cm->epoch();
  job.Silence({"s0", "s2", "w0"});
  CHECK_FALSE(Published(job.cm->TakeEvents()));
  CHECK(job.cm->epoch() == epoch);
}

TEST_CASE("replicas=2: a lost server whose ranges keep a live copy does not fail the job", "[core][replication]") {
  Job job(2);
  job.Silence({"s0", "s2", "w0"});
  for (const char* id : {"s0", "s2", "w0"}) REQUIRE(job.cm->Finish(id).ok());
  REQUIRE(job.cm->state() == pb::CLUSTER_EXIT);
  CHECK(job.cm->outcome().result == JobOutcome::Result::kFinished);
}

TEST_CASE("replicas=2: two neighbouring servers lost take a range's every copy and fail the job",
          "[core][replication]") {
  Job job(2);
  job.Silence({"s2", "w0"});  // range 0 lived on s0 and s1
  for (const char* id : {"s2", "w0"}) REQUIRE(job.cm->Finish(id).ok());
  REQUIRE(job.cm->state() == pb::CLUSTER_EXIT);
  CHECK(job.cm->outcome().result == JobOutcome::Result::kFailed);
  CHECK(job.cm->outcome().failed_nodes == std::vector<std::string>{"s0", "s1"});
}

TEST_CASE("replicas=2: a server restarted after a loss is resyncing, not alive, until it reports done",
          "[core][replication][resync]") {
  Job job(2);
  job.Silence({"s0", "s2", "w0"});
  job.cm->TakeEvents();
  const uint64_t epoch = job.cm->epoch();
  REQUIRE(job.cm->Register(Req("s1", pb::SERVER, /*inc=*/101, /*port=*/7001)).ok());
  CHECK(job.cm->epoch() > epoch);
  CHECK_FALSE(job.cm->Find("s1")->timed_out);
  CHECK_FALSE(job.Alive("s1"));
  CHECK(job.Resyncing("s1"));
  CHECK_FALSE(job.Resyncing("s0"));
  job.cm->TakeEvents();
  // Done from another incarnation (the one before the restart): refused, still resyncing.
  CHECK(job.cm->ResyncDone("s1", 100).code() == Code::kAborted);
  CHECK(job.Resyncing("s1"));
  CHECK(job.cm->ResyncDone("nobody", 1).code() == Code::kNotFound);
  // Done: a new epoch marks it alive (the primary of its range again: first in the chain).
  const uint64_t resyncing_epoch = job.cm->epoch();
  REQUIRE(job.cm->ResyncDone("s1", 101).ok());
  CHECK(Published(job.cm->TakeEvents()));
  CHECK(job.cm->epoch() > resyncing_epoch);
  CHECK(job.Alive("s1"));
  CHECK_FALSE(job.Resyncing("s1"));
  // A repeat (its answer was lost) changes nothing.
  const uint64_t alive_epoch = job.cm->epoch();
  CHECK(job.cm->ResyncDone("s1", 101).ok());
  CHECK(job.cm->epoch() == alive_epoch);
  // Restarted before its timeout, on the same address: resyncing too.
  Job quick(2);
  const uint64_t before = quick.cm->epoch();
  REQUIRE(quick.cm->Register(Req("s2", pb::SERVER, /*inc=*/102)).ok());
  CHECK(quick.cm->epoch() > before);
  CHECK_FALSE(quick.Alive("s2"));
  CHECK(quick.Resyncing("s2"));
}

TEST_CASE("replicas=2: a resyncing server that times out is not resyncing in the metadata and cannot report done",
          "[core][replication][resync]") {
  Job job(2);
  REQUIRE(job.cm->Register(Req("s1", pb::SERVER, /*inc=*/101, /*port=*/7001)).ok());
  REQUIRE(job.Resyncing("s1"));
  job.Silence({"s0", "s2", "w0"});
  CHECK_FALSE(job.Resyncing("s1"));
  CHECK_FALSE(job.Alive("s1"));
  CHECK(job.cm->ResyncDone("s1", 101).code() == Code::kFailedPrecondition);
  // It comes back (same process): resyncing again, and done from then on.
  REQUIRE(job.cm->Register(Req("s1", pb::SERVER, /*inc=*/101, /*port=*/7001)).ok());
  CHECK(job.Resyncing("s1"));
  REQUIRE(job.cm->ResyncDone("s1", 101).ok());
  CHECK(job.Alive("s1"));
}

TEST_CASE("replicas=2: a resyncing server is in the scheduler's state snapshot", "[core][replication][resync]") {
  Job job(2);
  REQUIRE(job.cm->Register(Req("s1", pb::SERVER, /*inc=*/101, /*port=*/7001)).ok());
  ClusterConfig config;
  config.worker_num = 1;
  config.server_num = 3;
  config.replicas = 2;
  FakeClock clock;
  ClusterManager restored(config, &clock);
  const Status st = restored.Restore(job.cm->Snapshot());
  INFO(st.message());
  REQUIRE(st.ok());
  bool resyncing = false;
  bool alive = true;
  const pb::SendMetadataMessage md = restored.BuildMetadata();
  for (const pb::ServersMeta& s : md.servers_meta()) {
    if (s.node_id() != "s1") continue;
    resyncing = s.resyncing();
    alive = s.is_alive();
  }
  CHECK(resyncing);
  CHECK_FALSE(alive);
}

TEST_CASE("replicas=2: the server count may change while every server is a live replica, else it is refused",
          "[core][replication][scale]") {
  Job job(2);
  CHECK(job.cm->ScaleOut(1, 4).ok());
  CHECK(job.cm->state() == pb::CLUSTER_SCALE_OUT);
  // A server resyncing (back after a loss) or lost holds no complete copy: refused.
  Job resyncing(2);
  REQUIRE(resyncing.cm->Register(Req("s1", pb::SERVER, /*inc=*/101, /*port=*/7001)).ok());
  Status out = resyncing.cm->ScaleOut(1, 4);
  CHECK(out.code() == Code::kFailedPrecondition);
  CHECK(out.message().find("s1 (rank 1) is resyncing") != std::string::npos);
  CHECK(resyncing.cm->ScaleInByIds({"s2"}).code() == Code::kFailedPrecondition);
  CHECK(resyncing.cm->ScaleOut(2, 3).ok());  // workers scale as usual
  Job lost(2);
  lost.Silence({"s0", "s2", "w0"});
  CHECK(lost.cm->ScaleOut(1, 4).code() == Code::kFailedPrecondition);
  // Fewer servers than copies: refused.
  Job small(3);
  CHECK(small.cm->ScaleInByIds({"s2"}).code() == Code::kFailedPrecondition);
  CHECK(small.cm->state() == pb::CLUSTER_READY);
}

}  // namespace pscore::core
