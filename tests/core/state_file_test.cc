// State file codec (pscore/core/state_file.h) and ClusterManager snapshot/restore: round trip,
// every truncation and every flipped bit rejected, versions and impossible registries
// refused, and what a restored manager does with nodes that come back (or do not).
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "pscore/core/cluster_manager.h"
#include "pscore/core/kv_store.h"
#include "pscore/core/state_file.h"

#include <google/protobuf/io/coded_stream.h>

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::core {
namespace {

using Kind = Event::Kind;
constexpr uint64_t kInc = 42;

RegisterRequest Req(const std::string& id, pb::NodeRole role, int devices = 1) {
  RegisterRequest req;
  req.node_id = id;
  req.role = role;
  req.ip = "127.0.0.1";
  req.port = 9000 + static_cast<int>(id.size());
  req.incarnation = kInc;
  for (int i = 0; i < devices; ++i) {
    pb::Device d;
    d.set_local_id(i);
    d.set_device_ip("10.1.0." + std::to_string(i));
    req.devices.push_back(d);
  }
  return req;
}

ClusterConfig Config(int workers, int servers) {
  ClusterConfig c;
  c.worker_num = workers;
  c.server_num = servers;
  c.heartbeat_timeout = std::chrono::seconds(10);
  return c;
}

// A READY cluster of 2 servers and 1 worker, one node in error, plus KV entries.
pb::PersistedState ReadyState(FakeClock* clock) {
  ClusterManager cm(Config(1, 2), clock);
  REQUIRE(cm.Register(Req("s0", pb::SERVER)).ok());
  REQUIRE(cm.Register(Req("s1", pb::SERVER, 2)).ok());
  REQUIRE(cm.Register(Req("w0", pb::WORKER, 0)).ok());
  REQUIRE(cm.state() == pb::CLUSTER_READY);
  REQUIRE(cm.ReportError("w0", 3, "disk full").ok());
  pb::PersistedState st = cm.Snapshot();
  st.set_job_id("job-1");
  st.set_sequence(7);
  for (int i = 0; i < 3; ++i) {
    pb::KvEntry* e = st.add_kv();
    e->set_key("cfg/k" + std::to_string(i));
    e->set_value(std::string(5, static_cast<char>('a' + i)));
  }
  return st;
}

bool Rejected(const std::string& bytes) { return !ParseState(bytes).ok(); }

}  // namespace

TEST_CASE("state file round trip keeps every field", "[core][state]") {
  FakeClock clock;
  const pb::PersistedState st = ReadyState(&clock);
  const std::string bytes = SerializeState(st);
  REQUIRE(bytes.size() > kStateHeaderBytes);
  Result<pb::PersistedState> back = ParseState(bytes);
  REQUIRE(back.ok());
  CHECK(back->SerializeAsString() == st.SerializeAsString());
  CHECK(back->nodes_size() == 3);
  CHECK(back->kv_size() == 3);
  CHECK(back->cluster_state() == pb::CLUSTER_READY);
  CHECK(Crc32("123456789", 9) == 0xCBF43926u);  // the standard check value
  // Continued from the CRC of the bytes before: the same as over all of them at once.
  CHECK(Crc32("456789", 6, Crc32("123", 3)) == 0xCBF43926u);
  CHECK(Crc32("", 0, Crc32("123456789", 9)) == 0xCBF43926u);
}

TEST_CASE("state file: every truncation and trailing garbage is rejected", "[core][state]") {
  FakeClock clock;
  const std::string bytes = SerializeState(ReadyState(&clock));
  for (size_t len = 0; len < bytes.size(); ++len) {
    INFO("length " << len);
    CHECK(Rejected(bytes.substr(0, len)));
  }
  Result<pb::PersistedState> r = ParseState(bytes.substr(0, bytes.size() - 1));
  CHECK_THAT(r.status().message(), Catch::Contains("truncated"));
  CHECK(Rejected(bytes + "x"));
}

TEST_CASE("state file: a flipped bit anywhere is rejected", "[core][state]") {
  FakeClock clock;
  const std::string bytes = SerializeState(ReadyState(&clock));
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit : {0, 7}) {
      std::string bad = bytes;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      INFO("byte " << i << " bit " << bit);
      CHECK(Rejected(bad));
    }
  }
}

