#include "programs/launcher.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cctype>
#include <cstdlib>
#include <vector>

#include "pscore/core/role_names.h"

namespace pscore::node {
namespace {

Status Missing(const std::string& what, const std::string& why) {
  return Status(Code::kInvalidArgument, what + " is not set (" + why + ")");
}

const std::string* Get(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return nullptr;
  return &it->second;
}

// A non-negative decimal integer of at most 18 digits.
bool ParseCount(const std::string& s, long long* out) {
  if (s.empty() || s.size() > 18) return false;
  long long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

Result<long long> GetCount(const EnvMap& env, const std::string& name, const std::string& why) {
  const std::string* v = Get(env, name);
  if (v == nullptr) return Missing(name, why);
  long long n = 0;
  if (!ParseCount(*v, &n)) return Status(Code::kInvalidArgument, name + "='" + *v + "' is not a non-negative integer");
  return n;
}

bool ValidRole(const std::string& r) { return core::ParseRoleLabel(r).has_value(); }

// Expands one host-list element that may hold bracket groups ("rack[1-2]-n[01,05]").
Status ExpandOne(const std::string& item, std::vector<std::string>* out) {
  const size_t open = item.find('[');
  if (open == std::string::npos) {
    if (item.find(']') != std::string::npos) return Status(Code::kInvalidArgument, "unbalanced ']' in '" + item + "'");
    out->push_back(item);
    return Status::Ok();
  }
  const size_t close = item.find(']', open);
  if (close == std::string::npos) return Status(Code::kInvalidArgument, "unbalanced '[' in '" + item + "'");
  const std::string prefix = item.substr(0, open);
  const std::string body = item.substr(open + 1, close - open - 1);
  const std::string rest = item.substr(close + 1);
  if (body.empty()) return Status(Code::kInvalidArgument, "empty '[]' in '" + item + "'");
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string::npos) comma = body.size();
    const std::string range = body.substr(start, comma - start);
    const size_t dash = range.find('-');
    const std::string lo_s = range.substr(0, dash);
    const std::string hi_s = dash == std::string::npos ? lo_s : range.substr(dash + 1);
    long long lo = 0, hi = 0;
    if (!ParseCount(lo_s, &lo) || !ParseCount(hi_s, &hi) || hi < lo || hi - lo > 100000) {
      return Status(Code::kInvalidArgument, "bad range '" + range + "' in '" + item + "'");
    }
    const size_t width = lo_s.size();  // "01-03": zero padded to the width of the first bound
    for (long long v = lo; v <= hi; ++v) {
      std::string num = std::to_string(v);
      if (num.size() < width) num.insert(0, width - num.size(), '0');
      Status st = ExpandOne(prefix + num + rest, out);
      if (!st.ok()) return st;
    }
    start = comma + 1;
  }
  return Status::Ok();
}

Result<LaunchInfo> DetectSlurm(const EnvMap& env, const LaunchGiven& given) {
  LaunchInfo info;
  info.kind = LauncherKind::kSlurm;
  // A heterogeneous job's components each have a job id; the leader's (SLURM_HET_JOB_ID)
  // is common to all of them and names the job.
  std::string het_var = "SLURM_HET_JOB_ID";
  if (Get(env, het_var) == nullptr) het_var = "SLURM_PACK_JOB_ID";  // before Slurm 20.02
  std::string offset_var = "SLURM_HET_JOB_OFFSET";
  if (Get(env, offset_var) == nullptr) offset_var = "SLURM_PACK_JOB_OFFSET";
  const std::string* offset = Get(env, offset_var);
  const bool het = Get(env, het_var) != nullptr && offset != nullptr;
  Result<long long> job = GetCount(env, het ? het_var : "SLURM_JOB_ID", "the job id");
  if (!job.ok()) return job.status();
  Result<long long> procid = GetCount(env, "SLURM_PROCID", "the task's rank in its step; run under srun");
  if (!procid.ok()) return procid.status();
  info.task_index = static_cast<int>(*procid);

  if (!given.role.empty()) {
    info.role = given.role;
  } else if (het) {
    long long component = 0;
    if (!ParseCount(*offset, &component) || component > 2) {
      return Status(Code::kInvalidArgument, offset_var + "='" + *offset +
                                                "': a pscore heterogeneous job has 3 components (0 scheduler, 1 "
                                                "servers, 2 workers)");
    }
    static const char* kRoles[] = {"scheduler", "server", "worker"};
    info.role = kRoles[component];
  } else {
    return Missing("SLURM_HET_JOB_OFFSET",
                   "no role: give --role (or PSCORE_ROLE) to each srun step, or run a heterogeneous job");
  }
  if (!ValidRole(info.role)) {
    return Status(Code::kInvalidArgument, "role must be scheduler, server or worker (got '" + info.role + "')");
  }
  if (het && !given.counts) {
    // The servers' and workers' components; a count not exported stays the flag's.
    if (const std::string* s = Get(env, "SLURM_NTASKS_HET_GROUP_1")) {
      long long n = 0;
      if (!ParseCount(*s, &n)) return Status(Code::kInvalidArgument, "SLURM_NTASKS_HET_GROUP_1='" + *s + "' is bad");
      info.server_num = static_cast<int>(n);
    }
    if (const std::string* w = Get(env, "SLURM_NTASKS_HET_GROUP_2")) {
      long long n = 0;
      if (!ParseCount(*w, &n)) return Status(Code::kInvalidArgument, "SLURM_NTASKS_HET_GROUP_2='" + *w + "' is bad");
      info.worker_num = static_cast<int>(n);
    }
  }
  const std::string job_str = std::to_string(*job);
  if (!given.job_id) info.job_id = "slurm-" + job_str;
  if (!given.node_id && info.role != "scheduler") {
    // Unique across allocations (a scale-out's second job has task 0 too), the same for a
    // requeued step of this job (the restarted task gets its rank back).
    info.node_id = info.role + "-" + job_str + "-" + std::to_string(info.task_index);
  }
  if (!given.scheduler_host) {
    const std::string var = het && Get(env, "SLURM_JOB_NODELIST_HET_GROUP_0") != nullptr
                                ? "SLURM_JOB_NODELIST_HET_GROUP_0"
                                : "SLURM_JOB_NODELIST";
    const std::string* list = Get(env, var);
    if (list == nullptr) return Missing(var, "the job's hosts; the first runs the scheduler");
    Result<std::vector<std::string>> hosts = ExpandSlurmHostList(*list);
    if (!hosts.ok()) return Status(Code::kInvalidArgument, var + ": " + hosts.status().message());
    if (hosts->empty()) return Status(Code::kInvalidArgument, var + " lists no host");
    info.scheduler_host = hosts->front();
  }
  if (!given.scheduler_port) info.scheduler_port = SlurmDefaultPort(static_cast<unsigned long long>(*job));
  if (!given.host) {
    const std::string* self = Get(env, "SLURMD_NODENAME");
    if (self == nullptr) return Missing("SLURMD_NODENAME", "this task's host, bound and advertised");
    info.host = *self;
  }
  return info;
}

// The StatefulSet ordinal: the digits after the pod name's last '-'; -1 if none.
int Ordinal(const std::string& pod) {
  const size_t dash = pod.rfind('-');
  if (dash == std::string::npos || dash + 1 == pod.size()) return -1;
  long long v = 0;
  if (!ParseCount(pod.substr(dash + 1), &v) || v > 1000000) return -1;
  return static_cast<int>(v);
}

Result<LaunchInfo> DetectK8s(const EnvMap& env, const LaunchGiven& given) {
  LaunchInfo info;
  info.kind = LauncherKind::kK8s;
  const std::string* pod = Get(env, "POD_NAME");
  if (pod == nullptr) pod = Get(env, "HOSTNAME");
  if (pod == nullptr) return Missing("POD_NAME", "the downward API's metadata.name; HOSTNAME is not set either");
  if (!given.role.empty()) {
    info.role = given.role;
  } else {
    const std::string* role = Get(env, "POD_ROLE");
    if (role == nullptr) return Missing("POD_ROLE", "the pod's role, from its pscore/role label; or give --role");
    info.role = *role;
  }
  if (!ValidRole(info.role)) {
    return Status(Code::kInvalidArgument, "role must be scheduler, server or worker (got '" + info.role + "')");
  }
  // An Indexed Job's pods are named <job>-<index>-<random>; a StatefulSet's <set>-<ordinal>.
  std::string index_node_id;
  if (const std::string* index = Get(env, "JOB_COMPLETION_INDEX")) {
    long long v = 0;
    if (!ParseCount(*index, &v) || v > 1000000) {
      return Status(Code::kInvalidArgument, "JOB_COMPLETION_INDEX='" + *index + "' is not an index");
    }
    info.task_index = static_cast<int>(v);
    index_node_id = info.role + "-" + *index;  // a retried pod of the index keeps its id
  } else {
    info.task_index = Ordinal(*pod);
  }
  if (!given.node_id && info.role != "scheduler") info.node_id = index_node_id.empty() ? *pod : index_node_id;
  if (!given.scheduler_host) {
    const std::string* svc = Get(env, "PSCORE_SCHEDULER_SERVICE");
    info.scheduler_host = svc != nullptr ? *svc : "pscore-scheduler";
  }
  if (!given.scheduler_port) info.scheduler_port = kK8sSchedulerPort;
  if (!given.host) {
    const std::string* ip = Get(env, "POD_IP");
    if (info.role == "scheduler") {
      info.host = "0.0.0.0";  // reached through its Service, and by pscore-admin on 127.0.0.1 in the pod
    } else if (ip != nullptr) {
      info.host = *ip;
    } else {
      return Missing("POD_IP", "the downward API's status.podIP, which a " + info.role + " advertises");
    }
  }
  if (!given.http_host) info.http_host = "0.0.0.0";  // the kubelet probes the pod's address
  return info;
}

}  // namespace

