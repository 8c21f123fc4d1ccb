#include "programs/flags.h"

#include <gflags/gflags.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <iostream>
#include <sstream>

#include "pscore/comm/tls.h"
#include "pscore/core/buffer.h"
#include "pscore/core/cluster_manager.h"
#include "programs/launcher.h"
#include "pscore/node/common/wire.h"

extern char** environ;

DEFINE_string(role, "", "Node role: scheduler, worker or server.");
DEFINE_string(launcher, "auto", "Where the job's layout comes from: env (flags and PSCORE_<FLAG> only), slurm, k8s, "
              "or auto (slurm when SLURM_JOB_ID and SLURM_PROCID are set, else k8s when KUBERNETES_SERVICE_HOST is "
              "set, else env). Detection fills only the flags not given (docs/deploy.md).");
DEFINE_string(scheduler_host, "127.0.0.1", "Scheduler address (numeric IP or localhost).");
DEFINE_int32(scheduler_port, 0, "Scheduler port. The scheduler binds it (0: a free port, see --port_file).");
DEFINE_int32(worker_num, 1, "Number of workers in the job (scheduler).");
DEFINE_int32(server_num, 1, "Number of servers in the job (scheduler).");
DEFINE_string(node_id, "", "Stable node id; a restarted process with the same id gets its rank back. Empty: random.");
DEFINE_int32(rank, -1, "Rank to ask for (-1: any free rank).");
DEFINE_string(host, "127.0.0.1", "Address this node binds and advertises.");
DEFINE_int32(port, 0, "Port a server binds (0: a free port).");
DEFINE_int32(heartbeat_interval_ms, 1000, "Heartbeat period.");
DEFINE_int32(heartbeat_timeout_ms, 5000, "A node silent this long is timed out (scheduler).");
DEFINE_int32(connect_timeout_ms, 30000, "How long a node keeps retrying to reach the scheduler before it gives up.");
DEFINE_int64(scheduler_timeout_ms, 0, "Worker/server: no answer from the scheduler for this long is logged and the "
             "link redialed (0: 2 x --heartbeat_timeout_ms).");
DEFINE_int64(recovery_timeout_ms, 15000, "Worker/server: how long a push or pull whose server was lost is retried, and "
             "how long the scheduler may stay silent (at least --scheduler_timeout_ms) before the node exits with code 4.");
DEFINE_int32(scale_timeout_ms, 60000, "Rollback deadline of a scale operation (scheduler).");
DEFINE_string(recoverable_roles, "",
              "Scheduler: roles (worker, server; comma-separated) whose members may restart with a new "
              "incarnation without being recorded in error and told to the others (empty: none).");
DEFINE_string(devices, "", "Local devices: comma-separated ordinals, each optionally id@device_ip (e.g. 0@10.0.0.1,1@10.0.0.2).");
DEFINE_string(super_pod_id, "", "Super-pod of this node's devices (rank table 1.2).");
DEFINE_uint64(max_message_bytes, 256ull << 20, "Largest frame payload accepted or sent.");
DEFINE_uint64(buffer_pool_mb, 256, "Released payload buffers of 128 KiB and more are kept for reuse up to this many "
              "MiB (0: none), so large transfers do not fault in fresh pages for every message.");
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
DEFINE_string(tls_cert, "", "PEM certificate of this process, signed by --tls_ca. With --tls_key and --tls_ca it turns "
              "on TLS 1.3 with mutual authentication on every link and on the HTTP port (HTTPS). Its subject CN "
              "names the process: a member's --node_id, 'scheduler' for the scheduler, 'admin' for operators.");
DEFINE_string(tls_key, "", "PEM private key of --tls_cert.");
DEFINE_string(tls_ca, "", "PEM certificate of the cluster CA: every peer must present a certificate it signed.");
DEFINE_string(tls_admin_cns, "admin", "Scheduler with TLS: comma-separated certificate CNs allowed to use admin "
              "commands (every other certificate gets only 'status').");
