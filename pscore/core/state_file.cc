#include "pscore/core/state_file.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include <zlib.h>

#include "pscore/core/cluster_manager.h"
#include "pscore/core/endian.h"
#include "pscore/core/kv_store.h"
#include "pscore/core/role_names.h"

namespace pscore::core {

static_assert(core::KvStore::kDefaultMaxEntries == static_cast<size_t>(core::kMaxStateKvEntries),
              "a scheduler's KV store must fit in the state file it writes");
namespace {

using internal::Err;

Status ValidateNode(const pb::PersistedNode& n) {
  if (n.node_id().empty() || n.node_id().size() > kMaxStateNodeIdBytes) {
    return Err(Code::kInvalidArgument, "node id of ", n.node_id().size(), " bytes (want 1..",
               kMaxStateNodeIdBytes, ")");
  }
  if (n.role() != pb::SERVER && n.role() != pb::WORKER) {
    return Err(Code::kInvalidArgument, "node ", n.node_id(), " has role ", static_cast<int>(n.role()));
  }
  if (n.rank() < 0 || n.rank() >= kMaxStateRoleTotal) {
    return Err(Code::kInvalidArgument, "node ", n.node_id(), " has rank ", n.rank());
  }
  if (n.port() < 0 || n.port() > 65535) {
    return Err(Code::kInvalidArgument, "node ", n.node_id(), " has port ", n.port());
  }
  if (n.devices_size() > kMaxStateDevicesPerNode) {
    return Err(Code::kInvalidArgument, "node ", n.node_id(), " has ", n.devices_size(), " devices (max ",
               kMaxStateDevicesPerNode, ")");
  }
  return Status::Ok();
}

}  // namespace

uint32_t Crc32(const void* data, size_t size, uint32_t crc) {
  // zlib's crc32 takes an unsigned length: feed it in pieces of at most 1 GiB.
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {
    const size_t n = std::min<size_t>(size, size_t{1} << 30);
    crc = static_cast<uint32_t>(crc32(crc, p, static_cast<uInt>(n)));
    p += n;
    size -= n;
  }
  return crc;
}

std::string SerializeState(const pb::PersistedState& state) {
  std::string body = state.SerializeAsString();
  std::string out(kStateHeaderBytes, '\0');
  PutLe(kStateMagic, 4, &out[0]);
  PutLe(kStateVersion, 4, &out[4]);
  PutLe(body.size(), 8, &out[8]);
  PutLe(Crc32(body.data(), body.size()), 4, &out[16]);
  out += body;
  return out;
}

Result<pb::PersistedState> ParseState(std::string_view bytes) {
  if (bytes.size() < kStateHeaderBytes) {
    return Err(Code::kInvalidArgument, "truncated: ", bytes.size(), " bytes, the header alone is ",
               kStateHeaderBytes);
  }
  const uint32_t magic = static_cast<uint32_t>(GetLe(bytes.data(), 4));
  if (magic != kStateMagic) return Err(Code::kInvalidArgument, "not a pscore state file (bad magic)");
  const uint32_t version = static_cast<uint32_t>(GetLe(bytes.data() + 4, 4));
  if (version != kStateVersion) {
    return Err(Code::kUnimplemented, "state file version ", version, "; this build reads version ",
               kStateVersion);
  }
  const uint64_t body_len = GetLe(bytes.data() + 8, 8);
  if (body_len > kMaxStateBodyBytes) {
    return Err(Code::kInvalidArgument, "body length ", body_len, " > limit ", kMaxStateBodyBytes);
  }
  const uint64_t have = bytes.size() - kStateHeaderBytes;
  if (have != body_len) {
    return Err(Code::kInvalidArgument, have < body_len ? "truncated" : "trailing bytes", ": body is ",
               have, " bytes, header says ", body_len);
  }
  const uint32_t crc = static_cast<uint32_t>(GetLe(bytes.data() + 16, 4));
  const char* body = bytes.data() + kStateHeaderBytes;
  if (Crc32(body, body_len) != crc) return Status(Code::kInvalidArgument, "checksum mismatch");
  pb::PersistedState state;
  if (!state.ParseFromArray(body, static_cast<int>(body_len))) {
    return Status(Code::kInvalidArgument, "body does not parse as PersistedState");
  }
  PSCORE_RETURN_IF_ERROR(ValidateState(state));
  return state;
}

// Barrier rounds: bounded count and sizes, each id once, a round number, a known code;
// per node, its round once and at most the barrier's.
static Status ValidateBarriers(const pb::PersistedState& state) {
  if (state.barriers_size() > kMaxStateBarriers) {
    return Err(Code::kInvalidArgument, state.barriers_size(), " barriers (max ", kMaxStateBarriers, ")");
  }
  std::set<std::string> ids;
  int joins = 0;
  for (const pb::PersistedBarrier& b : state.barriers()) {
    if (b.id().empty() || b.id().size() > kMaxStateBarrierIdBytes) {
      return Err(Code::kInvalidArgument, "barrier id of ", b.id().size(), " bytes");
    }
    if (!ids.insert(b.id()).second) return Err(Code::kInvalidArgument, "barrier ", b.id(), " listed twice");
    if (b.round() == 0) return Err(Code::kInvalidArgument, "barrier ", b.id(), " with round 0");
    if (b.code() < 0 || b.code() > static_cast<int>(Code::kUnimplemented)) {
      return Err(Code::kInvalidArgument, "barrier ", b.id(), " with unknown code ", b.code());
    }
    if (b.message().size() > kMaxStateBarrierMessageBytes) {
      return Err(Code::kInvalidArgument, "barrier ", b.id(), " message of ", b.message().size(), " bytes");
    }
    joins += b.joined_size();
    if (joins > kMaxStateBarrierJoins) {
      return Err(Code::kInvalidArgument, "over ", kMaxStateBarrierJoins, " barrier rounds of nodes");
    }
    std::set<std::string> nodes;
    for (const pb::PersistedBarrierJoin& j : b.joined()) {
      if (j.node_id().empty() || j.node_id().size() > kMaxStateNodeIdBytes) {
        return Err(Code::kInvalidArgument, "barrier ", b.id(), ": node id of ", j.node_id().size(), " bytes");
      }
      if (!nodes.insert(j.node_id()).second) {
        return Err(Code::kInvalidArgument, "barrier ", b.id(), ": node ", j.node_id(), " listed twice");
      }
      if (j.round() == 0 || j.round() > b.round()) {
        return Err(Code::kInvalidArgument, "barrier ", b.id(), ": node ", j.node_id(), " at round ", j.round(),
                   " (the barrier's is ", b.round(), ")");
      }
    }
  }
  return Status::Ok();
}

// The processes scale-ins removed: at most the manager's memory of them, each id once.
static Status ValidateLeft(const pb::PersistedState& state) {
  if (state.left_size() > static_cast<int>(ClusterManager::kLeftRemembered)) {
    return Err(Code::kInvalidArgument, state.left_size(), " nodes that left (max ", ClusterManager::kLeftRemembered,
               ")");
  }
  std::set<std::string> ids;
  for (const pb::PersistedLeft& left : state.left()) {
    if (left.node_id().empty() || left.node_id().size() > kMaxStateNodeIdBytes) {
      return Err(Code::kInvalidArgument, "node that left: id of ", left.node_id().size(), " bytes");
    }
    if (!ids.insert(left.node_id()).second) {
      return Err(Code::kInvalidArgument, "node ", left.node_id(), " listed twice as left");
    }
  }
  return Status::Ok();
}

Status ValidateState(const pb::PersistedState& state) {
  if (!pb::ClusterState_IsValid(state.cluster_state())) {
    return Err(Code::kInvalidArgument, "unknown cluster state ", static_cast<int>(state.cluster_state()));
  }
  const pb::PersistedScale& scale = state.scale();
  for (int total : {state.worker_num(), state.server_num(), scale.old_worker_num(), scale.old_server_num()}) {
    if (total < 0 || total > kMaxStateRoleTotal) return Err(Code::kInvalidArgument, "role total ", total);
  }
  if (state.nodes_size() > kMaxStateNodes) {
    return Err(Code::kInvalidArgument, state.nodes_size(), " nodes (max ", kMaxStateNodes, ")");
  }
  if (state.kv_size() > kMaxStateKvEntries) {
    return Err(Code::kInvalidArgument, state.kv_size(), " KV entries (max ", kMaxStateKvEntries, ")");
  }
  PSCORE_RETURN_IF_ERROR(ValidateBarriers(state));
  PSCORE_RETURN_IF_ERROR(ValidateLeft(state));
  std::set<std::string> ids;
  std::set<std::pair<int, int>> ranks;
  std::map<int, int> per_role;
  for (const pb::PersistedNode& n : state.nodes()) {
    PSCORE_RETURN_IF_ERROR(ValidateNode(n));
    if (!ids.insert(n.node_id()).second) return Err(Code::kInvalidArgument, "node ", n.node_id(), " listed twice");
    if (!ranks.insert({n.role(), n.rank()}).second) {
      return Err(Code::kInvalidArgument, RoleLabel(n.role()), " rank ", n.rank(), " held twice");
    }
    ++per_role[n.role()];
  }
  const bool scaling = state.has_scale();
  const int max_servers = std::max(state.server_num(), scaling ? scale.old_server_num() : 0);
  const int max_workers = std::max(state.worker_num(), scaling ? scale.old_worker_num() : 0);
  if (per_role[pb::SERVER] > max_servers || per_role[pb::WORKER] > max_workers) {
    return Err(Code::kInvalidArgument, per_role[pb::SERVER], " servers and ", per_role[pb::WORKER],
               " workers registered, over the totals ", state.server_num(), " and ", state.worker_num());
  }
  for (const std::string& id : scale.added()) {
    if (ids.count(id) == 0) return Err(Code::kInvalidArgument, "scale operation names unknown node ", id);
  }
  if (scaling) {
    // A restart rolls a scale operation back: the added nodes go, the old totals return.
    // The nodes that stay must fit those totals, or the restored registry is impossible.
    std::set<std::string> added(scale.added().begin(), scale.added().end());
    std::map<int, int> kept;
    for (const pb::PersistedNode& n : state.nodes()) {
      if (added.count(n.node_id()) == 0) ++kept[n.role()];
    }
    if (kept[pb::SERVER] > scale.old_server_num() || kept[pb::WORKER] > scale.old_worker_num()) {
      return Err(Code::kInvalidArgument, "scale rollback keeps ", kept[pb::SERVER], " servers and ",
                 kept[pb::WORKER], " workers, over the old totals ", scale.old_server_num(), " and ",
                 scale.old_worker_num());
    }
  }
  for (const pb::KvEntry& e : state.kv()) {
    if (e.key().empty() || e.key().size() > kMaxKeyBytes) {
      return Err(Code::kInvalidArgument, "KV key of ", e.key().size(), " bytes");
    }
  }
  return Status::Ok();
}

}  // namespace pscore::core