TEST_CASE("state file: another version or magic is refused with a reason", "[core][state]") {
  FakeClock clock;
  std::string bytes = SerializeState(ReadyState(&clock));
  std::string v2 = bytes;
  v2[4] = 2;
  Result<pb::PersistedState> r = ParseState(v2);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kUnimplemented);
  CHECK_THAT(r.status().message(), Catch::Contains("version 2"));
  std::string magic = bytes;
  magic[0] = 'X';
  CHECK_THAT(ParseState(magic).status().message(), Catch::Contains("magic"));
  std::string huge = bytes;
  huge[15] = 0x7f;  // body length near 2^63
  CHECK_THAT(ParseState(huge).status().message(), Catch::Contains("limit"));
}

TEST_CASE("state file: an impossible registry is refused even with a good checksum", "[core][state]") {
  FakeClock clock;
  const pb::PersistedState good = ReadyState(&clock);
  auto refused = [](const pb::PersistedState& st, const std::string& why) {
    Result<pb::PersistedState> r = ParseState(SerializeState(st));
    INFO(why);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
  };
  pb::PersistedState st = good;
  st.mutable_nodes(1)->set_rank(st.nodes(0).rank());  // both servers
  refused(st, "duplicate rank");
  st = good;
  st.mutable_nodes(2)->set_node_id(st.nodes(0).node_id());
  refused(st, "duplicate id");
  st = good;
  st.mutable_nodes(0)->set_role(pb::SCHEDULER);
  refused(st, "bad role");
  st = good;
  st.set_server_num(1);
  refused(st, "more servers than the total");
  st = good;
  st.mutable_nodes(0)->set_node_id(std::string(300, 'n'));
  refused(st, "long id");
  st = good;
  st.set_cluster_state(static_cast<pb::ClusterState>(999));
  refused(st, "unknown state");
  st = good;
  st.mutable_scale()->add_added("nobody");
  refused(st, "scale names an unknown node");
  st = good;
  st.mutable_kv(0)->set_key("");
  refused(st, "empty key");
  st = good;
  pb::PersistedBarrier* b = st.add_barriers();
  b->set_id("step");
  b->set_round(0);
  refused(st, "barrier round 0");
  b->set_round(3);
  *st.add_barriers() = *b;
  refused(st, "barrier listed twice");
  st = good;
  b = st.add_barriers();
  b->set_id("step");
  b->set_round(3);
  b->set_code(999);
  refused(st, "barrier with an unknown code");
  b->set_code(0);
  b->set_id(std::string(5000, 'b'));
  refused(st, "long barrier id");
  b->set_id("step");
  pb::PersistedBarrierJoin* j = b->add_joined();
  j->set_node_id("w0");
  j->set_round(4);
  refused(st, "a node's round past the barrier's");
  j->set_round(0);
  refused(st, "a node at round 0");
  j->set_round(3);
  *b->add_joined() = *j;
  refused(st, "a node listed twice");
  b->mutable_joined()->RemoveLast();
  j->set_node_id("");
  refused(st, "an empty node id");
  st = good;
  pb::PersistedLeft* left = st.add_left();
  left->set_node_id("s9");
  *st.add_left() = *left;
  refused(st, "a node listed twice as left");
  st.mutable_left()->RemoveLast();
  left->set_node_id("");
  refused(st, "a left node without an id");
  left->set_node_id(std::string(300, 'n'));
  refused(st, "a left node with a long id");
  st = good;
  for (size_t i = 0; i <= ClusterManager::kLeftRemembered; ++i) st.add_left()->set_node_id("s" + std::to_string(i));
  refused(st, "more left nodes than a manager remembers");
}

