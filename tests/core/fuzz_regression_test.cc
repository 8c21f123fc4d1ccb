// Regression tests for inputs found by the fuzzers (tests/fuzz/, docs/fuzzing.md).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "pscore/core/clock.h"
#include "pscore/core/cluster_manager.h"
#include "pscore/core/kv_codec.h"
#include "pscore/core/state_file.h"

#include <catch2/catch.hpp>

namespace pscore::core {
namespace {

// kv_codec_fuzz, crash-29a80a78: the encoder lays out an empty keys vector without padding
// it to 8 bytes (flatbuffers skips alignment for zero-length vectors), and the decoder
// refused its own output as "keys not 8-byte aligned". An empty vector reads nothing, so
// the decoder checks the alignment of keys only when there are keys.
TEST_CASE("kv codec: an empty batch round-trips whatever the op and the arrays present", "[core][fuzz]") {
  const uint32_t lens[1] = {0};
  const float values[1] = {0};
  for (int op = 0; op < 256; ++op) {
    for (int arrays = 0; arrays < 4; ++arrays) {
      const uint32_t* l = (arrays & 1) ? lens : nullptr;
      const float* v = (arrays & 2) ? values : nullptr;
      BufferPtr buf = EncodeKvPairs(nullptr, 0, l, v, 0, static_cast<uint8_t>(op));
      auto pull = DecodeKvPairs(buf->data(), buf->size(), /*expect_values=*/false);
      INFO("op " << op << " arrays " << arrays);
      REQUIRE(pull.ok());
      CHECK(pull->num_keys == 0);
      CHECK(pull->op == op);
      if (l != nullptr) {
        auto push = DecodeKvPairs(buf->data(), buf->size(), /*expect_values=*/true);
        REQUIRE(push.ok());
        CHECK(push->num_values == 0);
      }
    }
  }
}

// The fuzzer's input itself (29 bytes: keys and lens present and empty, op 0xf5): it
// decodes, and so must its re-encoding.
TEST_CASE("kv codec: the fuzzer's empty-keys buffer round-trips", "[core][fuzz]") {
  const unsigned char input[] = {0x0c, 0x00, 0x00, 0x00, 0x04, 0x00, 0x04, 0x00, 0x00, 0x00, 0x10,
                                 0x00, 0x0c, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00,
                                 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xf5};
  std::vector<uint64_t> aligned((sizeof input + 7) / 8);
  std::memcpy(aligned.data(), input, sizeof input);
  auto v = DecodeKvPairs(reinterpret_cast<const char*>(aligned.data()), sizeof input, false);
  REQUIRE(v.ok());
  BufferPtr again = EncodeKvPairs(v->keys, v->num_keys, v->lens, v->values, v->num_values, v->op);
  auto back = DecodeKvPairs(again->data(), again->size(), false);
  INFO(back.status().ToString());
  CHECK(back.ok());
}

pb::PersistedState ScalingOutState(bool list_added) {
  pb::PersistedState st;
  st.set_job_id("job");
  st.set_cluster_state(pb::CLUSTER_SCALE_OUT);
  st.set_epoch(4);
  st.set_worker_num(1);
  st.set_server_num(2);
  const char* ids[] = {"worker-a", "server-a", "server-b"};
  const pb::NodeRole roles[] = {pb::WORKER, pb::SERVER, pb::SERVER};
  const int ranks[] = {0, 0, 1};
  for (int i = 0; i < 3; ++i) {
    pb::PersistedNode* n = st.add_nodes();
    n->set_node_id(ids[i]);
    n->set_role(roles[i]);
    n->set_rank(ranks[i]);
    n->set_ip("127.0.0.1");
    n->set_incarnation(5 + i);
  }
  st.mutable_scale()->set_old_worker_num(1);
  st.mutable_scale()->set_old_server_num(1);
  if (list_added) st.mutable_scale()->add_added("server-b");
  return st;
}

// state_loader_fuzz, crash-8ecb45e9: a scale-out state whose new server is missing from
// scale.added loaded; the restart rolled the totals back to 1 server but kept 2, and the
// restored scheduler then wrote a state file it refused to load on the next restart.
TEST_CASE("state file: a scale operation whose rollback keeps too many nodes is refused", "[core][fuzz]") {
  auto bad = ParseState(SerializeState(ScalingOutState(false)));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == Code::kInvalidArgument);
  CHECK(bad.status().message().find("rollback") != std::string::npos);

  // crash-c0b5db6d, the same for a scale-in: its rollback restores old totals (here 0
  // servers) that the registered servers do not fit.
  pb::PersistedState in = ScalingOutState(true);
  in.set_cluster_state(pb::CLUSTER_SCALE_IN);
  in.mutable_scale()->set_scale_in(true);
  in.mutable_scale()->clear_added();
  in.mutable_scale()->set_old_server_num(0);
  auto bad_in = ParseState(SerializeState(in));
  REQUIRE_FALSE(bad_in.ok());
  CHECK(bad_in.status().message().find("rollback") != std::string::npos);

  auto good = ParseState(SerializeState(ScalingOutState(true)));
  REQUIRE(good.ok());
  FakeClock clock;
  ClusterConfig config;
  ClusterManager cluster(config, &clock);
  REQUIRE(cluster.Restore(*good).ok());
  // What a restored scheduler persists loads again.
  auto again = ParseState(SerializeState(cluster.Snapshot()));
  INFO(again.status().ToString());
  CHECK(again.ok());
}

}  // namespace
}  // namespace pscore::core
