#include <chrono>
#include <string>

// Our headers first: glog defines its own CHECK, and catch.hpp must come last so that CHECK
// below is Catch's (reports and continues) rather than glog's (aborts the binary).
#include "pscore/core/cluster_event.h"
#include "pscore/core/node_record.h"

#include <catch2/catch.hpp>

namespace pscore::core {
namespace {

NodeRecord Server(const std::string& id, int rank) {
  NodeRecord rec;
  rec.node_id = id;
  rec.role = pb::SERVER;
  rec.rank = rank;
  rec.ip = "10.0.0.7";
  rec.port = 7100;
  rec.incarnation = 42;
  rec.host_name = "host7";
  pb::Device d;
  d.set_local_id(0);
  d.set_device_ip("192.168.0.1");
  d.set_global_id(3);
  rec.devices.push_back(d);
  rec.state = pb::NODE_READY;
  return rec;
}

TEST_CASE("a node record becomes the same ServersMeta for metadata and the admin list but for liveness",
          "[core][node_record]") {
  const TimePoint now = TimePoint(std::chrono::hours(1));
  NodeRecord rec = Server("s1", 1);
  rec.last_heartbeat = now - std::chrono::milliseconds(250);

  pb::ServersMeta serving;
  ToServersMeta(rec, now, Liveness::kServing, &serving);
  CHECK(serving.node_id() == "s1");
  CHECK(serving.role() == pb::SERVER);
  CHECK(serving.rank_id() == 1);
  CHECK(serving.ip() == "10.0.0.7");
  CHECK(serving.port() == 7100);
  CHECK(serving.incarnation() == 42);
  CHECK(serving.state() == pb::NODE_READY);
  CHECK(serving.last_heartbeat_age_ms() == 250);
  REQUIRE(serving.devices_size() == 1);
  CHECK(serving.devices(0).global_id() == 3);
  CHECK(serving.is_alive());
  CHECK_FALSE(serving.resyncing());

  // A resyncing server heartbeats but is not read: alive for the admin, not for routing.
  rec.resyncing = true;
  pb::ServersMeta route;
  pb::ServersMeta admin;
  ToServersMeta(rec, now, Liveness::kServing, &route);
  ToServersMeta(rec, now, Liveness::kHeartbeat, &admin);
  CHECK_FALSE(route.is_alive());
  CHECK(route.resyncing());
  CHECK(admin.is_alive());
  CHECK(admin.resyncing());

  // Timed out: alive for neither, and no longer resyncing.
  rec.timed_out = true;
  pb::ServersMeta lost;
  ToServersMeta(rec, now, Liveness::kHeartbeat, &lost);
  CHECK_FALSE(lost.is_alive());
  CHECK_FALSE(lost.resyncing());
}

TEST_CASE("a node record survives the state file's PersistedNode", "[core][node_record]") {
  NodeRecord rec = Server("s2", 2);
  rec.in_error = true;
  rec.error_code = 7;
  rec.error_message = "disk full";
  rec.finished = true;
  rec.leaving = true;
  rec.timed_out = true;
  rec.in_metadata = true;
  rec.resyncing = true;
  rec.lost_cause = "no heartbeat for 3000 ms";  // not kept

  pb::PersistedNode n;
  ToPersisted(rec, &n);
  const NodeRecord back = FromPersisted(n);
  CHECK(back.node_id == "s2");
  CHECK(back.role == pb::SERVER);
  CHECK(back.rank == 2);
  CHECK(back.ip == "10.0.0.7");
  CHECK(back.port == 7100);
  CHECK(back.incarnation == 42);
  CHECK(back.host_name == "host7");
  REQUIRE(back.devices.size() == 1);
  CHECK(back.devices[0].device_ip() == "192.168.0.1");
  CHECK(back.in_error);
  CHECK(back.error_code == 7);
  CHECK(back.error_message == "disk full");
  CHECK(back.finished);
  CHECK(back.leaving);
  CHECK(back.timed_out);
  CHECK(back.in_metadata);
  CHECK(back.resyncing);
  CHECK(back.lost_cause.empty());
  CHECK(back.state == pb::NODE_STARTING);  // derived again by the registry
}

TEST_CASE("cluster events: kinds, state, epoch and flagged-node notices", "[core][cluster_event]") {
  pb::ClusterEventMessage::Kind kind;
  CHECK(ClusterEventKind(Event::Kind::kNodeTimedOut, &kind));
  CHECK(kind == pb::ClusterEventMessage::NODE_TIMED_OUT);
  CHECK(ClusterEventKind(Event::Kind::kRollback, &kind));
  CHECK(kind == pb::ClusterEventMessage::ROLLBACK);
  CHECK_FALSE(ClusterEventKind(Event::Kind::kScaleOut, &kind));
  CHECK_FALSE(ClusterEventKind(Event::Kind::kMetadataChanged, &kind));

  Event lost;
  lost.kind = Event::Kind::kNodeTimedOut;
  lost.state = pb::CLUSTER_READY;  // when it was made; the message carries the state as sent
  lost.node_id = "w3";
  lost.role = pb::WORKER;
  lost.rank = 3;
  lost.message = "silent for 3000 ms";
  pb::ClusterEventMessage ev = ToClusterEvent(lost, pb::NODE_TIMEOUT, 9);
  CHECK(ev.kind() == pb::ClusterEventMessage::NODE_TIMED_OUT);
  CHECK(ev.cluster_state() == pb::NODE_TIMEOUT);
  CHECK(ev.node_id() == "w3");
  CHECK(ev.role() == pb::WORKER);
  CHECK(ev.rank_id() == 3);
  CHECK(ev.message() == "silent for 3000 ms");
  CHECK(ev.epoch() == 9);  // the event had none
  CHECK(ev.more_size() == 0);

  Event exit;
  exit.kind = Event::Kind::kStateChanged;
  exit.state = pb::CLUSTER_EXIT;
  exit.epoch = 4;
  exit.error_code = 10;
  exit.message = "job failed: worker w3 lost";
  ev = ToClusterEvent(exit, pb::NODE_TIMEOUT, 9);
  CHECK(ev.kind() == pb::ClusterEventMessage::STATE_CHANGED);
  CHECK(ev.cluster_state() == pb::CLUSTER_EXIT);  // the state it changed to
  CHECK(ev.epoch() == 4);
  CHECK(ev.error_code() == 10);
  CHECK(ev.message() == "job failed: worker w3 lost");

  NodeRecord rec = Server("s0", 0);
  rec.timed_out = true;
  ev = FlaggedNodeEvent(rec, pb::NODE_TIMEOUT, 5);
  CHECK(ev.kind() == pb::ClusterEventMessage::NODE_TIMED_OUT);
  CHECK(ev.node_id() == "s0");
  CHECK(ev.role() == pb::SERVER);
  CHECK(ev.error_code() == 0);
  CHECK(ev.message() == "heartbeat timed out");
  CHECK(ev.epoch() == 5);
  rec.in_error = true;
  rec.error_code = 3;
  rec.error_message = "bad input";
  ev = FlaggedNodeEvent(rec, pb::NODE_TIMEOUT, 5);
  CHECK(ev.kind() == pb::ClusterEventMessage::NODE_ERROR);
  CHECK(ev.error_code() == 3);
  CHECK(ev.message() == "bad input");
}

}  // namespace
}  // namespace pscore::core
