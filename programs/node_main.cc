// pscore-node: runs one scheduler, worker or server of a job. Exit codes (programs/exit_codes.h):
// 0 the job finished; 1 a runtime failure (refused, port busy, signal); 2 bad flags;
// 3 the job failed (a member lost); 4 a member gave up on the scheduler.
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <future>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include <gflags/gflags.h>

#include <atomic>

#include "pscore/comm/tls.h"
#include "pscore/core/role_names.h"
#include "pscore/node/common/member_http.h"
#include "pscore/node/common/tls_reloader.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/ranktable_hub.h"
#include "pscore/node/scheduler/scheduler_http.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_node.h"
#include "pscore/node/worker/worker_node.h"
#include "programs/exit_codes.h"
#include "programs/flags.h"

namespace {

volatile std::sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << port << "\n";
  }
  std::rename(tmp.c_str(), path.c_str());  // Readers never see a half-written file.
}

using namespace pscore;
using namespace std::chrono_literals;

// One line per cluster event about a node (state changes are not logged here), so that an
// operator, and the fault tests, can see in each member's log what it was told.
void LogClusterEvent(const std::string& self, const pb::ClusterEventMessage& ev) {
  if (ev.kind() == pb::ClusterEventMessage::STATE_CHANGED) return;
  const std::string line = self + ": cluster event " + pb::ClusterEventMessage::Kind_Name(ev.kind()) + " for " +
                           core::RoleLabel(ev.role()) + " " + ev.node_id() + " (rank " + std::to_string(ev.rank_id()) +
                           "): " + ev.message() + "; cluster " + core::ClusterStateName(ev.cluster_state());
  if (ev.kind() == pb::ClusterEventMessage::NODE_TIMED_OUT || ev.kind() == pb::ClusterEventMessage::NODE_ERROR) {
    LOG(WARNING) << line;
  } else {
    LOG(INFO) << line;
  }
}

int RunScheduler(const node::CommandLine& cl) {
  node::SchedulerNode sched(cl.scheduler);
  Status st = sched.Start();
  if (!st.ok()) {
    LOG(ERROR) << "scheduler failed to start: " << st;
    std::cerr << "pscore-node: " << st << std::endl;
    return 1;
  }
  WritePortFile(cl.port_file, sched.port());
  // The rank-table hub always runs (native subscribers); HTTP only with --http_port >= 0.
  node::RankTableHub hub(&sched);
  node::SchedulerHttp http(&sched, &hub);
  st = hub.Start();
  if (st.ok() && cl.scheduler.http_port >= 0) {
    Result<int> port = http.Start(cl.scheduler.http_host, cl.scheduler.http_port);
    st = port.status();
    if (st.ok()) {
      std::cout << "pscore-node: HTTP on " << cl.scheduler.http_host << ":" << *port << std::endl;
      WritePortFile(cl.http_port_file, *port);
    }
  }
  if (!st.ok()) {
    LOG(ERROR) << "scheduler HTTP/rank table failed to start: " << st;
    std::cerr << "pscore-node: " << st << std::endl;
    sched.Stop();
    return 1;
  }
  while (g_signal == 0 && !sched.WaitForExit(100ms).ok()) {
  }
  if (g_signal != 0) LOG(INFO) << "scheduler: signal " << g_signal << ", stopping";
  std::this_thread::sleep_for(200ms);  // Let the last answers and TERMINATE reach the nodes.
  http.Stop();
  hub.Stop();
  sched.Stop();
  if (g_signal != 0) return node::kExitError;
  const core::JobOutcome outcome = sched.outcome();
  if (outcome.result == core::JobOutcome::Result::kFailed) {
    std::cerr << "pscore-node: job failed: " << outcome.failure << std::endl;
    return node::kExitJobFailed;
  }
  return node::kExitFinished;
}

// Node::Start blocks until the scheduler admitted the node (up to --connect_timeout_ms, and
// --join_timeout_ms more while its role's quota is full or a scale-in runs). It runs on a
// thread of its own so that SIGINT/SIGTERM meanwhile ends the process at once (exit 1),
// without waiting for a Start that would only return at its deadline. The node is not
// stopped: Stop must not run while Start does, and the process ends as a SIGKILL would end
// it (the journal and state files are written to survive that).
Status StartOrSignal(node::Node* n) {
  std::promise<Status> started;
  std::future<Status> done = started.get_future();
  std::thread starter([n, &started] { started.set_value(n->Start()); });
  while (done.wait_for(50ms) != std::future_status::ready) {
    if (g_signal == 0) continue;
    const int sig = g_signal;
    LOG(WARNING) << n->node_id() << ": signal " << sig << " while starting; exiting";
    std::cerr << "pscore-node: " << n->node_id() << ": signal " << sig << " while starting; exiting" << std::endl;
    google::FlushLogFiles(google::GLOG_INFO);
    std::_Exit(1);
  }
  starter.join();
  return done.get();
}