DEFINE_string(cluster_token_file, "", "File holding the cluster token (trailing whitespace ignored). Every process of the job "
              "must use the same token; connections and admin commands then prove it with an HMAC.");
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
// pscore-train (the demo job's worker) only.
DEFINE_int32(steps, 60, "pscore-train: synchronous SGD steps.");
DEFINE_int32(samples, 20000, "pscore-train: size of the synthetic data set (all workers).");
DEFINE_int32(dim, 64, "pscore-train: number of features.");
DEFINE_int32(keys, 8, "pscore-train: parameter keys the weights are split into.");
DEFINE_uint64(seed, 7, "pscore-train: seed of the synthetic data set.");
DEFINE_int32(scale_out_at, -1, "pscore-train: step at which rank 0 asks for one more server (-1: never).");
// pscore-admin only.
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

DECLARE_bool(help);

namespace pscore::node {
namespace {

// Which program takes which of the flags above. pscore-node and pscore-train take every
// flag but pscore-admin's own (train: also its six); pscore-admin takes its own plus the
// few that find and authenticate to the scheduler. --help lists only the program's flags
// and any other flag of this file is refused as unknown.
const std::set<std::string> kAdminOnly = {"workers", "servers",         "node_ids",    "json",
                                          "timeout_ms", "wait", "wait_timeout_ms", "reconnect_ms",
                                          "publisher"};
// --launcher belongs to pscore-node and pscore-train (kNode, kTrain): not in kAdminShared.
const std::set<std::string> kAdminShared = {"scheduler_host", "scheduler_port", "cluster_token_file", "job_id",
                                            "max_message_bytes", "tls_cert", "tls_key", "tls_ca"};
const std::set<std::string> kTrainOnly = {"steps", "samples", "dim", "keys", "seed", "scale_out_at"};

bool DefinedHere(const gflags::CommandLineFlagInfo& info) {
  return info.filename.find("programs/flags.cc") != std::string::npos;
}

// Whether `program` takes the flag `name` (a flag of programs/flags.cc).
bool Takes(Program program, const std::string& name) {
  switch (program) {
    case Program::kAdmin: return kAdminOnly.count(name) != 0 || kAdminShared.count(name) != 0;
    case Program::kTrain: return kAdminOnly.count(name) == 0;
    case Program::kNode: return kAdminOnly.count(name) == 0 && kTrainOnly.count(name) == 0;
  }
  return false;
}

// --help: the usage text, then the program's own flags (gflags' ShowUsage would list every
// flag linked in).
[[noreturn]] void ShowHelp(Program program, const char* usage) {
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  std::cout << usage << "\n\n  Flags:\n";
  for (const auto& f : all) {
    if (DefinedHere(f) && Takes(program, f.name)) std::cout << gflags::DescribeOneFlag(f);
  }
  std::cout << "\n(--helpfull also lists glog's logging flags)" << std::endl;
  std::exit(0);
}

AcceptLimits AcceptLimitsFromFlags() {
  AcceptLimits a;
  a.max_connections = static_cast<size_t>(FLAGS_max_connections);
  a.first_frame_timeout = std::chrono::milliseconds(FLAGS_first_frame_timeout_ms);
  a.partial_frame_timeout = std::chrono::milliseconds(FLAGS_partial_frame_timeout_ms);
  return a;
}

[[noreturn]] void Die(const std::string& prog, const std::string& msg) {
  std::cerr << prog << ": " << msg << std::endl;
  std::exit(2);
}

// PSCORE_<NAME> fills every flag not given on the command line.
void ApplyEnvironment(const std::string& prog, Program program) {
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  for (const auto& f : all) {
    if (!f.is_default || !DefinedHere(f) || !Takes(program, f.name)) continue;
    std::string env = "PSCORE_";
    for (char c : f.name) env += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    const char* v = std::getenv(env.c_str());
    if (v == nullptr) continue;
    if (gflags::SetCommandLineOption(f.name.c_str(), v).empty()) {
      Die(prog, "bad value '" + std::string(v) + "' in " + env + " for --" + f.name);
    }
  }
}

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

bool Given(const char* name) { return !gflags::GetCommandLineFlagInfoOrDie(name).is_default; }

// --launcher: fills the flags not given (on the command line or as PSCORE_<FLAG>) from what
// Slurm or Kubernetes exported, resolves host names to addresses, and prints one line saying
// what was detected. A variable needed and missing is exit 2 naming it.
void ApplyLauncher(const std::string& prog, Program program) {
  if (program == Program::kAdmin) return;  // pscore-admin is given the scheduler's address
  Result<LauncherKind> kind = ParseLauncherKind(FLAGS_launcher);
  if (!kind.ok()) Die(prog, kind.status().message());
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  const LauncherKind resolved = *kind == LauncherKind::kAuto ? ResolveAuto(env) : *kind;
  if (resolved == LauncherKind::kEnv) return;  // as without a launcher: nothing printed
  LaunchGiven given;
  given.role = program == Program::kTrain ? "worker" : FLAGS_role;  // pscore-train is a worker
  given.node_id = Given("node_id");
  given.scheduler_host = Given("scheduler_host");
  given.scheduler_port = Given("scheduler_port");
  given.host = Given("host");
  given.counts = Given("worker_num") || Given("server_num");
  given.job_id = Given("job_id");
  given.http_host = Given("http_host");
  Result<LaunchInfo> info = DetectLaunch(resolved, env, given);
  if (!info.ok()) Die(prog, std::string("--launcher=") + LauncherName(resolved) + ": " + info.status().message());
  if (program != Program::kTrain) FLAGS_role = info->role;
  if (!info->node_id.empty()) FLAGS_node_id = info->node_id;
  if (info->scheduler_port > 0) FLAGS_scheduler_port = info->scheduler_port;
  if (info->server_num >= 0) FLAGS_server_num = info->server_num;
  if (info->worker_num >= 0) FLAGS_worker_num = info->worker_num;
  if (!info->job_id.empty()) FLAGS_job_id = info->job_id;
  if (!info->http_host.empty()) FLAGS_http_host = info->http_host;
  if (!info->scheduler_host.empty()) FLAGS_scheduler_host = info->scheduler_host;
  if (!info->host.empty()) FLAGS_host = info->host;
  // Names (a Slurm host, a Kubernetes Service, or a name given in a flag) become addresses:
  // the transport takes numeric ones.
  const std::string what = std::string("--launcher=") + LauncherName(resolved) + ": ";
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

}  // namespace

CommandLine ParseFlags(int* argc, char*** argv, const char* usage, Program program) {
  std::string prog = (*argc > 0) ? (*argv)[0] : "pscore";
  size_t slash = prog.rfind('/');
  if (slash != std::string::npos) prog = prog.substr(slash + 1);
  gflags::SetUsageMessage(usage);
  gflags::SetVersionString("0.1.0");
  // gflags would exit 1 on an unknown flag or a value of the wrong type; bad flags exit 2
  // here, with one line. A value is tried on the flag itself (gflags sets it again below).
  for (int i = 1; i < *argc; ++i) {
    std::string a = (*argv)[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-') continue;
    std::string name = a.substr(a.find_first_not_of('-'));
    const size_t eq = name.find('=');
    std::optional<std::string> value;
    if (eq != std::string::npos) value = name.substr(eq + 1);
    name = name.substr(0, eq);
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      if (name.rfind("no", 0) == 0 && gflags::GetCommandLineFlagInfo(name.substr(2).c_str(), &info) &&
          info.type == "bool" && !value && (!DefinedHere(info) || Takes(program, info.name))) {
        continue;
      }
      Die(prog, "unknown flag " + a + " (see --help)");
    }
    if (DefinedHere(info) && !Takes(program, info.name)) Die(prog, "unknown flag " + a + " (see --help)");
    if (!value && info.type != "bool" && i + 1 < *argc) value = (*argv)[++i];  // --name value (e.g. --rank -1)
    if (value && gflags::SetCommandLineOption(name.c_str(), value->c_str()).empty()) {
      Die(prog, "bad value '" + *value + "' for --" + name + " (" + info.type + ")");
    }
  }
  gflags::ParseCommandLineNonHelpFlags(argc, argv, true);
  if (FLAGS_help) ShowHelp(program, usage);  // gflags would list every library's flags and exit 1
  gflags::HandleCommandLineHelpFlags();  // --helpfull, --version, ...
  ApplyEnvironment(prog, program);

  ApplyLauncher(prog, program);

  auto check_port = [&](const char* name, int v) {
    if (v < 0 || v > 65535) Die(prog, std::string("--") + name + " must be in [0, 65535] (got " + std::to_string(v) + ")");
  };
  check_port("scheduler_port", FLAGS_scheduler_port);
  check_port("port", FLAGS_port);
  if (FLAGS_http_port < -1 || FLAGS_http_port > 65535) Die(prog, "--http_port must be -1 or in [0, 65535]");
  if (FLAGS_worker_num < 0 || FLAGS_server_num < 0 || FLAGS_worker_num > pscore::core::kMaxRoleTotal ||
      FLAGS_server_num > pscore::core::kMaxRoleTotal) {
    Die(prog, "--worker_num and --server_num must be in [0, " + std::to_string(pscore::core::kMaxRoleTotal) + "]");
  }
  if (FLAGS_worker_num + FLAGS_server_num == 0) Die(prog, "the job needs at least one worker or server");
  if (FLAGS_replicas < 1 || (FLAGS_role == "scheduler" && FLAGS_replicas > std::max(1, FLAGS_server_num))) {
    Die(prog, "--replicas must be in [1, --server_num] (got " + std::to_string(FLAGS_replicas) + " with " +
                  std::to_string(FLAGS_server_num) + " servers)");
  }
  if (FLAGS_heartbeat_interval_ms <= 0) Die(prog, "--heartbeat_interval_ms must be > 0");
  if (FLAGS_heartbeat_timeout_ms <= FLAGS_heartbeat_interval_ms) {
    Die(prog, "--heartbeat_timeout_ms (" + std::to_string(FLAGS_heartbeat_timeout_ms) +
                  ") must be greater than --heartbeat_interval_ms (" + std::to_string(FLAGS_heartbeat_interval_ms) + ")");
  }
  if (FLAGS_connect_timeout_ms <= 0) Die(prog, "--connect_timeout_ms must be > 0");
  if (FLAGS_scale_timeout_ms <= 0) Die(prog, "--scale_timeout_ms must be > 0");
  // Each is a thread of the server's executor.
  if (FLAGS_handler_threads < 0 || FLAGS_handler_threads > 1024) Die(prog, "--handler_threads must be in [0, 1024]");
  // The int64 durations become steady-clock deadlines (now + ms): more than 2^42 ms
  // (about 139 years) would overflow them.
  auto check_ms = [&](const char* name, int64_t v, int64_t min) {
    if (v < min || v > kMaxTimeoutMs) {
      Die(prog, std::string("--") + name + " must be in [" + std::to_string(min) + ", " + std::to_string(kMaxTimeoutMs) +
                    "] (got " + std::to_string(v) + ")");
    }
  };
  check_ms("finish_timeout_ms", FLAGS_finish_timeout_ms, 1);
  check_ms("scheduler_timeout_ms", FLAGS_scheduler_timeout_ms, 0);
  check_ms("recovery_timeout_ms", FLAGS_recovery_timeout_ms, 1);
  if (FLAGS_rank < -1) Die(prog, "--rank must be >= -1");
  if (FLAGS_max_message_bytes < 1024) Die(prog, "--max_message_bytes must be >= 1024");
  if (FLAGS_buffer_pool_mb > (1ull << 20)) Die(prog, "--buffer_pool_mb must be <= 1048576");
  if (FLAGS_stream_spare_mb > (1ull << 20)) Die(prog, "--stream_spare_mb must be <= 1048576");
  if (FLAGS_max_kv_value_bytes < 1 || FLAGS_max_kv_value_bytes > FLAGS_max_message_bytes) {
    Die(prog, "--max_kv_value_bytes must be in [1, --max_message_bytes]");
  }
  if (FLAGS_max_kv_total_mb > (1ull << 30)) Die(prog, "--max_kv_total_mb must be <= 1073741824");
  if (FLAGS_journal_compact_mb < 1 || FLAGS_journal_compact_mb > (1ull << 20)) {
    Die(prog, "--journal_compact_mb must be in [1, 1048576]");
  }
  // Process-wide. Left alone unless given, so an AddressSanitizer build keeps its default (off).
  if (!gflags::GetCommandLineFlagInfoOrDie("buffer_pool_mb").is_default) {
    Buffer::SetPoolLimit(static_cast<size_t>(FLAGS_buffer_pool_mb) << 20);
  }
  if (FLAGS_max_connections < 0) Die(prog, "--max_connections must be >= 0");
  if (FLAGS_first_frame_timeout_ms < 0) Die(prog, "--first_frame_timeout_ms must be >= 0");
  if (FLAGS_partial_frame_timeout_ms < 0) Die(prog, "--partial_frame_timeout_ms must be >= 0");
  if (FLAGS_update_rule != "assign" && FLAGS_update_rule != "sum" && FLAGS_update_rule != "sgd") {
    Die(prog, "--update_rule must be assign, sum or sgd (got '" + FLAGS_update_rule + "')");
  }

  // A member with no scheduler port would dial port 0 until --connect_timeout_ms.
  if ((FLAGS_role == "worker" || FLAGS_role == "server") && FLAGS_scheduler_port == 0) {
    Die(prog, "--scheduler_port is required with --role=" + FLAGS_role + " (the scheduler's port, 1-65535)");
  }

  CommandLine cl;
  cl.role = FLAGS_role;
  std::string token;
  if (!FLAGS_cluster_token_file.empty()) {
    std::ifstream in(FLAGS_cluster_token_file, std::ios::binary);
    if (!in) Die(prog, "--cluster_token_file: cannot read " + FLAGS_cluster_token_file);
    token.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
    if (token.empty()) Die(prog, "--cluster_token_file: " + FLAGS_cluster_token_file + " is empty");
  }
  cl.cluster_token = token;
  cl.scheduler.cluster_token = token;
  cl.node.cluster_token = token;
  const comm::TlsFiles tls_files{FLAGS_tls_cert, FLAGS_tls_key, FLAGS_tls_ca};
  if (tls_files.enabled()) {
    Result<std::shared_ptr<comm::TlsContext>> tls = comm::TlsContext::Load(tls_files);
    if (!tls.ok()) Die(prog, tls.status().message());
    cl.scheduler.tls = *tls;
    cl.node.tls = *tls;
  }
  SchedulerOptions& s = cl.scheduler;
  s.host = FLAGS_host;
  s.port = FLAGS_scheduler_port;
  s.worker_num = FLAGS_worker_num;
  s.server_num = FLAGS_server_num;
  s.heartbeat_interval = std::chrono::milliseconds(FLAGS_heartbeat_interval_ms);
  s.heartbeat_timeout = std::chrono::milliseconds(FLAGS_heartbeat_timeout_ms);
  s.scale_timeout = std::chrono::milliseconds(FLAGS_scale_timeout_ms);
  {
    std::stringstream cns(FLAGS_tls_admin_cns);
    s.tls_admin_cns.clear();
    for (std::string cn; std::getline(cns, cn, ',');) {
      if (!cn.empty()) s.tls_admin_cns.push_back(cn);
    }
  }
  {
    std::string list = FLAGS_recoverable_roles;
    size_t start = 0;
    while (start <= list.size() && !list.empty()) {
      size_t comma = list.find(',', start);
      if (comma == std::string::npos) comma = list.size();
      const std::string role = list.substr(start, comma - start);
      if (role == "worker") {
        s.recoverable_roles.push_back(pb::WORKER);
      } else if (role == "server") {
        s.recoverable_roles.push_back(pb::SERVER);
      } else {
        Die(prog, "--recoverable_roles: unknown role '" + role + "' (worker, server)");
      }
      start = comma + 1;
    }
  }
  s.max_message_bytes = FLAGS_max_message_bytes;
  s.max_kv_value_bytes = static_cast<size_t>(FLAGS_max_kv_value_bytes);
  s.max_kv_total_bytes = FLAGS_max_kv_total_mb << 20;
  s.job_id = FLAGS_job_id;
  s.http_host = FLAGS_http_host;
  s.http_port = FLAGS_http_port;
  s.state_dir = FLAGS_state_dir;
  s.state_reset_on_corrupt = FLAGS_state_reset_on_corrupt;
  s.accept = AcceptLimitsFromFlags();
  s.replicas = FLAGS_replicas;
  NodeOptions& n = cl.node;
  n.node_id = FLAGS_node_id;
  // With TLS the certificate names the node: no --node_id means that name.
  if (n.tls != nullptr && n.node_id.empty()) n.node_id = n.tls->identity();
  n.scheduler_host = FLAGS_scheduler_host;
  n.scheduler_port = FLAGS_scheduler_port;
  n.host = FLAGS_host;
  n.port = FLAGS_port;
  n.rank = FLAGS_rank;
  n.heartbeat_interval = std::chrono::milliseconds(FLAGS_heartbeat_interval_ms);
  n.heartbeat_timeout = std::chrono::milliseconds(FLAGS_heartbeat_timeout_ms);
  n.scheduler_timeout_ms = FLAGS_scheduler_timeout_ms;
  n.connect_timeout = std::chrono::milliseconds(FLAGS_connect_timeout_ms);
  n.recovery_timeout = std::chrono::milliseconds(FLAGS_recovery_timeout_ms);
  n.devices = ParseDevices(prog, FLAGS_devices);
  n.max_message_bytes = FLAGS_max_message_bytes;
  n.handler_threads = FLAGS_handler_threads;
  n.data_dir = FLAGS_data_dir;
  n.journal_compact_bytes = FLAGS_journal_compact_mb << 20;
  n.accept = AcceptLimitsFromFlags();
  cl.auto_finish = FLAGS_auto_finish;
  cl.finish_timeout_ms = FLAGS_finish_timeout_ms;
  cl.port_file = FLAGS_port_file;
  cl.http_port_file = FLAGS_http_port_file;
  cl.update_rule = FLAGS_update_rule;
  cl.learning_rate = static_cast<float>(FLAGS_learning_rate);
  cl.stream_spare_bytes = FLAGS_stream_spare_mb << 20;
  if (FLAGS_steps < 0 || FLAGS_samples < 1 || FLAGS_dim < 1 || FLAGS_keys < 1 || FLAGS_keys > FLAGS_dim) {
    Die(prog, "--steps >= 0, --samples >= 1 and 1 <= --keys <= --dim are required");
  }
  cl.train.steps = FLAGS_steps;
  cl.train.samples = FLAGS_samples;
  cl.train.dim = FLAGS_dim;
  cl.train.keys = FLAGS_keys;
  cl.train.seed = FLAGS_seed;
  cl.train.scale_out_at = FLAGS_scale_out_at;
  if (FLAGS_workers < -1 || FLAGS_servers < -1) Die(prog, "--workers and --servers must be >= 0");
  check_ms("timeout_ms", FLAGS_timeout_ms, 1);
  check_ms("wait_timeout_ms", FLAGS_wait_timeout_ms, 1);
  check_ms("reconnect_ms", FLAGS_reconnect_ms, 0);
  cl.admin.workers = FLAGS_workers;
  cl.admin.servers = FLAGS_servers;
  {
    std::stringstream ids(FLAGS_node_ids);
    std::string id;
    while (std::getline(ids, id, ',')) {
      if (!id.empty()) cl.admin.node_ids.push_back(id);
    }
  }
  cl.admin.json = FLAGS_json;
  cl.admin.timeout_ms = FLAGS_timeout_ms;
  cl.admin.wait = FLAGS_wait;
  cl.admin.wait_timeout_ms = FLAGS_wait_timeout_ms;
  cl.admin.reconnect_ms = FLAGS_reconnect_ms;
  cl.admin.publisher = FLAGS_publisher;
  return cl;
}

}  // namespace pscore::node