Result<LauncherKind> ParseLauncherKind(const std::string& name) {
  if (name == "auto") return LauncherKind::kAuto;
  if (name == "env") return LauncherKind::kEnv;
  if (name == "slurm") return LauncherKind::kSlurm;
  if (name == "k8s") return LauncherKind::kK8s;
  return Status(Code::kInvalidArgument, "--launcher must be auto, env, slurm or k8s (got '" + name + "')");
}

const char* LauncherName(LauncherKind kind) {
  switch (kind) {
    case LauncherKind::kAuto: return "auto";
    case LauncherKind::kEnv: return "env";
    case LauncherKind::kSlurm: return "slurm";
    case LauncherKind::kK8s: return "k8s";
  }
  return "?";
}

LauncherKind ResolveAuto(const EnvMap& env) {
  if (Get(env, "SLURM_JOB_ID") != nullptr && Get(env, "SLURM_PROCID") != nullptr) return LauncherKind::kSlurm;
  if (Get(env, "KUBERNETES_SERVICE_HOST") != nullptr) return LauncherKind::kK8s;
  return LauncherKind::kEnv;
}

int SlurmDefaultPort(unsigned long long job_id) { return kSlurmPortBase + static_cast<int>(job_id % 20000); }

Result<LaunchInfo> DetectLaunch(LauncherKind kind, const EnvMap& env, const LaunchGiven& given) {
  if (kind == LauncherKind::kAuto) kind = ResolveAuto(env);
  switch (kind) {
    case LauncherKind::kSlurm: return DetectSlurm(env, given);
    case LauncherKind::kK8s: return DetectK8s(env, given);
    default: break;
  }
  LaunchInfo info;
  info.kind = LauncherKind::kEnv;
  return info;
}

