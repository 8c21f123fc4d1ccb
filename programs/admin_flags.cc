// The flags only pscore-admin takes: the command's totals and ids, output, deadlines, and
// watch-ranktable's options. Linked into pscore-admin only; with the common flags (the
// scheduler's address and credentials) they are all it takes.
#include <gflags/gflags.h>

#include <sstream>

#include "programs/common_flags.h"
#include "programs/flags.h"

DEFINE_string(job_id, "default", "Job id served by the scheduler's rank table.");
DEFINE_int32(workers, -1, "pscore-admin scale-out/scale-in: new total of workers (-1: unchanged).");
DEFINE_int32(servers, -1, "pscore-admin scale-out/scale-in: new total of servers (-1: unchanged).");
DEFINE_string(node_ids, "", "pscore-admin scale-in: comma-separated ids of the nodes to remove.");
DEFINE_bool(json, false, "pscore-admin: print JSON instead of text (status, nodes, kv, barriers).");
DEFINE_int64(timeout_ms, 10000, "pscore-admin: deadline of the connection and of each request.");
DEFINE_bool(wait, true, "pscore-admin scale-out/scale-in: wait until the cluster is READY again.");
DEFINE_int64(wait_timeout_ms, 120000, "pscore-admin --wait: how long to wait for READY.");
DEFINE_int64(reconnect_ms, 0,
             "pscore-admin watch-ranktable: after the stream breaks, subscribe again for up to this long "
             "(follows a scheduler restart; 0: end with the stream).");
DEFINE_bool(publisher, false,
            "pscore-admin watch-ranktable: register as the job's rank-table publisher first and follow the "
            "table under that registration (the job's next registration ends it, exit 1).");

namespace pscore::node {

CommandLine ParseAdminFlags(int* argc, char*** argv, const char* usage) {
  const std::string prog = flags::ParseCommandLine(argc, argv, usage);
  flags::CheckPort(prog, "scheduler_port", FLAGS_scheduler_port);
  flags::CheckMaxMessageBytes(prog);
  CommandLine cl;
  flags::LoadSecrets(prog, &cl);
  flags::FillSchedulerLink(&cl);
  cl.scheduler.job_id = FLAGS_job_id;
  if (FLAGS_workers < -1 || FLAGS_servers < -1) flags::Die(prog, "--workers and --servers must be >= 0");
  flags::CheckMs(prog, "timeout_ms", FLAGS_timeout_ms, 1);
  flags::CheckMs(prog, "wait_timeout_ms", FLAGS_wait_timeout_ms, 1);
  flags::CheckMs(prog, "reconnect_ms", FLAGS_reconnect_ms, 0);
  AdminFlags& a = cl.admin;
  a.workers = FLAGS_workers;
  a.servers = FLAGS_servers;
  std::stringstream ids(FLAGS_node_ids);
  for (std::string id; std::getline(ids, id, ',');) {
    if (!id.empty()) a.node_ids.push_back(id);
  }
  a.json = FLAGS_json;
  a.timeout_ms = FLAGS_timeout_ms;
  a.wait = FLAGS_wait;
  a.wait_timeout_ms = FLAGS_wait_timeout_ms;
  a.reconnect_ms = FLAGS_reconnect_ms;
  a.publisher = FLAGS_publisher;
  return cl;
}

}  // namespace pscore::node
