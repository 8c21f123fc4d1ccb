#include "programs/member_flags.h"

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <vector>

#include "pscore/comm/tls.h"
#include "pscore/core/buffer.h"
#include "programs/common_flags.h"
#include "programs/launcher.h"

extern char** environ;

DEFINE_string(launcher, "auto", "Where the job's layout comes from: env (flags and PSCORE_<FLAG> only), slurm, k8s, "
              "or auto (slurm when SLURM_JOB_ID and SLURM_PROCID are set, else k8s when KUBERNETES_SERVICE_HOST is "
              "set, else env). Detection fills only the flags not given (docs/deploy.md).");
DEFINE_string(node_id, "", "Stable node id; a restarted process with the same id gets its rank back. Empty: random.");
DEFINE_int32(rank, -1, "Rank to ask for (-1: any free rank).");
DEFINE_string(host, "127.0.0.1", "Address this node binds and advertises.");
DEFINE_int32(heartbeat_interval_ms, 1000, "Heartbeat period.");
DEFINE_int32(heartbeat_timeout_ms, 5000, "A node silent this long is timed out (scheduler).");
DEFINE_int32(connect_timeout_ms, 30000, "How long a node keeps retrying to reach the scheduler before it gives up.");
DEFINE_int64(join_timeout_ms, 60000, "A new node refused because its role's quota is full (started before the scale-out "
             "that makes room for it) or because a scale-in runs registers again until this long after the first "
             "refusal, then exits 1 (0: at once).");
DEFINE_int64(scheduler_timeout_ms, 0, "Worker/server: no answer from the scheduler for this long is logged and the "
             "link redialed (0: 2 x --heartbeat_timeout_ms).");
DEFINE_int64(recovery_timeout_ms, 15000, "Worker/server: how long a push or pull whose server was lost is retried, and "
             "how long the scheduler may stay silent (at least --scheduler_timeout_ms) before the node exits with code 4.");
DEFINE_string(devices, "", "Local devices: comma-separated ordinals, each optionally id@device_ip (e.g. 0@10.0.0.1,1@10.0.0.2).");
DEFINE_string(super_pod_id, "", "Super-pod of this node's devices (rank table 1.2).");
DEFINE_int32(poll_spin_us, 0, "Worker/server: after a lone request goes out, or the last answer comes in, the node's "
             "loop polls without sleeping this many microseconds: lower latency for one small request at a time, "
             "at the price of a core meanwhile (0: off; at most 100000).");
DEFINE_uint64(buffer_pool_mb, 256, "Released payload buffers of 16 KiB and more are kept for reuse up to this many "
              "MiB (0: none), so large transfers do not fault in fresh pages for every message.");

namespace pscore::node::flags {
namespace {

std::vector<pb::Device> ParseDevices(const std::string& prog, const std::string& spec) {
  std::vector<pb::Device> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    pb::Device d;
    std::string id = item, ip;
    size_t at = item.find('@');
    if (at != std::string::npos) {
      id = item.substr(0, at);
      ip = item.substr(at + 1);
    }
    char* end = nullptr;
    long v = std::strtol(id.c_str(), &end, 10);
    if (id.empty() || *end != '\0' || v < 0 || v > 1 << 20) Die(prog, "--devices: bad device ordinal '" + id + "'");
    d.set_local_id(static_cast<int>(v));
    d.set_device_ip(ip);
    d.set_super_pod_id(FLAGS_super_pod_id);
    if (!FLAGS_super_pod_id.empty()) d.set_super_device_id(std::to_string(v));
    out.push_back(d);
  }
  return out;
}

EnvMap ProcessEnvironment() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

// Copies what the launcher detected into the flags it may fill.
void CopyDetected(const LaunchInfo& info, const LauncherTargets& t) {
  if (t.role != nullptr) *t.role = info.role;
  if (!info.node_id.empty()) FLAGS_node_id = info.node_id;
  if (info.scheduler_port > 0) FLAGS_scheduler_port = info.scheduler_port;
  if (t.server_num != nullptr && info.server_num >= 0) *t.server_num = info.server_num;
  if (t.worker_num != nullptr && info.worker_num >= 0) *t.worker_num = info.worker_num;
  if (t.job_id != nullptr && !info.job_id.empty()) *t.job_id = info.job_id;
  if (t.http_host != nullptr && !info.http_host.empty()) *t.http_host = info.http_host;
  if (!info.scheduler_host.empty()) FLAGS_scheduler_host = info.scheduler_host;
  if (!info.host.empty()) FLAGS_host = info.host;
}

}  // namespace

