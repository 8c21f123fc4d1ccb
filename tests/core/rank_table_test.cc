#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pscore/core/rank_table.h"

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

// The rank ids of the worker group's devices, in table order.
std::vector<std::string> WorkerRanks(const json& table) {
  std::vector<std::string> out;
  for (const json& s : table["server_group_list"][0]["server_list"]) {
    for (const json& d : s["device"]) out.push_back(d["rank_id"].get<std::string>());
  }
  return out;
}

TEST_CASE("rank table rules: rank_id dense 0..R-1, device_logical_id per server, worker ranks fixed when servers scale",
          "[core][ranktable]") {
  // Sparse and server-first global ids (as the topology numbers them) do not leak into ranks.
  std::vector<RankTableNode> nodes = {
      Node("s0", pb::SERVER, 0, "10.0.1.1", "hs0", {Dev(0, 0, "172.16.9.1"), Dev(1, 1, "172.16.9.2")}),
      Node("w0", pb::WORKER, 0, "10.0.0.1", "h0", {Dev(0, 7, "172.16.0.1"), Dev(1, 8, "172.16.0.2")}),
      Node("w1", pb::WORKER, 1, "10.0.0.2", "h1", {Dev(0, 12, "172.16.1.1"), Dev(3, 40, "172.16.1.2")}),
  };
  const json before = BuildRankTableJson(nodes, true);
  REQUIRE(CheckCompleteRankTable(before).ok());
  CHECK((WorkerRanks(before) == std::vector<std::string>{"0", "1", "2", "3"}));
  const json& h1 = before["server_group_list"][0]["server_list"][1]["device"];
  CHECK(h1[0]["device_logical_id"] == "0");
  CHECK(h1[1]["device_logical_id"] == "1");
  CHECK(h1[1]["device_id"] == "3");  // the host's own ordinal stays in device_id
  CHECK(before["server_group_list"][1]["server_list"][0]["device"][0]["rank_id"] == "4");

  // A server joins (and the topology's global ids all move): worker ranks stay.
  nodes.push_back(Node("s1", pb::SERVER, 1, "10.0.1.2", "hs1", {Dev(0, 2, "172.16.9.3")}));
  for (RankTableNode& n : nodes) {
    for (pb::Device& d : n.devices) d.set_global_id(d.global_id() + 100);
  }
  const json scaled = BuildRankTableJson(nodes, true);
  REQUIRE(CheckCompleteRankTable(scaled).ok());
  CHECK(WorkerRanks(scaled) == WorkerRanks(before));
  CHECK(scaled["server_group_list"][1]["server_list"][1]["device"][0]["rank_id"] == "6");
  CHECK(scaled["server_group_list"][1]["server_list"][1]["device"][0]["device_logical_id"] == "0");
}

TEST_CASE("rank table rules: only a complete table passes the check - each broken rule is named",
          "[core][ranktable]") {
  std::vector<RankTableNode> nodes = NodesV10();
  CHECK(CheckCompleteRankTable(BuildRankTableJson(nodes, true)).ok());
  CHECK(CheckCompleteRankTable(LoadGolden("ranktable_v1_0.json")).ok());

  Status initializing = CheckCompleteRankTable(BuildRankTableJson(nodes, false));
  CHECK(initializing.code() == Code::kInvalidArgument);
  CHECK_THAT(initializing.message(), Catch::Contains("completed"));

  json dup = BuildRankTableJson(nodes, true);
  dup["server_group_list"][0]["server_list"][1]["device"][0]["rank_id"] = "0";
  Status twice = CheckCompleteRankTable(dup);
  CHECK(twice.code() == Code::kInvalidArgument);
  CHECK_THAT(twice.message(), Catch::Contains("rank_id 0 appears twice"));

  json gap = BuildRankTableJson(nodes, true);
  gap["server_group_list"][0]["server_list"][2]["device"][0]["rank_id"] = "9";
  Status sparse = CheckCompleteRankTable(gap);
  CHECK(sparse.code() == Code::kInvalidArgument);
  CHECK_THAT(sparse.message(), Catch::Contains("rank_id 9 is not in 0..4"));

  json logical = BuildRankTableJson(nodes, true);
  logical["server_group_list"][0]["server_list"][1]["device"][0]["device_logical_id"] = "3";
  Status per_server = CheckCompleteRankTable(logical);
  CHECK(per_server.code() == Code::kInvalidArgument);
  CHECK_THAT(per_server.message(), Catch::Contains("server hostB") && Catch::Contains("device_logical_id 3"));
}

