// Launcher detection (programs/launcher.h) from fake environments: Slurm steps, heterogeneous
// Slurm jobs, Kubernetes StatefulSet and Indexed Job pods, and the missing variable named.
#include "programs/launcher.h"

#include <catch2/catch.hpp>

namespace pscore::node {
namespace {

EnvMap SlurmStep() {
  return {{"SLURM_JOB_ID", "4321"},          {"SLURM_PROCID", "1"},     {"SLURM_NTASKS", "2"},
          {"SLURM_JOB_NODELIST", "gpu[07-09,12],cpu1"}, {"SLURMD_NODENAME", "gpu08"}};
}

}  // namespace

TEST_CASE("Slurm host lists expand in order, zero padding kept", "[launcher]") {
  auto ok = [](const std::string& s) {
    Result<std::vector<std::string>> r = ExpandSlurmHostList(s);
    REQUIRE(r.ok());
    return *r;
  };
  CHECK(ok("node01") == std::vector<std::string>{"node01"});
  CHECK(ok("node[01-03,07]") == std::vector<std::string>{"node01", "node02", "node03", "node07"});
  CHECK(ok("a1,b[9-11],c") == std::vector<std::string>{"a1", "b9", "b10", "b11", "c"});
  CHECK(ok("rack[1-2]-n[1,3]") == std::vector<std::string>{"rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"});
  CHECK(ok("localhost") == std::vector<std::string>{"localhost"});
  CHECK(ok("").empty());
  for (const char* bad : {"node[01-03", "node]", "node[]", "node[3-1]", "node[a-b]", "n[1-2]]"}) {
    INFO(bad);
    CHECK_FALSE(ExpandSlurmHostList(bad).ok());
  }
}

TEST_CASE("launcher names and the auto rule", "[launcher]") {
  CHECK(*ParseLauncherKind("auto") == LauncherKind::kAuto);
  CHECK(*ParseLauncherKind("slurm") == LauncherKind::kSlurm);
  CHECK(*ParseLauncherKind("k8s") == LauncherKind::kK8s);
  CHECK(*ParseLauncherKind("env") == LauncherKind::kEnv);
  CHECK(ParseLauncherKind("mpi").status().message().find("auto, env, slurm or k8s") != std::string::npos);
  CHECK(ResolveAuto({}) == LauncherKind::kEnv);
  CHECK(ResolveAuto({{"SLURM_JOB_ID", "1"}}) == LauncherKind::kEnv);  // an salloc shell, no task
  CHECK(ResolveAuto({{"SLURM_JOB_ID", "1"}, {"SLURM_PROCID", "0"}}) == LauncherKind::kSlurm);
  CHECK(ResolveAuto({{"KUBERNETES_SERVICE_HOST", "10.0.0.1"}}) == LauncherKind::kK8s);
  CHECK(ResolveAuto({{"KUBERNETES_SERVICE_HOST", "10.0.0.1"}, {"SLURM_JOB_ID", "1"}, {"SLURM_PROCID", "0"}}) ==
        LauncherKind::kSlurm);
  Result<LaunchInfo> none = DetectLaunch(LauncherKind::kAuto, {{"HOME", "/root"}}, {});
  REQUIRE(none.ok());
  CHECK(none->kind == LauncherKind::kEnv);
  CHECK(none->role.empty());
  CHECK(none->scheduler_port == 0);
}

TEST_CASE("Slurm: one srun step per role, --role given", "[launcher]") {
  LaunchGiven given;
  given.role = "server";
  Result<LaunchInfo> r = DetectLaunch(LauncherKind::kSlurm, SlurmStep(), given);
  REQUIRE(r.ok());
  CHECK(r->kind == LauncherKind::kSlurm);
  CHECK(r->role == "server");
  CHECK(r->task_index == 1);
  CHECK(r->node_id == "server-4321-1");
  CHECK(r->scheduler_host == "gpu07");  // the job's first host
  CHECK(r->scheduler_port == 20000 + 4321);
  CHECK(r->scheduler_port == SlurmDefaultPort(4321));
  CHECK(r->host == "gpu08");
  CHECK(r->job_id == "slurm-4321");
  CHECK(r->worker_num == -1);  // a plain step does not know the other roles' counts
  CHECK(r->server_num == -1);
  CHECK(r->Describe().find("launcher slurm: role=server task=1 node_id=server-4321-1") != std::string::npos);
  CHECK(SlurmDefaultPort(123456789) == 20000 + 123456789 % 20000);
}

TEST_CASE("Slurm: flags given win, only the variables still needed are asked for", "[launcher]") {
  LaunchGiven given;
  given.role = "worker";
  given.node_id = true;
  given.scheduler_host = true;
  given.scheduler_port = true;
  given.host = true;
  given.job_id = true;
  EnvMap env = {{"SLURM_JOB_ID", "9"}, {"SLURM_PROCID", "0"}};  // no node list, no SLURMD_NODENAME
  Result<LaunchInfo> r = DetectLaunch(LauncherKind::kSlurm, env, given);
  REQUIRE(r.ok());
  CHECK(r->role == "worker");
  CHECK(r->node_id.empty());
  CHECK(r->scheduler_host.empty());
  CHECK(r->scheduler_port == 0);
  CHECK(r->host.empty());
  CHECK(r->job_id.empty());
}

TEST_CASE("Slurm: a missing or bad variable is an error naming it", "[launcher]") {
  LaunchGiven server;
  server.role = "server";
  auto error = [](const EnvMap& env, const LaunchGiven& g) {
    Result<LaunchInfo> r = DetectLaunch(LauncherKind::kSlurm, env, g);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
    return r.status().message();
  };
  for (const char* var : {"SLURM_JOB_ID", "SLURM_PROCID", "SLURM_JOB_NODELIST", "SLURMD_NODENAME"}) {
    EnvMap env = SlurmStep();
    env.erase(var);
    INFO(var);
    CHECK(error(env, server).find(std::string(var) + " is not set") == 0);
  }
  EnvMap bad = SlurmStep();
  bad["SLURM_PROCID"] = "x1";
  CHECK(error(bad, server).find("SLURM_PROCID='x1'") == 0);
  bad = SlurmStep();
  bad["SLURM_JOB_NODELIST"] = "gpu[1-";
  CHECK(error(bad, server).find("SLURM_JOB_NODELIST: unbalanced") == 0);
  // No --role outside a heterogeneous job: the role has no source.
  CHECK(error(SlurmStep(), {}).find("SLURM_HET_JOB_OFFSET is not set") == 0);
  LaunchGiven typo;
  typo.role = "master";
  CHECK(error(SlurmStep(), typo).find("role must be scheduler, server or worker") == 0);
}

TEST_CASE("Slurm: a heterogeneous job's component gives the role and the counts", "[launcher]") {
  EnvMap env = {{"SLURM_JOB_ID", "101"},  // this component's own id
                {"SLURM_HET_JOB_ID", "100"},
                {"SLURM_HET_SIZE", "3"},
                {"SLURM_HET_JOB_OFFSET", "2"},
                {"SLURM_PROCID", "3"},
                {"SLURM_NTASKS", "4"},
                {"SLURM_NTASKS_HET_GROUP_1", "2"},
                {"SLURM_NTASKS_HET_GROUP_2", "4"},
                {"SLURM_JOB_NODELIST", "w[1-4]"},
                {"SLURM_JOB_NODELIST_HET_GROUP_0", "head1"},
                {"SLURMD_NODENAME", "w4"}};
  Result<LaunchInfo> r = DetectLaunch(LauncherKind::kSlurm, env, {});
  REQUIRE(r.ok());
  CHECK(r->role == "worker");
  CHECK(r->node_id == "worker-100-3");
  CHECK(r->job_id == "slurm-100");
  CHECK(r->scheduler_port == SlurmDefaultPort(100));  // the same in every component
  CHECK(r->scheduler_host == "head1");                // component 0's first host
  CHECK(r->server_num == 2);
  CHECK(r->worker_num == 4);

  env["SLURM_HET_JOB_OFFSET"] = "0";
  r = DetectLaunch(LauncherKind::kSlurm, env, {});
  REQUIRE(r.ok());
  CHECK(r->role == "scheduler");
  CHECK(r->node_id.empty());
  env["SLURM_HET_JOB_OFFSET"] = "1";
  LaunchGiven counts;
  counts.counts = true;
  r = DetectLaunch(LauncherKind::kSlurm, env, counts);
  REQUIRE(r.ok());
  CHECK(r->role == "server");
  CHECK(r->server_num == -1);  // --server_num/--worker_num given: not overridden

  // Slurm before 20.02 named them PACK.
  EnvMap pack = {{"SLURM_JOB_ID", "51"},         {"SLURM_PACK_JOB_ID", "50"},   {"SLURM_PACK_JOB_OFFSET", "1"},
                 {"SLURM_PROCID", "0"},          {"SLURM_JOB_NODELIST", "n1"}, {"SLURMD_NODENAME", "n1"}};
  r = DetectLaunch(LauncherKind::kSlurm, pack, {});
  REQUIRE(r.ok());
  CHECK(r->role == "server");
  CHECK(r->job_id == "slurm-50");

  env["SLURM_HET_JOB_OFFSET"] = "3";
  Result<LaunchInfo> four = DetectLaunch(LauncherKind::kSlurm, env, {});
  REQUIRE_FALSE(four.ok());
  CHECK(four.status().message().find("SLURM_HET_JOB_OFFSET='3'") == 0);
}

TEST_CASE("Kubernetes: StatefulSet pods, Indexed Job pods, the scheduler Service", "[launcher]") {
  EnvMap server = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                   {"POD_NAME", "pscore-server-2"},
                   {"POD_IP", "10.244.1.7"},
                   {"POD_ROLE", "server"},
                   {"HOSTNAME", "ignored"}};
  Result<LaunchInfo> r = DetectLaunch(LauncherKind::kAuto, server, {});
  REQUIRE(r.ok());
  CHECK(r->kind == LauncherKind::kK8s);
  CHECK(r->role == "server");
  CHECK(r->task_index == 2);  // the StatefulSet ordinal
  CHECK(r->node_id == "pscore-server-2");
  CHECK(r->scheduler_host == "pscore-scheduler");
  CHECK(r->scheduler_port == kK8sSchedulerPort);
  CHECK(r->host == "10.244.1.7");
  CHECK(r->http_host == "0.0.0.0");

