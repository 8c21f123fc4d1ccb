#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/rank_table.h"

// Catch2 last: glog (via the generated protobuf headers) also defines CHECK,
// and the last definition wins. We want Catch's.
#include <catch2/catch.hpp>

namespace pscore {
namespace core {
namespace {

using nlohmann::json;

json LoadGolden(const std::string& name) {
  std::ifstream in(std::string(PSCORE_SOURCE_DIR) + "/tests/core/golden/" + name);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  REQUIRE_FALSE(j.is_discarded());
  return j;
}

pb::Device Dev(int local, int global, const std::string& ip, const std::string& pod = "",
               const std::string& super_device = "") {
  pb::Device d;
  d.set_local_id(local);
  d.set_global_id(global);
  d.set_device_ip(ip);
  d.set_super_pod_id(pod);
  d.set_super_device_id(super_device);
  return d;
}

RankTableNode Node(const std::string& id, pb::NodeRole role, int rank, const std::string& ip,
                   const std::string& host, std::vector<pb::Device> devices = {}) {
  return RankTableNode{id, role, rank, ip, host, std::move(devices)};
}

// Nodes of the 1.0 golden table, deliberately out of order: rank 10 must
// follow rank 9, devices sort by local id, hostless nodes fall back to ip.
std::vector<RankTableNode> NodesV10() {
  return {
      Node("w10", pb::WORKER, 10, "10.0.0.3", "", {Dev(0, 10, "192.168.0.30")}),
      Node("s1", pb::SERVER, 1, "10.0.0.1", "hostA"),
      Node("w1", pb::WORKER, 1, "10.0.0.1", "hostA", {Dev(2, 2, "192.168.0.12")}),
      Node("sched", pb::SCHEDULER, 0, "10.0.9.9", "hostS", {Dev(0, 99, "1.1.1.1")}),
      Node("w9", pb::WORKER, 9, "10.0.0.2", "hostB", {Dev(0, 9, "192.168.0.20")}),
      Node("w0", pb::WORKER, 0, "10.0.0.1", "hostA",
           {Dev(1, 1, "192.168.0.11"), Dev(0, 0, "192.168.0.10")}),
      Node("s0", pb::SERVER, 0, "10.0.1.1", "hostC"),
  };
}

std::vector<RankTableNode> NodesV12() {
  return {
      Node("w1", pb::WORKER, 1, "10.1.0.2", "h2",
           {Dev(0, 2, "172.16.1.1", "10", "200"), Dev(1, 3, "172.16.1.2", "9", "201")}),
      Node("w0", pb::WORKER, 0, "10.1.0.1", "h1",
           {Dev(0, 0, "172.16.0.1", "9", "100"), Dev(1, 1, "172.16.0.2", "9", "101")}),
      Node("s0", pb::SERVER, 0, "10.1.0.3", "h3"),
  };
}

// Every scalar in the table is a JSON string, as in the reference format.
void CheckAllLeavesAreStrings(const json& j, const std::string& path) {
  if (j.is_object() || j.is_array()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      CheckAllLeavesAreStrings(*it, path + "/" + (j.is_object() ? it.key() : "[]"));
    }
    return;
  }
  INFO(path);
  CHECK(j.is_string());
}

void CheckKeys(const json& obj, const std::vector<std::string>& keys) {
  REQUIRE(obj.is_object());
  CHECK(obj.size() == keys.size());
  for (const std::string& k : keys) {
    INFO("field " << k);
    CHECK(obj.contains(k));
  }
}

// Every object carries exactly the fields of its level.
void CheckShape(const json& t, bool v12) {
  CheckKeys(t, v12 ? std::vector<std::string>{"version", "status", "server_group_list",
                                               "super_pod_list"}
                   : std::vector<std::string>{"version", "status", "server_group_list"});
  for (const json& g : t["server_group_list"]) {
    CheckKeys(g, {"group_id", "deploy_server", "server_count", "server_list"});
    CHECK(g["server_count"] == std::to_string(g["server_list"].size()));
    for (const json& s : g["server_list"]) {
      CheckKeys(s, {"server_id", "server_ip", "device"});
      for (const json& d : s["device"]) {
        std::vector<std::string> fields = {"device_id", "device_ip", "device_logical_id", "rank_id"};
        if (v12) fields.push_back("super_device_id");
        CheckKeys(d, fields);
      }
    }
  }
  if (v12) {
    for (const json& p : t["super_pod_list"]) {
      CheckKeys(p, {"super_pod_id", "server_list"});
      for (const json& s : p["server_list"]) CheckKeys(s, {"server_id"});
    }
  }
  CheckAllLeavesAreStrings(t, "");
}

TEST_CASE("rank table 1.0 matches the golden file", "[core][ranktable]") {
  const json golden = LoadGolden("ranktable_v1_0.json");
  const json built = BuildRankTableJson(NodesV10(), /*completed=*/true);
  CHECK(built == golden);
  CheckShape(built, false);
  CheckShape(golden, false);
  const std::string text = BuildRankTable(NodesV10(), true);
  CHECK(text.find('\n') == std::string::npos);
  CHECK(json::parse(text, nullptr, false) == golden);
}

TEST_CASE("rank table 1.2 matches the golden file", "[core][ranktable]") {
  const json golden = LoadGolden("ranktable_v1_2.json");
  const json built = BuildRankTableJson(NodesV12(), /*completed=*/false);
  CHECK(built == golden);
  CheckShape(built, true);
  CheckShape(golden, true);
  CHECK(json::parse(BuildRankTable(NodesV12(), false), nullptr, false) == golden);
}

TEST_CASE("rank table is independent of input order", "[core][ranktable]") {
  std::vector<RankTableNode> nodes = NodesV10();
  const std::string expected = BuildRankTable(nodes, true);
  std::reverse(nodes.begin(), nodes.end());
  CHECK(BuildRankTable(nodes, true) == expected);
  std::rotate(nodes.begin(), nodes.begin() + 3, nodes.end());
  CHECK(BuildRankTable(nodes, true) == expected);
}

TEST_CASE("empty cluster and hostile strings still give a valid table", "[core][ranktable]") {
  const json empty = BuildRankTableJson({}, false);
  CHECK(empty["version"] == "1.0");
  CHECK(empty["status"] == "initializing");
  REQUIRE(empty["server_group_list"].size() == 2);
  CHECK(empty["server_group_list"][0]["server_count"] == "0");
  CheckShape(empty, false);

  // Invalid UTF-8 from a peer must not make serialisation fail.
  std::vector<RankTableNode> nodes = {Node("w0", pb::WORKER, 0, "10.0.0.1", "bad\xff\"host")};
  const std::string text = BuildRankTable(nodes, true);
  const json parsed = json::parse(text, nullptr, false);
  REQUIRE_FALSE(parsed.is_discarded());
  CHECK(parsed["server_group_list"][0]["server_list"][0]["server_id"] == "bad\xEF\xBF\xBD\"host");
}

}  // namespace
}  // namespace core
}  // namespace pscore