TEST_CASE("state file keeps barriers' newest ended rounds and each node's round", "[core][state]") {
  FakeClock clock;
  pb::PersistedState st = ReadyState(&clock);
  pb::PersistedBarrier* b = st.add_barriers();
  b->set_id("train/step");
  b->set_round(17);
  b->set_code(static_cast<int>(Code::kTimeout));
  b->set_message("timed out");
  pb::PersistedBarrierJoin* j = b->add_joined();
  j->set_node_id("w1");
  j->set_round(16);
  Result<pb::PersistedState> back = ParseState(SerializeState(st));
  REQUIRE(back.ok());
  REQUIRE(back->barriers_size() == 1);
  CHECK(back->barriers(0).id() == "train/step");
  CHECK(back->barriers(0).round() == 17);
  CHECK(back->barriers(0).code() == static_cast<int>(Code::kTimeout));
  CHECK(back->barriers(0).message() == "timed out");
  REQUIRE(back->barriers(0).joined_size() == 1);
  CHECK(back->barriers(0).joined(0).node_id() == "w1");
  CHECK(back->barriers(0).joined(0).round() == 16);
}

TEST_CASE("restored cluster keeps ranks - a retry from the same incarnation changes nothing",
          "[core][state]") {
  FakeClock clock;
  const pb::PersistedState st = ReadyState(&clock);
  clock.Advance(std::chrono::seconds(100));  // the scheduler was down a while
  ClusterManager cm(Config(1, 1), &clock);   // flags differ: the file's totals win
  REQUIRE(cm.Restore(st).ok());
  CHECK(cm.state() == pb::CLUSTER_READY);
  CHECK(cm.server_num() == 2);
  CHECK(cm.epoch() == st.epoch() + 1);  // republished once
  std::vector<Event> events = cm.TakeEvents();
  REQUIRE(events.size() == 2);
  CHECK(events[0].kind == Kind::kMetadataChanged);
  CHECK(events[1].kind == Kind::kStateChanged);
  CHECK(cm.Find("w0")->in_error);
  CHECK(cm.Find("s1")->devices.size() == 2);
  CHECK(cm.Find("s1")->devices[1].global_id() == 2);

  Result<RegisterOutcome> s1 = cm.Register(Req("s1", pb::SERVER, 2));
  REQUIRE(s1.ok());
  CHECK(s1->retry);
  CHECK(s1->rank == 1);
  CHECK(cm.TakeEvents().empty());
  CHECK(cm.Heartbeat("s0").ok());

  // Silent nodes get a full timeout from the restore, then time out as usual.
  clock.Advance(std::chrono::seconds(9));
  cm.Tick();
  CHECK(cm.state() == pb::CLUSTER_READY);
  clock.Advance(std::chrono::seconds(2));
  REQUIRE(cm.Heartbeat("s0").ok());
  REQUIRE(cm.Heartbeat("s1").ok());
  cm.Tick();
  CHECK(cm.state() == pb::NODE_TIMEOUT);
  CHECK(cm.Find("w0")->timed_out);
  CHECK_FALSE(cm.Find("s0")->timed_out);

  pb::PersistedState again = cm.Snapshot();
  CHECK(again.nodes_size() == 3);
  CHECK(again.cluster_state() == pb::NODE_TIMEOUT);
}

