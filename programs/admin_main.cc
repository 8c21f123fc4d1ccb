// pscore-admin: the operator's command line for a running job (see docs/admin.md).
// Exit codes: 0 done; 1 the scheduler refused or the operation failed (reason on stderr);
// 2 bad usage or flags; 3 the scheduler is unreachable.
#include <condition_variable>
#include <csignal>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>

#include <gflags/gflags.h>
#include <nlohmann/json.hpp>

#include "pscore/core/cluster_manager.h"
#include "pscore/core/role_names.h"
#include "pscore/node/common/admin_client.h"
#include "pscore/node/common/admin_ops.h"
#include "pscore/node/common/ranktable_subscriber.h"
#include "pscore/node/common/wire.h"
#include "programs/flags.h"

namespace {

using namespace pscore;
using Json = nlohmann::json;

constexpr int kOk = 0;
constexpr int kRefused = 1;
constexpr int kUsage = 2;
constexpr int kUnreachable = 3;

constexpr const char* kUsageText =
    "Operates a running pscore job through its scheduler.\n"
    "  pscore-admin [flags] COMMAND [ARGS]\n"
    "Commands:\n"
    "  status                          cluster state, membership version, node counts\n"
    "  nodes [--json]                  node id, role, rank, address, state, heartbeat age\n"
    "  scale-out --workers=N --servers=M   grow to these totals (--wait: until READY)\n"
    "  scale-in --node_ids=a,b | --workers=N --servers=M   remove nodes (highest ranks)\n"
    "  new-instance | disable | enable | stop\n"
    "  reset ID... | --node_ids=a,b    clear members' error state so they may register again\n"
    "  kv get KEY | kv set KEY VALUE | kv ls DIR | kv rm KEY\n"
    "  barriers                        barrier rounds kept by the scheduler\n"
    "  watch-ranktable [--job_id=ID] [--reconnect_ms=MS] [--publisher]   print every rank table the scheduler\n"
    "                                  publishes (--publisher: as the job's registered publisher)\n"
    "Scheduler: --scheduler_host/--scheduler_port (or PSCORE_SCHEDULER_HOST/PORT).\n"
    "Exit codes: 0 done, 1 refused or failed, 2 bad usage, 3 scheduler unreachable.";

int Fail(int code, const std::string& reason) {
  std::cerr << "pscore-admin: " << reason << std::endl;
  return code;
}

int FailStatus(const Status& st) {
  return Fail(st.code() == Code::kUnavailable ? kUnreachable : kRefused, st.ToString());
}

std::string StateName(pb::ClusterState s) { return core::ClusterStateName(s); }

std::string Summary(const pb::AdminResponse& r) {
  std::ostringstream os;
  os << "cluster " << StateName(r.cluster_state()) << ", membership version " << r.epoch() << ", workers "
     << r.registered_workers() << "/" << r.worker_num() << ", servers " << r.registered_servers() << "/"
     << r.server_num();
  return os.str();
}

// KV values and ids are bytes, not necessarily UTF-8: invalid sequences print as U+FFFD
// (nlohmann's default throws, which aborted the command).
std::string Dump(const Json& j, int indent = 2) { return j.dump(indent, ' ', false, Json::error_handler_t::replace); }

Json StatusJson(const pb::AdminResponse& r) {
  return Json{{"cluster_state", StateName(r.cluster_state())},
              {"epoch", r.epoch()},
              {"worker_num", r.worker_num()},
              {"server_num", r.server_num()},
              {"registered_workers", r.registered_workers()},
              {"registered_servers", r.registered_servers()},
              {"last_scale_result", r.last_scale_result()},
              {"job_result", r.job_result()},
              {"job_failure", r.job_failure()},
              {"failed_nodes", Json(std::vector<std::string>(r.failed_nodes().begin(), r.failed_nodes().end()))}};
}

int PrintStatus(const pb::AdminResponse& r, bool json) {
  if (json) {
    std::cout << Dump(StatusJson(r)) << std::endl;
    return kOk;
  }
  std::cout << Summary(r) << std::endl;
  if (!r.last_scale_result().empty()) std::cout << "last scale operation: " << r.last_scale_result() << std::endl;
  if (!r.job_result().empty()) {
    std::cout << "job: " << r.job_result() << (r.job_failure().empty() ? "" : ": " + r.job_failure()) << std::endl;
  }
  return kOk;
}

int PrintNodes(const pb::AdminResponse& r, bool json) {
  if (json) {
    Json out = StatusJson(r);
    out["nodes"] = Json::array();
    for (const pb::ServersMeta& n : r.nodes()) {
      out["nodes"].push_back(Json{{"node_id", n.node_id()},
                                  {"role", core::RoleLabel(n.role())},
                                  {"rank", n.rank_id()},
                                  {"address", n.ip() + ":" + std::to_string(n.port())},
                                  {"state", pb::NodeState_Name(n.state())},
                                  {"alive", n.is_alive()},
                                  {"resyncing", n.resyncing()},
                                  {"incarnation", n.incarnation()},
                                  {"last_heartbeat_age_ms", n.last_heartbeat_age_ms()}});
    }
    std::cout << Dump(out) << std::endl;
    return kOk;
  }
  std::cout << Summary(r) << "\n";
  std::cout << std::left << std::setw(24) << "NODE ID" << std::setw(8) << "ROLE" << std::setw(6) << "RANK"
            << std::setw(24) << "ADDRESS" << std::setw(16) << "STATE" << "HEARTBEAT AGE\n";
  for (const pb::ServersMeta& n : r.nodes()) {
    std::ostringstream age;
    age << std::fixed << std::setprecision(1) << n.last_heartbeat_age_ms() / 1000.0 << "s";
    std::cout << std::left << std::setw(24) << n.node_id() << std::setw(8) << core::RoleLabel(n.role())
              << std::setw(6) << n.rank_id() << std::setw(24) << (n.ip() + ":" + std::to_string(n.port()))
              << std::setw(16) << pb::NodeState_Name(n.state()) << age.str() << "\n";
  }
  std::cout << std::flush;
  return kOk;
}

int PrintBarriers(const std::vector<pb::BarrierInfo>& list, bool json) {
  if (json) {
    Json out = Json::array();
    for (const pb::BarrierInfo& b : list) {
      out.push_back(Json{{"id", b.id()},
                         {"generation", b.generation()},
                         {"state", b.state()},
                         {"arrived", b.arrived()},
                         {"expected", b.expected()},
                         {"missing", std::vector<std::string>(b.missing().begin(), b.missing().end())},
                         {"result", b.result()}});
    }
    std::cout << Dump(out) << std::endl;
    return kOk;
  }
  if (list.empty()) {
    std::cout << "no barriers" << std::endl;
    return kOk;
  }
  std::cout << std::left << std::setw(24) << "BARRIER" << std::setw(6) << "GEN" << std::setw(11) << "STATE"
            << std::setw(10) << "ARRIVED" << "MISSING / RESULT\n";
  for (const pb::BarrierInfo& b : list) {
    std::string missing;
    for (const std::string& m : b.missing()) missing += (missing.empty() ? "" : ",") + m;
    std::string tail = missing;
    if (!b.result().empty()) tail += (tail.empty() ? "" : " ") + b.result();
    std::cout << std::left << std::setw(24) << b.id() << std::setw(6) << b.generation() << std::setw(11)
              << b.state() << std::setw(10) << (std::to_string(b.arrived()) + "/" + std::to_string(b.expected()))
              << tail << "\n";
  }
  std::cout << std::flush;
  return kOk;
}

// scale-out and scale-in. The scheduler answers once the operation started; with --wait we
// poll until READY and check that the membership is the one asked for.
int Scale(node::AdminClient& client, const node::AdminFlags& f, bool out) {
  const char* name = node::Info(out ? node::AdminOp::kScaleOut : node::AdminOp::kScaleIn).command;
  bool by_ids = !out && !f.node_ids.empty();
  if (!out && by_ids && (f.workers >= 0 || f.servers >= 0)) {
    return Fail(kUsage, "scale-in takes --node_ids or --workers/--servers, not both");
  }
  if (out && !f.node_ids.empty()) return Fail(kUsage, "scale-out takes --workers/--servers, not --node_ids");
  if (!by_ids && f.workers < 0 && f.servers < 0) {
    return Fail(kUsage, std::string(name) + " needs --workers=N and/or --servers=M" + (out ? "" : " or --node_ids"));
  }
  Result<pb::AdminResponse> before = client.Admin(node::AdminOpName(node::AdminOp::kStatus));
  if (!before.ok()) return FailStatus(before.status());
  pb::AdminRequest req;
  req.set_op(node::AdminOpName(out ? node::AdminOp::kScaleOut : node::AdminOp::kScaleIn));
  if (by_ids) {
    for (const std::string& id : f.node_ids) req.add_node_ids(id);
  } else {
    req.set_worker_num(f.workers >= 0 ? f.workers : before->worker_num());
    req.set_server_num(f.servers >= 0 ? f.servers : before->server_num());
  }
  Result<pb::AdminResponse> started = client.Admin(req);
  if (!started.ok()) return FailStatus(started.status());
  std::cout << name << " started: " << Summary(*started) << std::endl;
  if (!f.wait) return kOk;
  Result<pb::AdminResponse> end = client.WaitForScaleEnd(std::chrono::milliseconds(f.wait_timeout_ms));
  if (!end.ok()) return FailStatus(Status(end.status().code(), std::string(name) + ": " + end.status().message()));
  // The operation is over; a cluster not READY (e.g. NODE_TIMEOUT after a rollback) will
  // not become READY through this operation, so waiting on would only wait out the timeout.
  if (end->cluster_state() != pb::CLUSTER_READY) {
    std::string why = end->last_scale_result().empty() ? "the operation ended" : end->last_scale_result();
    return Fail(kRefused, std::string(name) + " failed: " + why + "; " + Summary(*end));
  }
  bool as_asked = true;
  if (by_ids) {
    Result<pb::AdminResponse> nodes = client.Admin(node::AdminOpName(node::AdminOp::kNodes));
    if (!nodes.ok()) return FailStatus(nodes.status());
    std::set<std::string> leaving(f.node_ids.begin(), f.node_ids.end());
    for (const pb::ServersMeta& n : nodes->nodes()) as_asked &= leaving.count(n.node_id()) == 0;
  } else {
    as_asked = end->worker_num() == req.worker_num() && end->server_num() == req.server_num();
  }
  if (!as_asked) {
    std::string why = end->last_scale_result().empty() ? "membership differs from the request"
                                                       : end->last_scale_result();
    return Fail(kRefused, std::string(name) + " failed: " + why + "; " + Summary(*end));
  }
  std::cout << name << " done: " << Summary(*end) << std::endl;
  return kOk;
}

int Kv(node::AdminClient& client, const std::vector<std::string>& args, bool json) {
  auto usage = [] { return Fail(kUsage, "usage: kv get KEY | kv set KEY VALUE | kv ls DIR | kv rm KEY"); };
  if (args.size() < 2) return usage();
  const std::string& sub = args[1];
  if (sub == "get" && args.size() == 3) {
    Result<std::string> v = client.KvTryGet(args[2]);
    if (!v.ok()) return FailStatus(v.status());
    std::cout << *v << std::endl;
    return kOk;
  }
  if (sub == "set" && args.size() == 4) {
    Status st = client.KvSet(args[2], args[3], /*overwrite=*/true);
    if (!st.ok()) return FailStatus(st);
    std::cout << "set " << args[2] << std::endl;
    return kOk;
  }
  if (sub == "ls" && (args.size() == 3 || args.size() == 2)) {
    auto list = client.KvList(args.size() == 3 ? args[2] : "");
    if (!list.ok()) return FailStatus(list.status());
    if (json) {
      Json out = Json::object();
      for (auto& [k, v] : *list) out[k] = v;
      std::cout << Dump(out) << std::endl;
      return kOk;
    }
    for (auto& [k, v] : *list) std::cout << k << "\t" << v << "\n";
    std::cout << std::flush;
    return kOk;
  }
  if (sub == "rm" && args.size() == 3) {
    Status st = client.KvDelete(args[2]);
    if (!st.ok()) return FailStatus(st);
    std::cout << "removed " << args[2] << std::endl;
    return kOk;
  }
  return usage();
}

int StateOp(node::AdminClient& client, const std::string& op) {
  Result<pb::AdminResponse> r = client.Admin(op);
  if (!r.ok()) return FailStatus(r.status());
  std::cout << r->message() << ": " << Summary(*r) << std::endl;
  return kOk;
}

volatile std::sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

// Prints every rank table the scheduler pushes (the current one first) until the stream
// ends (the job is over: exit 0; with --reconnect_ms, once subscribing again failed for
// that long) or a signal arrives (exit 0).
int WatchRankTable(const node::CommandLine& cl) {
  // Only this command ends cleanly on SIGINT/SIGTERM; the others keep the default (the
  // process ends at once), which a handler that nothing reads would swallow.
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  node::RankTableSubscriberOptions o;
  o.host = cl.node.scheduler_host;
  o.port = cl.node.scheduler_port;
  o.job_id = cl.scheduler.job_id;
  o.role = "admin";
  o.cluster_token = cl.cluster_token;
  o.tls = cl.node.tls;
  o.timeout = std::chrono::milliseconds(cl.admin.timeout_ms);
  o.reconnect_for = std::chrono::milliseconds(cl.admin.reconnect_ms);
  if (o.port <= 0) return Fail(kUsage, "no scheduler port given (--scheduler_port or PSCORE_SCHEDULER_PORT)");
  std::mutex mu;
  std::condition_variable cv;
  bool closed = false;
  Status why;
  const bool json = cl.admin.json;
  node::RankTableSubscriber sub(
      o,
      [json](const pb::RankTableStream& s) {
        if (json) {
          Json line = {{"jobId", s.jobid()}, {"rankTable", Json::parse(s.ranktable(), nullptr, false)}};
          std::cout << Dump(line, -1) << std::endl;
        } else {
          std::cout << s.ranktable() << std::endl;
        }
      },
      [&](const Status& st) {
        std::lock_guard<std::mutex> lock(mu);
        closed = true;
        why = st;
        cv.notify_all();
      });
  auto refused = [](const Status& st) {
    bool unreachable = st.code() == Code::kUnavailable || st.code() == Code::kTimeout;
    return Fail(unreachable ? kUnreachable : kRefused, "watch-ranktable: " + st.ToString());
  };
  if (cl.admin.publisher) {
    Result<uint64_t> reg = sub.Register();
    if (!reg.ok()) return refused(reg.status());
    std::cerr << "pscore-admin: registered as the publisher of job '" << o.job_id << "': registration " << *reg
              << std::endl;
  }
  Status st = sub.Start();
  if (!st.ok()) return refused(st);
  std::unique_lock<std::mutex> lock(mu);
  uint64_t lost = 0, regained = 0;
  while (!closed && g_signal == 0) {
    cv.wait_for(lock, std::chrono::milliseconds(100));
    if (sub.lost() != lost) {
      lost = sub.lost();
      std::cerr << "pscore-admin: rank table stream lost; subscribing again for up to " << cl.admin.reconnect_ms
                << " ms" << std::endl;
    }
    if (sub.resubscribed() != regained) {
      regained = sub.resubscribed();
      std::cerr << "pscore-admin: rank table stream regained" << std::endl;
    }
  }
  lock.unlock();
  sub.Stop();
  if (closed) std::cerr << "pscore-admin: rank table stream ended (" << why << ")" << std::endl;
  // A later registration of the job superseded this publisher's, or a restart forgot it.
  const bool ended = why.code() == Code::kAborted || why.code() == Code::kNotFound;
  return cl.admin.publisher && closed && ended ? kRefused : kOk;
}

// reset: clears the error state of the named members (docs/coordination.md, Incarnations).
// The ids come as arguments (`reset w0 w1`) or as --node_ids=w0,w1.
int Reset(node::AdminClient& client, const node::AdminFlags& f, const std::vector<std::string>& args) {
  pb::AdminRequest req;
  req.set_op(node::AdminOpName(node::AdminOp::kReset));
  for (const std::string& id : f.node_ids) req.add_node_ids(id);
  for (size_t i = 1; i < args.size(); ++i) req.add_node_ids(args[i]);
  Result<pb::AdminResponse> r = client.Admin(req);
  if (!r.ok()) return FailStatus(r.status());
  std::cout << r->message() << ": " << Summary(*r) << std::endl;
  return kOk;
}

int Run(const node::CommandLine& cl, const std::vector<std::string>& args) {
  const std::string& cmd = args[0];
  const node::AdminOpInfo* op = node::FindAdminCommand(cmd);
  if (op == nullptr && cmd != "kv" && cmd != "watch-ranktable") {
    return Fail(kUsage, "unknown command '" + cmd + "' (see --help)");
  }
  const bool reset = op != nullptr && op->op == node::AdminOp::kReset;
  if (cmd != "kv" && !reset && args.size() > 1) {
    return Fail(kUsage, cmd + ": unexpected argument '" + args[1] + "'");
  }
  if (reset && args.size() == 1 && cl.admin.node_ids.empty()) {
    return Fail(kUsage, "reset needs node ids: reset ID... or --node_ids=a,b");
  }
  // A flag that the command would ignore is refused by name, so a typo'd command never
  // runs with an operator believing it took the totals or ids.
  const bool totals = op != nullptr && op->takes_totals;
  const bool ids = op != nullptr && op->takes_ids;
  if (!totals && cl.admin.workers != -1) return Fail(kUsage, cmd + ": --workers does not apply (scale-out, scale-in)");
  if (!totals && cl.admin.servers != -1) return Fail(kUsage, cmd + ": --servers does not apply (scale-out, scale-in)");
  if (!ids && !cl.admin.node_ids.empty()) return Fail(kUsage, cmd + ": --node_ids does not apply (scale-in, reset)");
  if (cmd != "watch-ranktable" && cl.admin.publisher) return Fail(kUsage, cmd + ": --publisher does not apply (watch-ranktable)");
  if (cmd == "watch-ranktable") return WatchRankTable(cl);

  node::AdminClientOptions o;
  o.scheduler_host = cl.node.scheduler_host;
  o.scheduler_port = cl.node.scheduler_port;
  o.timeout = std::chrono::milliseconds(cl.admin.timeout_ms);
  o.max_message_bytes = cl.node.max_message_bytes;
  o.cluster_token = cl.cluster_token;
  o.tls = cl.node.tls;
  node::AdminClient client(o);
  Status st = client.Connect();
  if (!st.ok()) return st.code() == Code::kInvalidArgument ? Fail(kUsage, st.message()) : FailStatus(st);

  if (op == nullptr) return Kv(client, args, cl.admin.json);
  switch (op->op) {
    case node::AdminOp::kStatus:
    case node::AdminOp::kNodes: {
      Result<pb::AdminResponse> r = client.Admin(op->wire);
      if (!r.ok()) return FailStatus(r.status());
      return op->op == node::AdminOp::kStatus ? PrintStatus(*r, cl.admin.json) : PrintNodes(*r, cl.admin.json);
    }
    case node::AdminOp::kScaleOut:
      return Scale(client, cl.admin, true);
    case node::AdminOp::kScaleIn:
      return Scale(client, cl.admin, false);
    case node::AdminOp::kReset:
      return Reset(client, cl.admin, args);
    case node::AdminOp::kBarriers: {
      auto list = client.Barriers();
      if (!list.ok()) return FailStatus(list.status());
      return PrintBarriers(*list, cl.admin.json);
    }
    case node::AdminOp::kNewInstance:
    case node::AdminOp::kEnable:
    case node::AdminOp::kDisable:
    case node::AdminOp::kStop:
      break;
  }
  return StateOp(client, op->wire);
}

}  // namespace

int main(int argc, char** argv) {
  node::CommandLine cl = node::ParseAdminFlags(&argc, &argv, kUsageText);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 2;  // Only errors: the command's own output is the report.
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return Fail(kUsage, "no command given (see --help)");
  return Run(cl, args);
}
