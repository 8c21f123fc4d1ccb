// Launcher detection: what a cluster engine (Slurm, Kubernetes) tells a process about its
// place in a job, read from an environment given as a map. Pure: no process environment,
// no DNS (ResolveHost, separate, does that). programs/flags.cc feeds it the process environment
// for --launcher; an embedding program may call it and copy the result into NodeOptions.
//
// What each launcher reads (docs/deploy.md has the full table):
//   slurm: SLURM_PROCID, SLURM_JOB_ID (SLURM_HET_JOB_ID in a heterogeneous job),
//          SLURM_JOB_NODELIST (its first host runs the scheduler), SLURMD_NODENAME (this
//          task's host), SLURM_NTASKS; in a heterogeneous job SLURM_HET_JOB_OFFSET (or
//          SLURM_PACK_JOB_OFFSET) picks the role (0 scheduler, 1 servers, 2 workers) and
//          SLURM_NTASKS_HET_GROUP_1/_2 give the server and worker counts.
//   k8s:   POD_NAME (or HOSTNAME), POD_IP, POD_ROLE, JOB_COMPLETION_INDEX (Indexed Jobs),
//          PSCORE_SCHEDULER_SERVICE (default pscore-scheduler) and the Service's
//          <NAME>_SERVICE_HOST / <NAME>_SERVICE_PORT_NATIVE variables.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "pscore/core/status.h"

namespace pscore::node {

using EnvMap = std::map<std::string, std::string>;

enum class LauncherKind { kAuto, kEnv, kSlurm, kK8s };

// "auto", "env", "slurm" or "k8s"; anything else is kInvalidArgument.
Result<LauncherKind> ParseLauncherKind(const std::string& name);
const char* LauncherName(LauncherKind kind);

// kAuto's rule: slurm when SLURM_JOB_ID and SLURM_PROCID are both set, else k8s when
// KUBERNETES_SERVICE_HOST is set, else env (flags and PSCORE_<FLAG> variables only).
LauncherKind ResolveAuto(const EnvMap& env);

// The values already given by flags (or PSCORE_<FLAG>): detection fills only the others,
// and does not ask for a variable it would only need for a value already given.
struct LaunchGiven {
  std::string role;  // empty: not given
  bool node_id = false;
  bool scheduler_host = false;
  bool scheduler_port = false;
  bool host = false;
  bool counts = false;  // --worker_num or --server_num
  bool job_id = false;
  bool http_host = false;
};

// What a launcher tells. Empty strings and -1 are "not detected" (the flag's value stays).
struct LaunchInfo {
  LauncherKind kind = LauncherKind::kEnv;
  std::string role;            // scheduler, server or worker
  int task_index = -1;         // this task's index within its role (Slurm step rank, pod ordinal)
  std::string node_id;
  std::string scheduler_host;  // a host name or an address (ResolveHost turns it into an address)
  int scheduler_port = 0;      // 0: not detected
  int worker_num = -1;
  int server_num = -1;
  std::string job_id;
  std::string host;            // this process's own host name or address
  std::string http_host;       // k8s: 0.0.0.0 so the kubelet's probes reach it

  // One line naming the launcher and every detected value.
  std::string Describe() const;
};

// Default scheduler ports: Slurm derives one from the job id so that every step of a job
// agrees without talking (20000 + job id mod 20000); Kubernetes uses the Service's port.
inline constexpr int kSlurmPortBase = 20000;
inline constexpr int kK8sSchedulerPort = 7000;
int SlurmDefaultPort(unsigned long long job_id);

// Detects for `kind` (kAuto resolved first). A variable needed and missing, or malformed,
// is kInvalidArgument whose message names it.
Result<LaunchInfo> DetectLaunch(LauncherKind kind, const EnvMap& env, const LaunchGiven& given);

// Slurm's compressed host list ("node[01-03,07],gpu5") expanded in order, zero padding kept.
Result<std::vector<std::string>> ExpandSlurmHostList(const std::string& list);

// A numeric IPv4 address stays; a name is resolved (getaddrinfo, IPv4) to its first address.
// Blocking: call at start, never on a loop thread.
Result<std::string> ResolveHost(const std::string& host);

}  // namespace pscore::node