int RunMember(const node::CommandLine& cl, pb::NodeRole role) {
  node::NodeOptions opts = cl.node;
  opts.role = role;
  std::unique_ptr<node::Node> n;
  if (role == pb::SERVER) {
    core::ParamStore::Options so;
    so.rule = cl.update_rule == "assign" ? core::UpdateRule::kAssign
              : cl.update_rule == "sgd"  ? core::UpdateRule::kSgd
                                         : core::UpdateRule::kSum;
    so.learning_rate = cl.learning_rate;
    so.stream_spare_bytes = cl.stream_spare_bytes;
    so.batch_threads = cl.store_threads;
    n = std::make_unique<node::ServerNode>(opts, so);
  } else {
    n = std::make_unique<node::WorkerNode>(opts);
  }
  node::Node::Callbacks cb;
  cb.on_cluster_event = [self = n->node_id()](const pb::ClusterEventMessage& ev) { LogClusterEvent(self, ev); };
  n->SetCallbacks(std::move(cb));
  Status st = StartOrSignal(n.get());
  if (!st.ok()) {
    std::cerr << "pscore-node: " << st << std::endl;
    return 1;
  }
  WritePortFile(cl.port_file, n->listen_port());
  // --http_port >= 0: /metrics of this member (docs/http.md, Members).
  node::MemberHttp http(n.get());
  if (cl.scheduler.http_port >= 0) {
    Result<int> port = http.Start(cl.scheduler.http_host, cl.scheduler.http_port);
    if (!port.ok()) {
      LOG(ERROR) << n->node_id() << ": HTTP failed to start: " << port.status();
      std::cerr << "pscore-node: " << port.status() << std::endl;
      http.Stop();
      n->Stop();
      return 1;
    }
    std::cout << "pscore-node: HTTP on " << cl.scheduler.http_host << ":" << *port << std::endl;
    WritePortFile(cl.http_port_file, *port);
  }
  std::thread finisher;
  if (cl.auto_finish) {
    finisher = std::thread([&n, &cl] {
      if (!n->WaitForReady(std::chrono::milliseconds(cl.finish_timeout_ms)).ok()) return;
      Status f = n->Finish(std::chrono::milliseconds(cl.finish_timeout_ms));
      if (!f.ok()) LOG(WARNING) << n->node_id() << ": finish: " << f;
    });
  }
  Status end;
  for (;;) {
    end = n->WaitForTermination(100ms);
    if (end.code() != Code::kTimeout) break;
    if (g_signal != 0) {
      end = Status(Code::kCancelled, "signal " + std::to_string(g_signal));
      break;
    }
  }
  http.Stop();
  n->Stop();
  if (finisher.joinable()) finisher.join();
  if (!end.ok()) {
    LOG(ERROR) << n->node_id() << ": " << end;
    std::cerr << "pscore-node: " << end << std::endl;
    return node::MemberExitCode(end);
  }
  LOG(INFO) << n->node_id() << ": the job ended; exiting";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  node::CommandLine cl = node::ParseNodeFlags(
      &argc, &argv,
      "Runs one node of a pscore job.\n"
      "  pscore-node --role=scheduler --scheduler_port=P --worker_num=W --server_num=S\n"
      "  pscore-node --role=server --scheduler_port=P [--node_id=ID]\n"
      "  pscore-node --role=worker --scheduler_port=P [--node_id=ID]\n"
      "Every flag also reads PSCORE_<FLAG_NAME> from the environment when not given.");
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);
  // A file size limit (ulimit -f) reached by the journal or the state file fails that write
  // (EFBIG), which is handled as a full disk is, instead of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  node::TlsReloader reloader(cl.node.tls);
  const std::optional<pb::NodeRole> role = core::ParseRoleLabel(cl.role);
  if (role == pb::SCHEDULER) return RunScheduler(cl);
  if (role) return RunMember(cl, *role);
  std::cerr << "pscore-node: --role must be scheduler, worker or server (got '" << cl.role << "')" << std::endl;
  return node::kExitUsage;
}
