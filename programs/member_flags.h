// The flags of a job member's process, taken by pscore-node and pscore-train (not by
// pscore-admin): its identity, its address, the timing of its link to the scheduler,
// --launcher. Defined in member_flags.cc, linked into those two programs only. Main
// thread, at start.
#pragma once

#include <gflags/gflags.h>

#include <string>

#include "programs/flags.h"

DECLARE_string(launcher);
DECLARE_string(node_id);
DECLARE_int32(rank);
DECLARE_string(host);
DECLARE_int32(heartbeat_interval_ms);
DECLARE_int32(heartbeat_timeout_ms);
DECLARE_int32(connect_timeout_ms);
DECLARE_int64(join_timeout_ms);
DECLARE_int64(scheduler_timeout_ms);
DECLARE_int64(recovery_timeout_ms);
DECLARE_string(devices);
DECLARE_string(super_pod_id);
DECLARE_uint64(buffer_pool_mb);

namespace pscore::node::flags {

// What --launcher may fill besides the member flags: the program's own flags of that
// name, or null where the program has none (pscore-train runs as a worker: no --role,
// no counts, no --job_id, no HTTP).
struct LauncherTargets {
  std::string* role = nullptr;  // null: the process is a worker
  int* worker_num = nullptr;
  int* server_num = nullptr;
  bool counts_given = false;    // --worker_num or --server_num given
  std::string* job_id = nullptr;
  bool job_id_given = false;
  std::string* http_host = nullptr;
  bool http_host_given = false;
};

// --launcher: fills the flags not given (on the command line or as PSCORE_<FLAG>) from
// what Slurm or Kubernetes exported, resolves host names to addresses, and prints one line
// saying what was detected. A variable needed and missing is exit 2 naming it.
void ApplyLauncher(const std::string& prog, const LauncherTargets& targets);

// Exit 2 unless the heartbeat interval is > 0, the heartbeat timeout greater than it, and
// the connect timeout > 0.
void CheckHeartbeats(const std::string& prog);
// Exit 2 unless the scheduler and recovery timeouts are in range and --rank >= -1.
void CheckTimeoutsAndRank(const std::string& prog);
// Exit 2 on --buffer_pool_mb over 2^20.
void CheckBufferPool(const std::string& prog);
// Sets the process-wide buffer pool limit when --buffer_pool_mb was given (left alone
// otherwise, so an AddressSanitizer build keeps its default: off).
void ApplyBufferPool();

// The member flags into cl->node (with TLS and no --node_id, the certificate's name);
// exit 2 on a bad --devices entry. Call after LoadSecrets.
void FillMemberOptions(const std::string& prog, CommandLine* cl);

}  // namespace pscore::node::flags