void ApplyLauncher(const std::string& prog, const LauncherTargets& targets) {
  Result<LauncherKind> kind = ParseLauncherKind(FLAGS_launcher);
  if (!kind.ok()) Die(prog, kind.status().message());
  const EnvMap env = ProcessEnvironment();
  const LauncherKind resolved = *kind == LauncherKind::kAuto ? ResolveAuto(env) : *kind;
  if (resolved == LauncherKind::kEnv) return;  // as without a launcher: nothing printed
  LaunchGiven given;
  given.role = targets.role == nullptr ? "worker" : *targets.role;
  given.node_id = Given("node_id");
  given.scheduler_host = Given("scheduler_host");
  given.scheduler_port = Given("scheduler_port");
  given.host = Given("host");
  given.counts = targets.counts_given;
  given.job_id = targets.job_id_given;
  given.http_host = targets.http_host_given;
  Result<LaunchInfo> info = DetectLaunch(resolved, env, given);
  const std::string what = std::string("--launcher=") + LauncherName(resolved) + ": ";
  if (!info.ok()) Die(prog, what + info.status().message());
  CopyDetected(*info, targets);
  // Names (a Slurm host, a Kubernetes Service, or a name given in a flag) become addresses:
  // the transport takes numeric ones.
  if (info->role != "scheduler") {
    Result<std::string> a = ResolveHost(FLAGS_scheduler_host);
    if (!a.ok()) Die(prog, what + "scheduler: " + a.status().message());
    FLAGS_scheduler_host = *a;
  }
  Result<std::string> self = ResolveHost(FLAGS_host);
  if (!self.ok()) Die(prog, what + "host: " + self.status().message());
  FLAGS_host = *self;
  std::cerr << prog << ": " << info->Describe() << "; "
            << (info->role == "scheduler" ? "listening on " + FLAGS_host + ":" + std::to_string(FLAGS_scheduler_port)
                                          : "scheduler " + FLAGS_scheduler_host + ":" + std::to_string(FLAGS_scheduler_port) +
                                                ", host " + FLAGS_host)
            << std::endl;
}

void CheckHeartbeats(const std::string& prog) {
  if (FLAGS_heartbeat_interval_ms <= 0) Die(prog, "--heartbeat_interval_ms must be > 0");
  if (FLAGS_heartbeat_timeout_ms <= FLAGS_heartbeat_interval_ms) {
    Die(prog, "--heartbeat_timeout_ms (" + std::to_string(FLAGS_heartbeat_timeout_ms) +
                  ") must be greater than --heartbeat_interval_ms (" + std::to_string(FLAGS_heartbeat_interval_ms) + ")");
  }
  if (FLAGS_connect_timeout_ms <= 0) Die(prog, "--connect_timeout_ms must be > 0");
}

void CheckTimeoutsAndRank(const std::string& prog) {
  CheckMs(prog, "scheduler_timeout_ms", FLAGS_scheduler_timeout_ms, 0);
  CheckMs(prog, "recovery_timeout_ms", FLAGS_recovery_timeout_ms, 1);
  CheckMs(prog, "join_timeout_ms", FLAGS_join_timeout_ms, 0);
  if (FLAGS_rank < -1) Die(prog, "--rank must be >= -1");
  if (FLAGS_poll_spin_us < 0 || FLAGS_poll_spin_us > 100000) Die(prog, "--poll_spin_us must be in [0, 100000]");
}

void CheckBufferPool(const std::string& prog) {
  if (FLAGS_buffer_pool_mb > (1ull << 20)) Die(prog, "--buffer_pool_mb must be <= 1048576");
}

void ApplyBufferPool() {
  if (Given("buffer_pool_mb")) Buffer::SetPoolLimit(static_cast<size_t>(FLAGS_buffer_pool_mb) << 20);
}

void FillMemberOptions(const std::string& prog, CommandLine* cl) {
  NodeOptions& n = cl->node;
  n.node_id = FLAGS_node_id;
  // With TLS the certificate names the node: no --node_id means that name.
  if (n.tls != nullptr && n.node_id.empty()) n.node_id = n.tls->identity();
  n.host = FLAGS_host;
  n.rank = FLAGS_rank;
  n.heartbeat_interval = std::chrono::milliseconds(FLAGS_heartbeat_interval_ms);
  n.heartbeat_timeout = std::chrono::milliseconds(FLAGS_heartbeat_timeout_ms);
  n.scheduler_timeout_ms = FLAGS_scheduler_timeout_ms;
  n.connect_timeout = std::chrono::milliseconds(FLAGS_connect_timeout_ms);
  n.join_timeout = std::chrono::milliseconds(FLAGS_join_timeout_ms);
  n.recovery_timeout = std::chrono::milliseconds(FLAGS_recovery_timeout_ms);
  n.poll_spin = std::chrono::microseconds(FLAGS_poll_spin_us);
  n.devices = ParseDevices(prog, FLAGS_devices);
}

}  // namespace pscore::node::flags
