// The flags only pscore-node takes: the scheduler's job settings, a server's store and
// journal, the HTTP endpoint, accept limits, finishing. Linked into pscore-node only.
#include <gflags/gflags.h>

#include <algorithm>
#include <sstream>

#include "pscore/core/cluster_manager.h"
#include "pscore/core/role_names.h"
#include "programs/common_flags.h"
#include "programs/flags.h"
#include "programs/member_flags.h"

DEFINE_string(role, "", "Node role: scheduler, worker or server.");
DEFINE_int32(worker_num, 1, "Number of workers in the job (scheduler).");
DEFINE_int32(server_num, 1, "Number of servers in the job (scheduler).");
DEFINE_int32(port, 0, "Port a server binds (0: a free port).");
DEFINE_int32(scale_timeout_ms, 30000,
             "Rollback deadline of a scale operation (scheduler). Keep it under the workers' "
             "--request_timeout_ms, so calls held by a scale outlive its rollback.");
DEFINE_int32(isolation_timeout_ms, 15000,
             "Scheduler: every member silent past the heartbeat timeout at once is taken for the scheduler's "
             "own network for this long before they time out (0: they time out at once). Keep it at the "
             "members' --recovery_timeout_ms.");
DEFINE_string(recoverable_roles, "",
              "Scheduler: roles (worker, server; comma-separated) whose members may restart with a new "
              "incarnation without being recorded in error and told to the others (empty: none).");
DEFINE_uint64(max_kv_value_bytes, 16u << 20, "Scheduler: largest value the key-value store takes (a KvSet of a larger "
              "one is refused kInvalidArgument).");
DEFINE_uint64(max_kv_total_mb, 1024, "Scheduler: MiB of keys and values the key-value store holds at most; a KvSet "
              "that would grow it past this is refused kResourceExhausted (0: no cap).");
DEFINE_string(job_id, "default", "Job id served by the scheduler's rank table.");
DEFINE_string(http_host, "127.0.0.1", "Bind address of the HTTP endpoint (--http_port).");
DEFINE_int32(http_port, -1, "HTTP port (-1: off, 0: a free port): the scheduler's admin, rank-table and /metrics "
             "endpoint; a worker's or server's /metrics.");
DEFINE_int32(replicas, 1, "Scheduler: copies of each server's key range (primary plus backups on the next servers); "
             "a push is acknowledged once every live copy applied it, and a lost server's ranges fail over to a "
             "copy. 2 is the recommended setting; at most --server_num.");
DEFINE_int32(handler_threads, 2, "Executor threads for server handlers (0: run on the loop thread).");
DEFINE_bool(auto_finish, true, "Worker/server: join the finish barrier once READY and serve until the job ends.");
DEFINE_int64(finish_timeout_ms, 24LL * 3600 * 1000, "Deadline of this node's finish barrier.");
DEFINE_string(http_port_file, "", "Write the bound HTTP port to this file (with --http_port >= 0).");
DEFINE_string(port_file, "", "Write the bound port (scheduler: scheduler port; server: data port) to this file.");
DEFINE_string(state_dir, "", "Scheduler: persist membership, cluster state and the KV store in this directory and "
              "reload them on restart, so nodes re-register and the job carries on (empty: off).");
DEFINE_bool(state_reset_on_corrupt, false, "Scheduler: a damaged state file is set aside (.corrupt) and the job "
            "starts fresh, instead of exiting 1.");
DEFINE_string(tls_admin_cns, "admin", "Scheduler with TLS: comma-separated certificate CNs allowed to use admin "
              "commands (every other certificate gets only 'status').");
DEFINE_int32(max_connections, 10000, "Scheduler and server: accepted connections beyond this many open at once are "
             "closed at once with a log line (0: no cap).");
DEFINE_int32(first_frame_timeout_ms, 30000, "Scheduler and server: an accepted connection that sends no whole frame "
             "within this long is closed (0: never).");
DEFINE_int32(partial_frame_timeout_ms, 30000, "Scheduler and server: a connection that began a frame and sent no byte "
             "of it for this long is closed (0: never).");
DEFINE_string(data_dir, "", "Server: journal the parameter store in this directory (one per server) so a restart "
              "with the same --node_id and directory gets its parameters back. Empty: memory only.");
DEFINE_uint64(journal_compact_mb, 64, "Server with --data_dir: the journal's newest segment is compacted in the "
              "background once it passes max(this many MiB, 4x the last compacted file).");