  EnvMap worker = {{"HOSTNAME", "pscore-worker-1-x7k2p"},
                   {"POD_IP", "10.244.2.9"},
                   {"POD_ROLE", "worker"},
                   {"JOB_COMPLETION_INDEX", "1"},
                   {"PSCORE_SCHEDULER_SERVICE", "sched.ml.svc.cluster.local"}};
  r = DetectLaunch(LauncherKind::kK8s, worker, {});
  REQUIRE(r.ok());
  CHECK(r->node_id == "worker-1");  // a retried pod of index 1 keeps its id
  CHECK(r->task_index == 1);
  CHECK(r->scheduler_host == "sched.ml.svc.cluster.local");

  EnvMap sched = {{"POD_NAME", "pscore-scheduler-5d9c7-abcde"}, {"POD_ROLE", "scheduler"}, {"POD_IP", "10.0.0.3"}};
  r = DetectLaunch(LauncherKind::kK8s, sched, {});
  REQUIRE(r.ok());
  CHECK(r->role == "scheduler");
  CHECK(r->host == "0.0.0.0");  // a scheduler binds every address: its Service and 127.0.0.1
  CHECK(r->node_id.empty());
  CHECK(r->task_index == -1);

  LaunchGiven given;
  given.role = "worker";
  given.node_id = true;
  given.http_host = true;
  given.scheduler_port = true;
  r = DetectLaunch(LauncherKind::kK8s, server, given);
  REQUIRE(r.ok());
  CHECK(r->role == "worker");
  CHECK(r->node_id.empty());
  CHECK(r->http_host.empty());
  CHECK(r->scheduler_port == 0);
}