TEST_CASE("rank table versions: nothing while incomplete - one version per change - none for the same table",
          "[core][ranktable]") {
  RankTableVersions v;
  const std::string partial = BuildRankTable({NodesV10()[0]}, false);
  const std::string full = BuildRankTable(NodesV10(), true);
  CHECK(v.Offer(false, partial) == 0);  // members still registering: the stream sends nothing
  CHECK(v.version() == 0);
  CHECK(v.Offer(true, full) == 1);      // the first complete table
  CHECK(v.Offer(true, full) == 0);      // a retry, a recovered member: the same table
  CHECK(v.Offer(false, partial) == 0);  // scaling or a member timed out: nothing
  std::vector<RankTableNode> more = NodesV10();
  more.push_back(Node("w11", pb::WORKER, 11, "10.0.0.4", "", {Dev(0, 11, "192.168.0.40")}));
  CHECK(v.Offer(true, BuildRankTable(more, true)) == 2);  // one change, one version, +1
  CHECK(v.Offer(true, full) == 3);      // back to the old membership is a change too
  CHECK(v.version() == 3);
}

}  // namespace
// Builds the table on a thread of its own and waits up to `deadline`: a quadratic builder
// would take hours on these inputs, and the test must fail, not hang. The thread owns its
// input, so it may be left running when the deadline passes.
std::optional<json> BuildWithin(std::vector<RankTableNode> nodes, std::chrono::seconds deadline) {
  auto input = std::make_shared<std::vector<RankTableNode>>(std::move(nodes));
  auto done = std::make_shared<std::promise<json>>();
  std::future<json> result = done->get_future();
  std::thread([input, done] { done->set_value(BuildRankTableJson(*input, true)); }).detach();
  if (result.wait_for(deadline) != std::future_status::ready) return std::nullopt;
  return result.get();
}

// Each super_pod_list entry's servers, by pod id.
std::map<std::string, std::vector<std::string>> PodServers(const json& table) {
  std::map<std::string, std::vector<std::string>> out;
  for (const json& p : table["super_pod_list"]) {
    std::vector<std::string>& servers = out[p["super_pod_id"].get<std::string>()];
    for (const json& s : p["server_list"]) servers.push_back(s["server_id"].get<std::string>());
  }
  return out;
}

TEST_CASE("rank table of 100k devices on distinct super pods over 25 members is built - not quadratic",
          "[core][ranktable]") {
  // 25 members of 4096 devices (the most a REGISTER may carry), each device on a pod of
  // its own: the builder looked every pod up in every host's devices.
  std::vector<RankTableNode> nodes;
  int global = 0;
  for (int m = 0; m < 25; ++m) {
    std::vector<pb::Device> devs;
    for (int i = 0; i < 4096; ++i, ++global) {
      devs.push_back(Dev(i, global, "10.9.0.1", std::to_string(global), "sd"));
    }
    nodes.push_back(Node("w" + std::to_string(m), pb::WORKER, m, "10.0.0." + std::to_string(m),
                         "host" + std::to_string(m), std::move(devs)));
  }
  std::optional<json> table = BuildWithin(std::move(nodes), std::chrono::seconds(120));
  REQUIRE(table.has_value());
  const auto pods = PodServers(*table);
  REQUIRE(pods.size() == 25 * 4096);
  CHECK(pods.at("0") == std::vector<std::string>{"host0"});
  CHECK(pods.at("102399") == std::vector<std::string>{"host24"});
  // IdLess order: numeric ids ascend as numbers.
  CHECK((*table)["super_pod_list"][10]["super_pod_id"] == "10");
  CHECK((*table)["super_pod_list"].back()["super_pod_id"] == "102399");
}

TEST_CASE("rank table of 20k members on distinct hosts and pods is built - not quadratic in hosts",
          "[core][ranktable]") {
  // Every member on a host of its own: each host was found by a scan of the hosts so far.
  std::vector<RankTableNode> nodes;
  for (int m = 0; m < 20000; ++m) {
    const pb::NodeRole role = m % 2 == 0 ? pb::WORKER : pb::SERVER;
    nodes.push_back(Node("n" + std::to_string(m), role, m / 2, "10.1.0.1", "h" + std::to_string(m),
                         {Dev(0, m, "10.9.0.1", "p" + std::to_string(m)),
                          Dev(1, m, "10.9.0.1", "shared")}));
  }
  std::optional<json> table = BuildWithin(std::move(nodes), std::chrono::seconds(120));
  REQUIRE(table.has_value());
  const json& groups = (*table)["server_group_list"];
  CHECK(groups[0]["server_count"] == "10000");
  CHECK(groups[1]["server_count"] == "10000");
  const auto pods = PodServers(*table);
  REQUIRE(pods.size() == 20001);
  CHECK(pods.at("p7") == std::vector<std::string>{"h7"});
  // A pod shared by every host lists each once, group "0" hosts first, in rank order.
  const std::vector<std::string>& shared = pods.at("shared");
  REQUIRE(shared.size() == 20000);
  CHECK(shared[0] == "h0");
  CHECK(shared[1] == "h2");
  CHECK(shared[10000] == "h1");
}

}  // namespace core
}  // namespace pscore