DEFINE_string(update_rule, "sum", "Server parameter store rule: assign, sum or sgd.");
DEFINE_double(learning_rate, 0.1, "Learning rate of the sgd update rule.");
DEFINE_uint64(stream_spare_mb, 512, "Server: MiB of spare blocks kept for pushes folded into the store as they "
              "arrive (large ZPushes); a key larger than this is applied whole instead (0: never folded in).");
DEFINE_uint32(store_threads, 0, "Server: threads that apply or read one push or pull of many keys (64 Ki keys each, "
              "the handler's own one of them; 0: the machine's cores, at most 4; 1: the handler alone).");

namespace pscore::node {
namespace {

using flags::Die;

// The job's shape: ports, member counts and replicas.
void CheckJobShape(const std::string& prog) {
  flags::CheckPort(prog, "scheduler_port", FLAGS_scheduler_port);
  flags::CheckPort(prog, "port", FLAGS_port);
  if (FLAGS_http_port < -1 || FLAGS_http_port > 65535) Die(prog, "--http_port must be -1 or in [0, 65535]");
  if (FLAGS_worker_num < 0 || FLAGS_server_num < 0 || FLAGS_worker_num > core::kMaxRoleTotal ||
      FLAGS_server_num > core::kMaxRoleTotal) {
    Die(prog, "--worker_num and --server_num must be in [0, " + std::to_string(core::kMaxRoleTotal) + "]");
  }
  if (FLAGS_worker_num + FLAGS_server_num == 0) Die(prog, "the job needs at least one worker or server");
  if (FLAGS_replicas < 1 || (FLAGS_role == "scheduler" && FLAGS_replicas > std::max(1, FLAGS_server_num))) {
    Die(prog, "--replicas must be in [1, --server_num] (got " + std::to_string(FLAGS_replicas) + " with " +
                  std::to_string(FLAGS_server_num) + " servers)");
  }
}

// Sizes, limits and rules of the scheduler's store, the server's store and journal, and
// accepted connections.
void CheckLimits(const std::string& prog) {
  if (FLAGS_stream_spare_mb > (1ull << 20)) Die(prog, "--stream_spare_mb must be <= 1048576");
  if (FLAGS_store_threads > 64) Die(prog, "--store_threads must be in [0, 64]");
  if (FLAGS_max_kv_value_bytes < 1 || FLAGS_max_kv_value_bytes > FLAGS_max_message_bytes) {
    Die(prog, "--max_kv_value_bytes must be in [1, --max_message_bytes]");
  }
  if (FLAGS_max_kv_total_mb > (1ull << 30)) Die(prog, "--max_kv_total_mb must be <= 1073741824");
  if (FLAGS_journal_compact_mb < 1 || FLAGS_journal_compact_mb > (1ull << 20)) {
    Die(prog, "--journal_compact_mb must be in [1, 1048576]");
  }
  flags::ApplyBufferPool();  // process-wide
  if (FLAGS_max_connections < 0) Die(prog, "--max_connections must be >= 0");
  if (FLAGS_first_frame_timeout_ms < 0) Die(prog, "--first_frame_timeout_ms must be >= 0");
  if (FLAGS_partial_frame_timeout_ms < 0) Die(prog, "--partial_frame_timeout_ms must be >= 0");
  if (FLAGS_update_rule != "assign" && FLAGS_update_rule != "sum" && FLAGS_update_rule != "sgd") {
    Die(prog, "--update_rule must be assign, sum or sgd (got '" + FLAGS_update_rule + "')");
  }
}

void CheckNodeFlags(const std::string& prog) {
  CheckJobShape(prog);
  flags::CheckHeartbeats(prog);
  if (FLAGS_scale_timeout_ms <= 0) Die(prog, "--scale_timeout_ms must be > 0");
  if (FLAGS_isolation_timeout_ms < 0) Die(prog, "--isolation_timeout_ms must be >= 0");
  // Each is a thread of the server's executor.
  if (FLAGS_handler_threads < 0 || FLAGS_handler_threads > 1024) Die(prog, "--handler_threads must be in [0, 1024]");
  flags::CheckMs(prog, "finish_timeout_ms", FLAGS_finish_timeout_ms, 1);
  flags::CheckTimeoutsAndRank(prog);
  flags::CheckMaxMessageBytes(prog);
  flags::CheckBufferPool(prog);
  CheckLimits(prog);
  // A member with no scheduler port would dial port 0 until --connect_timeout_ms.
  if ((FLAGS_role == "worker" || FLAGS_role == "server") && FLAGS_scheduler_port == 0) {
    Die(prog, "--scheduler_port is required with --role=" + FLAGS_role + " (the scheduler's port, 1-65535)");
  }
}

AcceptLimits AcceptLimitsFromFlags() {
  AcceptLimits a;
  a.max_connections = static_cast<size_t>(FLAGS_max_connections);
  a.first_frame_timeout = std::chrono::milliseconds(FLAGS_first_frame_timeout_ms);
  a.partial_frame_timeout = std::chrono::milliseconds(FLAGS_partial_frame_timeout_ms);
  return a;
}

// "worker,server" into roles; exit 2 on any other name (an empty one included).
std::vector<pb::NodeRole> RecoverableRoles(const std::string& prog) {
  std::vector<pb::NodeRole> out;
  const std::string& list = FLAGS_recoverable_roles;
  for (size_t start = 0; !list.empty() && start <= list.size();) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    const std::string name = list.substr(start, comma - start);
    std::optional<pb::NodeRole> role = core::ParseRoleLabel(name);
    if (!role || *role == pb::SCHEDULER) Die(prog, "--recoverable_roles: unknown role '" + name + "' (worker, server)");
    out.push_back(*role);
    start = comma + 1;
  }
  return out;
}

void FillSchedulerOptions(const std::string& prog, SchedulerOptions* s) {
  s->host = FLAGS_host;
  s->port = FLAGS_scheduler_port;
  s->worker_num = FLAGS_worker_num;
  s->server_num = FLAGS_server_num;
  s->heartbeat_interval = std::chrono::milliseconds(FLAGS_heartbeat_interval_ms);
  s->heartbeat_timeout = std::chrono::milliseconds(FLAGS_heartbeat_timeout_ms);
  s->scale_timeout = std::chrono::milliseconds(FLAGS_scale_timeout_ms);
  s->isolation_timeout = std::chrono::milliseconds(FLAGS_isolation_timeout_ms);
  std::stringstream cns(FLAGS_tls_admin_cns);
  s->tls_admin_cns.clear();
  for (std::string cn; std::getline(cns, cn, ',');) {
    if (!cn.empty()) s->tls_admin_cns.push_back(cn);
  }
  s->recoverable_roles = RecoverableRoles(prog);
  s->max_kv_value_bytes = static_cast<size_t>(FLAGS_max_kv_value_bytes);
  s->max_kv_total_bytes = FLAGS_max_kv_total_mb << 20;
  s->job_id = FLAGS_job_id;
  s->http_host = FLAGS_http_host;
  s->http_port = FLAGS_http_port;
  s->state_dir = FLAGS_state_dir;
  s->state_reset_on_corrupt = FLAGS_state_reset_on_corrupt;
  s->accept = AcceptLimitsFromFlags();
  s->replicas = FLAGS_replicas;
}

// A server's own options, and what pscore-node does around the node.
void FillServerAndRun(CommandLine* cl) {
  NodeOptions& n = cl->node;
  n.port = FLAGS_port;
  n.handler_threads = FLAGS_handler_threads;
  n.data_dir = FLAGS_data_dir;
  n.journal_compact_bytes = FLAGS_journal_compact_mb << 20;
  n.accept = AcceptLimitsFromFlags();
  cl->auto_finish = FLAGS_auto_finish;
  cl->finish_timeout_ms = FLAGS_finish_timeout_ms;
  cl->port_file = FLAGS_port_file;
  cl->http_port_file = FLAGS_http_port_file;
  cl->update_rule = FLAGS_update_rule;
  cl->learning_rate = static_cast<float>(FLAGS_learning_rate);
  cl->stream_spare_bytes = FLAGS_stream_spare_mb << 20;
  cl->store_threads = FLAGS_store_threads;
}

}  // namespace

CommandLine ParseNodeFlags(int* argc, char*** argv, const char* usage) {
  const std::string prog = flags::ParseCommandLine(argc, argv, usage);
  flags::LauncherTargets targets;
  targets.role = &FLAGS_role;
  targets.worker_num = &FLAGS_worker_num;
  targets.server_num = &FLAGS_server_num;
  targets.counts_given = flags::Given("worker_num") || flags::Given("server_num");
  targets.job_id = &FLAGS_job_id;
  targets.job_id_given = flags::Given("job_id");
  targets.http_host = &FLAGS_http_host;
  targets.http_host_given = flags::Given("http_host");
  flags::ApplyLauncher(prog, targets);
  CheckNodeFlags(prog);
  CommandLine cl;
  cl.role = FLAGS_role;
  flags::LoadSecrets(prog, &cl);
  FillSchedulerOptions(prog, &cl.scheduler);
  flags::FillSchedulerLink(&cl);
  flags::FillMemberOptions(prog, &cl);
  FillServerAndRun(&cl);
  return cl;
}

}  // namespace pscore::node