TEST_CASE("Kubernetes: a missing variable is an error naming it", "[launcher]") {
  auto error = [](const EnvMap& env) {
    Result<LaunchInfo> r = DetectLaunch(LauncherKind::kK8s, env, {});
    REQUIRE_FALSE(r.ok());
    return r.status().message();
  };
  CHECK(error({{"POD_ROLE", "server"}, {"POD_IP", "10.0.0.2"}}).find("POD_NAME is not set") == 0);
  CHECK(error({{"POD_NAME", "p-0"}, {"POD_IP", "10.0.0.2"}}).find("POD_ROLE is not set") == 0);
  CHECK(error({{"POD_NAME", "p-0"}, {"POD_ROLE", "server"}}).find("POD_IP is not set") == 0);
  CHECK(error({{"POD_NAME", "p-0"}, {"POD_ROLE", "ps"}, {"POD_IP", "1.2.3.4"}}).find("role must be") == 0);
  CHECK(error({{"POD_NAME", "p-0"}, {"POD_ROLE", "worker"}, {"POD_IP", "1.2.3.4"}, {"JOB_COMPLETION_INDEX", "a"}})
            .find("JOB_COMPLETION_INDEX='a'") == 0);
}

TEST_CASE("ResolveHost keeps addresses and resolves names", "[launcher]") {
  CHECK(*ResolveHost("10.1.2.3") == "10.1.2.3");
  Result<std::string> lo = ResolveHost("localhost");
  REQUIRE(lo.ok());
  CHECK(lo->rfind("127.", 0) == 0);  // from /etc/hosts: no query leaves the machine
}

}  // namespace pscore::node