TEST_CASE("restore during a scale-out rolls it back - an ended job is not restored", "[core][state]") {
  FakeClock clock;
  ClusterManager cm(Config(1, 1), &clock);
  REQUIRE(cm.Register(Req("s0", pb::SERVER)).ok());
  REQUIRE(cm.Register(Req("w0", pb::WORKER)).ok());
  REQUIRE(cm.ScaleOut(1, 2).ok());
  REQUIRE(cm.Register(Req("s1", pb::SERVER)).ok());
  const pb::PersistedState mid = cm.Snapshot();
  REQUIRE(mid.has_scale());
  CHECK(mid.cluster_state() == pb::CLUSTER_SCALE_OUT);

  ClusterManager back(Config(1, 1), &clock);
  REQUIRE(back.Restore(mid).ok());
  CHECK(back.state() == pb::CLUSTER_READY);
  CHECK(back.server_num() == 1);
  CHECK(back.Find("s1") == nullptr);
  std::set<Kind> kinds;
  for (const Event& e : back.TakeEvents()) kinds.insert(e.kind);
  CHECK(kinds.count(Kind::kRollback) == 1);
  CHECK(back.Register(Req("s1", pb::SERVER)).status().code() == Code::kInvalidArgument);  // not in the cluster

  REQUIRE(cm.SetState(pb::CLUSTER_EXIT).ok());
  ClusterManager ended(Config(1, 1), &clock);
  CHECK(ended.Restore(cm.Snapshot()).code() == Code::kFailedPrecondition);
  CHECK(back.Restore(mid).code() == Code::kFailedPrecondition);  // not fresh
}

TEST_CASE("a restored cluster still knows the processes a scale-in removed - the oldest beyond its memory go",
          "[core][state]") {
  FakeClock clock;
  ClusterManager cm(Config(1, 3), &clock);
  REQUIRE(cm.Register(Req("s0", pb::SERVER)).ok());
  REQUIRE(cm.Register(Req("s1", pb::SERVER)).ok());
  REQUIRE(cm.Register(Req("s2", pb::SERVER)).ok());
  REQUIRE(cm.Register(Req("w0", pb::WORKER)).ok());
  REQUIRE(cm.ScaleInByIds({"s1"}).ok());
  for (const char* id : {"s0", "s1", "s2", "w0"}) REQUIRE(cm.ScaleInDone(id, cm.epoch()).ok());
  REQUIRE(cm.state() == pb::CLUSTER_READY);
  REQUIRE(cm.LeftInScaleIn("s1", kInc));

  Result<pb::PersistedState> file = ParseState(SerializeState(cm.Snapshot()));
  REQUIRE(file.ok());
  REQUIRE(file->left_size() == 1);
  ClusterManager back(Config(1, 1), &clock);
  REQUIRE(back.Restore(*file).ok());
  CHECK(back.LeftInScaleIn("s1", kInc));
  CHECK_FALSE(back.LeftInScaleIn("s1", kInc + 1));  // another process under its id
  CHECK_FALSE(back.LeftInScaleIn("s0", kInc));      // a member

  // A file listing as many as a manager remembers: one more scale-in forgets the oldest.
  pb::PersistedState full = *file;
  full.clear_left();
  for (size_t i = 0; i < ClusterManager::kLeftRemembered; ++i) {
    pb::PersistedLeft* left = full.add_left();
    left->set_node_id("gone" + std::to_string(i));
    left->set_incarnation(kInc);
  }
  ClusterManager remembers(Config(1, 1), &clock);
  REQUIRE(remembers.Restore(full).ok());
  CHECK(remembers.LeftInScaleIn("gone0", kInc));
  REQUIRE(remembers.ScaleInByIds({"s2"}).ok());
  for (const char* id : {"s0", "s2", "w0"}) REQUIRE(remembers.ScaleInDone(id, remembers.epoch()).ok());
  REQUIRE(remembers.state() == pb::CLUSTER_READY);
  CHECK(remembers.LeftInScaleIn("s2", kInc));
  CHECK_FALSE(remembers.LeftInScaleIn("gone0", kInc));
  CHECK(remembers.LeftInScaleIn("gone1", kInc));
  CHECK(remembers.Snapshot().left_size() == static_cast<int>(ClusterManager::kLeftRemembered));
}

