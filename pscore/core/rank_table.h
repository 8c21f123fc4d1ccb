// Rank-table builder: turns the registered nodes into the job's
// `global-ranktable` JSON in the reference format (versions 1.0 and 1.2).
// The mapping from nodes to groups, servers and devices is in docs/ranktable.md.
// Pure functions of their arguments; any thread may call them.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pscore/core/status.h"
#include "pscore/proto/comm.pb.h"

namespace pscore {
namespace core {

// One registered node as the rank table sees it.
struct RankTableNode {
  std::string node_id;
  pb::NodeRole role = pb::WORKER;
  int rank = 0;
  std::string ip;
  std::string host_name;
  std::vector<pb::Device> devices;  // Device.global_id is the dense global id.
};

// The table as JSON. `completed` means the cluster is READY ("completed"),
// otherwise "initializing". Version "1.2" (with super_device_id and
// super_pod_list) when any device has a non-empty super_pod_id, else "1.0".
// Only WORKER and SERVER nodes appear. Input order does not matter: output
// order is fixed by role, rank, node_id and device local id. rank_id counts
// the devices in table order (0..R-1, workers first); device_logical_id
// counts them per server (host) from 0.
nlohmann::json BuildRankTableJson(const std::vector<RankTableNode>& nodes, bool completed);

// The same table as compact one-line JSON text. Invalid UTF-8 in names or
// addresses is replaced with U+FFFD rather than failing.
std::string BuildRankTable(const std::vector<RankTableNode>& nodes, bool completed);

// OK when `table` is one a collective library may be handed: status "completed", rank_id
// values unique and exactly 0..R-1, and device_logical_id 0..n-1 on each server in order.
// Otherwise kInvalidArgument naming the first rule broken and where.
Status CheckCompleteRankTable(const nlohmann::json& table);

// Which tables a stream publishes (ClusterD's rules): only complete ones, and each change
// once, under a version that grows by one per published table. Not thread-safe.
class RankTableVersions {
 public:
  // The version to publish `table` under, or 0 to publish nothing: the membership is not
  // complete (`complete` false), or the text is that of the last published table.
  uint64_t Offer(bool complete, const std::string& table);
  uint64_t version() const { return version_; }  // of the last published table (0: none)

 private:
  uint64_t version_ = 0;
  std::string last_;
};

}  // namespace core
}  // namespace pscore