std::string LaunchInfo::Describe() const {
  std::string s = std::string("launcher ") + LauncherName(kind);
  if (kind == LauncherKind::kEnv) return s + ": flags and PSCORE_<FLAG> variables only";
  auto add = [&s](const std::string& k, const std::string& v) {
    if (!v.empty()) s += " " + k + "=" + v;
  };
  s += ":";
  add("role", role);
  if (task_index >= 0) add("task", std::to_string(task_index));
  add("node_id", node_id);
  add("scheduler_host", scheduler_host);
  if (scheduler_port > 0) add("scheduler_port", std::to_string(scheduler_port));
  if (server_num >= 0) add("server_num", std::to_string(server_num));
  if (worker_num >= 0) add("worker_num", std::to_string(worker_num));
  add("job_id", job_id);
  add("host", host);
  add("http_host", http_host);
  return s + " (flags given explicitly win)";
}

Result<std::vector<std::string>> ExpandSlurmHostList(const std::string& list) {
  std::vector<std::string> out;
  std::string item;
  int depth = 0;
  auto flush = [&]() -> Status {
    if (item.empty()) return Status::Ok();
    Status st = ExpandOne(item, &out);
    item.clear();
    return st;
  };
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) return Status(Code::kInvalidArgument, "unbalanced ']' in '" + list + "'");
    if (c == ',' && depth == 0) {
      Status st = flush();
      if (!st.ok()) return st;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    item += c;
  }
  if (depth != 0) return Status(Code::kInvalidArgument, "unbalanced '[' in '" + list + "'");
  Status st = flush();
  if (!st.ok()) return st;
  return out;
}

Result<std::string> ResolveHost(const std::string& host) {
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status(Code::kNotFound, "cannot resolve host '" + host + "': " + ::gai_strerror(rc));
  }
  char buf[INET_ADDRSTRLEN] = {};
  const auto* sin = reinterpret_cast<const sockaddr_in*>(res->ai_addr);
  ::inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
  ::freeaddrinfo(res);
  return std::string(buf);
}

}  // namespace pscore::node