// The framing protobuf adds to one KvEntry inside PersistedState, computed from its
// encoding rules: tag + length varint for the entry, the key and the value.
uint64_t KvEntryFraming(uint64_t key_bytes, uint64_t value_bytes) {
  using google::protobuf::io::CodedOutputStream;
  uint64_t inner = 0;
  if (key_bytes > 0) inner += 1 + CodedOutputStream::VarintSize64(key_bytes) + key_bytes;
  if (value_bytes > 0) inner += 1 + CodedOutputStream::VarintSize64(value_bytes) + value_bytes;
  return 1 + CodedOutputStream::VarintSize64(inner) + inner - key_bytes - value_bytes;
}

TEST_CASE("a KV store at its cap with the most entries fits the state file - the arithmetic for the real limits",
          "[core][state]") {
  // The framing model agrees with protobuf on real entries.
  for (auto [k, v] : {std::pair<size_t, size_t>{1, 0}, {1, 1}, {127, 127}, {128, 128}, {4096, 16384}, {4096, 1 << 21}}) {
    pb::PersistedState one;
    pb::KvEntry* e = one.add_kv();
    e->set_key(std::string(k, 'k'));
    e->set_value(std::string(v, 'v'));
    INFO("key " << k << " value " << v);
    CHECK(one.ByteSizeLong() == k + v + KvEntryFraming(k, v));
  }
  // The worst framing of any entry a store may hold: the longest key, the largest value.
  const uint64_t worst = KvEntryFraming(kMaxKeyBytes, kMaxKvTotalBytes);
  CHECK(worst <= kMaxStateKvEntryOverheadBytes);
  CHECK(KvEntryFraming(1, 1) <= kMaxStateKvEntryOverheadBytes);
  // A store holding kMaxKvTotalBytes in the most entries, each framed at worst, leaves the
  // membership budget free under the body limit (it did not: the limit was 1 GiB flat).
  const uint64_t kv_worst = kMaxKvTotalBytes + uint64_t{kMaxStateKvEntries} * worst;
  CHECK(kv_worst <= kMaxStateKvBytes);
  CHECK(kv_worst + kMaxStateMembershipBytes <= kMaxStateBodyBytes);
  CHECK(kMaxStateBodyBytes <= 0x7fffffffu);
  // Whatever a scheduler is configured with, its store holds at most kMaxKvTotalBytes.
  FakeClock clock;
  KvStore unbounded(&clock, 1 << 20, /*max_total_bytes=*/0);
  KvStore huge(&clock, 1 << 20, /*max_total_bytes=*/uint64_t{1} << 40);
  CHECK(unbounded.max_total_bytes() == kMaxKvTotalBytes);
  CHECK(huge.max_total_bytes() == kMaxKvTotalBytes);
  CHECK(KvStore(&clock, 1, 4096).max_total_bytes() == 4096);
}

TEST_CASE("a KV store filled to a small cap with tiny entries is written and read back", "[core][state]") {
  // Tiny entries carry the most framing per byte stored.
  FakeClock clock;
  constexpr uint64_t kCap = 1 << 20;
  KvStore kv(&clock, 64, kCap);
  Status st;
  for (int i = 0; st.ok(); ++i) st = kv.Set(std::to_string(i), "v", true);
  REQUIRE(st.code() == Code::kResourceExhausted);
  pb::PersistedState state;
  for (const auto& [k, v] : kv.Snapshot()) {
    pb::KvEntry* e = state.add_kv();
    e->set_key(k);
    e->set_value(v);
  }
  const std::string file = SerializeState(state);
  CHECK(file.size() - kStateHeaderBytes <= kv.total_bytes() + kv.size() * kMaxStateKvEntryOverheadBytes);
  Result<pb::PersistedState> back = ParseState(file);
  REQUIRE(back.ok());
  CHECK(back->kv_size() == static_cast<int>(kv.size()));
}

}  // namespace pscore::core
