#include "pscore/core/rank_table.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace pscore {
namespace core {
namespace {

using nlohmann::json;

// Groups of the table, in output order: group "0" holds the worker role's
// hosts, group "1" the server role's hosts; deploy_server is "1" for the latter.
struct GroupSpec {
  pb::NodeRole role;
  const char* group_id;
  const char* deploy_server;
};
constexpr GroupSpec kGroups[] = {{pb::WORKER, "0", "0"}, {pb::SERVER, "1", "1"}};

// One host of a group: the nodes on it, in rank order.
struct Host {
  std::string server_id;
  std::string server_ip;
  std::vector<const RankTableNode*> nodes;
};

std::string HostKey(const RankTableNode& n) { return n.host_name.empty() ? n.ip : n.host_name; }

bool NodeLess(const RankTableNode* a, const RankTableNode* b) {
  return std::tie(a->rank, a->node_id) < std::tie(b->rank, b->node_id);
}

// Numeric order for all-digit ids (so "10" follows "9"), then the rest by text.
bool IdLess(const std::string& a, const std::string& b) {
  auto numeric = [](const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const bool na = numeric(a);
  const bool nb = numeric(b);
  if (na != nb) return na;
  if (na) {
    // Leading zeros aside, a shorter digit string is a smaller number.
    const size_t za = a.find_first_not_of('0');
    const size_t zb = b.find_first_not_of('0');
    const std::string ta = za == std::string::npos ? "" : a.substr(za);
    const std::string tb = zb == std::string::npos ? "" : b.substr(zb);
    if (ta.size() != tb.size()) return ta.size() < tb.size();
    if (ta != tb) return ta < tb;
  }
  return a < b;
}

// The role's hosts, ordered by their lowest-ranked node. O(n log n) in the role's nodes.
std::vector<Host> HostsOfRole(const std::vector<RankTableNode>& nodes, pb::NodeRole role) {
  std::vector<const RankTableNode*> members;
  for (const RankTableNode& n : nodes) {
    if (n.role == role) members.push_back(&n);
  }
  std::sort(members.begin(), members.end(), NodeLess);
  std::vector<Host> hosts;
  std::unordered_map<std::string, size_t> index;  // server_id -> position in hosts
  for (const RankTableNode* n : members) {
    std::string key = HostKey(*n);
    auto [it, added] = index.try_emplace(key, hosts.size());
    if (added) hosts.push_back(Host{std::move(key), n->ip, {}});
    hosts[it->second].nodes.push_back(n);
  }
  return hosts;
}

// The devices of a host: node by node in rank order, each node's by local id.
std::vector<pb::Device> DevicesOf(const Host& host) {
  std::vector<pb::Device> out;
  for (const RankTableNode* n : host.nodes) {
    std::vector<pb::Device> devs = n->devices;
    std::stable_sort(devs.begin(), devs.end(), [](const pb::Device& a, const pb::Device& b) {
      return std::make_tuple(a.local_id(), a.global_id()) <
             std::make_tuple(b.local_id(), b.global_id());
    });
    out.insert(out.end(), devs.begin(), devs.end());
  }
  return out;
}

// logical: the device's position on its server (host); rank: its position in the table.
json DeviceJson(const pb::Device& d, bool v12, int logical, int rank) {
  json j = json::object();
  j["device_id"] = std::to_string(d.local_id());
  j["device_ip"] = d.device_ip();
  j["device_logical_id"] = std::to_string(logical);
  j["rank_id"] = std::to_string(rank);
  if (v12) j["super_device_id"] = d.super_device_id();
  return j;
}

// next_rank: the rank of the host's first device; moved past its last.
json ServerJson(const Host& host, bool v12, int* next_rank) {
  json devices = json::array();
  int logical = 0;
  for (const pb::Device& d : DevicesOf(host)) devices.push_back(DeviceJson(d, v12, logical++, (*next_rank)++));
  json j = json::object();
  j["server_id"] = host.server_id;
  j["server_ip"] = host.server_ip;
  j["device"] = std::move(devices);
  return j;
}

bool AnySuperPod(const std::vector<RankTableNode>& nodes) {
  for (const RankTableNode& n : nodes) {
    for (const pb::Device& d : n.devices) {
      if (!d.super_pod_id().empty()) return true;
    }
  }
  return false;
}

// super_pod_list: pods in IdLess order; each lists the hosts having a device
// in it, once, in table order (group "0" hosts first). One pass over the devices
// and a sort of the pods: O(d log d) in the devices.
json SuperPodList(const std::vector<std::vector<Host>>& groups) {
  struct Pod {
    std::vector<const std::string*> servers;  // server ids in table order
    std::unordered_set<std::string> seen;
  };
  std::unordered_map<std::string, Pod> pods;
  for (const auto& hosts : groups) {
    for (const Host& h : hosts) {
      for (const RankTableNode* n : h.nodes) {
        for (const pb::Device& d : n->devices) {
          if (d.super_pod_id().empty()) continue;
          Pod& pod = pods[d.super_pod_id()];
          if (pod.seen.insert(h.server_id).second) pod.servers.push_back(&h.server_id);
        }
      }
    }
  }
  std::vector<const std::string*> order;
  order.reserve(pods.size());
  for (const auto& [id, pod] : pods) order.push_back(&id);
  std::sort(order.begin(), order.end(),
            [](const std::string* a, const std::string* b) { return IdLess(*a, *b); });
  json list = json::array();
  for (const std::string* id : order) {
    json servers = json::array();
    for (const std::string* server : pods.at(*id).servers) servers.push_back({{"server_id", *server}});
    list.push_back({{"super_pod_id", *id}, {"server_list", std::move(servers)}});
  }
  return list;
}

}  // namespace

json BuildRankTableJson(const std::vector<RankTableNode>& nodes, bool completed) {
  const bool v12 = AnySuperPod(nodes);
  std::vector<std::vector<Host>> groups;
  json group_list = json::array();
  // Ranks count the devices in table order, so they are 0..R-1 with the workers' first:
  // scaling the servers never moves a worker device's rank.
  int next_rank = 0;
  for (const GroupSpec& spec : kGroups) {
    groups.push_back(HostsOfRole(nodes, spec.role));
    json servers = json::array();
    for (const Host& h : groups.back()) servers.push_back(ServerJson(h, v12, &next_rank));
    json g = json::object();
    g["group_id"] = spec.group_id;
    g["deploy_server"] = spec.deploy_server;
    g["server_count"] = std::to_string(groups.back().size());
    g["server_list"] = std::move(servers);
    group_list.push_back(std::move(g));
  }
  json table = json::object();
  table["version"] = v12 ? "1.2" : "1.0";
  table["status"] = completed ? "completed" : "initializing";
  table["server_group_list"] = std::move(group_list);
  if (v12) table["super_pod_list"] = SuperPodList(groups);
  return table;
}

std::string BuildRankTable(const std::vector<RankTableNode>& nodes, bool completed) {
  return BuildRankTableJson(nodes, completed)
      .dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

Status CheckCompleteRankTable(const json& table) {
  auto bad = [](const std::string& why) { return Status(Code::kInvalidArgument, "rank table: " + why); };
  if (!table.is_object() || !table.contains("status") || table["status"] != "completed") {
    return bad("status is not \"completed\"");
  }
  if (!table.contains("server_group_list") || !table["server_group_list"].is_array()) {
    return bad("no server_group_list");
  }
  std::vector<bool> seen;
  std::vector<std::string> ranks;
  for (const json& group : table["server_group_list"]) {
    if (!group.contains("server_list") || !group["server_list"].is_array()) return bad("a group has no server_list");
    for (const json& server : group["server_list"]) {
      const std::string where = "server " + server.value("server_id", std::string("?"));
      if (!server.contains("device") || !server["device"].is_array()) return bad(where + " has no device list");
      int logical = 0;
      for (const json& d : server["device"]) {
        if (d.value("device_logical_id", std::string()) != std::to_string(logical)) {
          return bad(where + ": device_logical_id " + d.value("device_logical_id", std::string("?")) +
                     " where " + std::to_string(logical) + " belongs");
        }
        ++logical;
        ranks.push_back(d.value("rank_id", std::string()));
      }
    }
  }
  seen.assign(ranks.size(), false);
  for (const std::string& r : ranks) {
    const bool digits = !r.empty() && r.size() < 10 &&
                        std::all_of(r.begin(), r.end(), [](char c) { return c >= '0' && c <= '9'; });
    const size_t v = digits ? std::stoul(r) : ranks.size();
    if (v >= ranks.size()) {
      return bad("rank_id " + r + " is not in 0.." + std::to_string(static_cast<int64_t>(ranks.size()) - 1));
    }
    if (seen[v]) return bad("rank_id " + r + " appears twice");
    seen[v] = true;
  }
  return Status::Ok();
}

uint64_t RankTableVersions::Offer(bool complete, const std::string& table) {
  if (!complete || (version_ != 0 && table == last_)) return 0;
  last_ = table;
  return ++version_;
}

}  // namespace core
}  // namespace pscore
