// pscore-node and pscore-train started as Slurm's srun and a Kubernetes pod would start them:
// the layout comes from the environment (--launcher, programs/launcher.h), set here with
// /usr/bin/env -i so the test's own environment does not leak in. A missing variable exits 2
// naming it; a whole demo job laid out by fake Slurm variables runs to its end.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "multiproc/process.h"
#include "multiproc/train_log.h"
#include "programs/launcher.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;

std::string TrainBinary() { return std::string(PSCORE_BIN_DIR) + "/pscore-train"; }

// argv run under `env -i VARS...`; the sanitizers' options (CI's suppressions) pass through.
std::vector<std::string> WithEnv(const std::vector<std::string>& vars, const std::vector<std::string>& argv) {
  std::vector<std::string> out = {"/usr/bin/env", "-i"};
  for (const char* name : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS", "LSAN_OPTIONS"}) {
    if (const char* v = std::getenv(name)) out.push_back(std::string(name) + "=" + v);
  }
  out.insert(out.end(), vars.begin(), vars.end());
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

struct Ended {
  int code = -1;
  std::string out;
};

Ended RunToEnd(const TempDir& dir, const std::vector<std::string>& argv, const std::string& log) {
  Process p;
  REQUIRE(p.Start(argv, dir.File(log)));
  std::optional<int> code = p.Wait(20s);
  REQUIRE(code.has_value());
  return Ended{*code, p.Log()};
}

}  // namespace

TEST_CASE("launcher: a bad name or a missing variable exits 2 naming it", "[multiproc][launcher]") {
  TempDir dir;
  REQUIRE(dir.ok());
  Ended bad = RunToEnd(dir, {NodeBinary(), "--launcher=mpi", "--role=worker", "--scheduler_port=1"}, "bad.log");
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out, Catch::Contains("--launcher must be auto, env, slurm or k8s"));

  // Auto picks Slurm (SLURM_JOB_ID and SLURM_PROCID set); the node list is missing.
  Ended slurm = RunToEnd(dir, WithEnv({"SLURM_JOB_ID=12", "SLURM_PROCID=0", "SLURMD_NODENAME=localhost"},
                                      {NodeBinary(), "--role=server", "--connect_timeout_ms=1000"}),
                         "slurm.log");
  CHECK(slurm.code == 2);
  CHECK_THAT(slurm.out, Catch::Contains("--launcher=slurm: SLURM_JOB_NODELIST is not set"));
  CHECK(std::count(slurm.out.begin(), slurm.out.end(), '\n') == 1);

  // A Slurm step with no role: neither --role nor a heterogeneous component.
  Ended role = RunToEnd(dir, WithEnv({"SLURM_JOB_ID=12", "SLURM_PROCID=0", "SLURM_JOB_NODELIST=localhost",
                                      "SLURMD_NODENAME=localhost"},
                                     {NodeBinary(), "--launcher=slurm"}),
                        "role.log");
  CHECK(role.code == 2);
  CHECK_THAT(role.out, Catch::Contains("SLURM_HET_JOB_OFFSET is not set"));

  Ended k8s = RunToEnd(dir, WithEnv({"KUBERNETES_SERVICE_HOST=127.0.0.1", "POD_NAME=pscore-server-0", "POD_ROLE=server"},
                                    {NodeBinary()}),
                       "k8s.log");
  CHECK(k8s.code == 2);
  CHECK_THAT(k8s.out, Catch::Contains("--launcher=k8s: POD_IP is not set"));

  // --launcher=env ignores the engine's variables: the flag check of a plain start applies.
  Ended env = RunToEnd(dir, WithEnv({"SLURM_JOB_ID=12", "SLURM_PROCID=0"}, {NodeBinary(), "--launcher=env",
                                                                           "--role=server"}),
                       "env.log");
  CHECK(env.code == 2);
  CHECK_THAT(env.out, Catch::Contains("--scheduler_port is required"));
}

TEST_CASE("a demo job laid out by Slurm's variables alone runs to its end", "[multiproc][launcher][demo]") {
  TempDir dir;
  REQUIRE(dir.ok());
  // A job id from the pid: the scheduler port derived from it (21000-31999) differs between
  // test runs and stays below the kernel's ephemeral range (32768-).
  const std::string job = std::to_string(1000 + ::getpid() % 11000);
  const int port = node::SlurmDefaultPort(std::stoull(job));
  auto slurm = [&](int procid, const std::string& ntasks) {
    return std::vector<std::string>{"SLURM_JOB_ID=" + job, "SLURM_PROCID=" + std::to_string(procid),
                                    "SLURM_NTASKS=" + ntasks, "SLURM_JOB_NODELIST=localhost",
                                    "SLURMD_NODENAME=localhost"};
  };
  const std::vector<std::string> timing = {"--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=3000"};
  auto cmd = [&](std::vector<std::string> v) {
    v.insert(v.end(), timing.begin(), timing.end());
    return v;
  };
  Process scheduler;
  REQUIRE(scheduler.Start(WithEnv(slurm(0, "1"), cmd({NodeBinary(), "--role=scheduler", "--worker_num=2",
                                                      "--server_num=1", "--port_file=" + dir.File("sched.port")})),
                          dir.File("scheduler.log")));
  INFO(scheduler.Log());
  REQUIRE(ReadPortFile(dir.File("sched.port"), 10s) == port);
  Process server;
  REQUIRE(server.Start(WithEnv(slurm(0, "1"), cmd({NodeBinary(), "--role=server", "--update_rule=sgd",
                                                   "--learning_rate=2"})),
                       dir.File("server.log")));
  Process w0, w1;
  REQUIRE(w0.Start(WithEnv(slurm(0, "2"), cmd({TrainBinary(), "--steps=20"})), dir.File("worker0.log")));
  REQUIRE(w1.Start(WithEnv(slurm(1, "2"), cmd({TrainBinary(), "--steps=20"})), dir.File("worker1.log")));

  std::optional<int> c0 = w0.Wait(120s);
  std::optional<int> c1 = w1.Wait(120s);
  INFO(w0.Log() << w1.Log() << server.Log());
  REQUIRE(c0.has_value());
  REQUIRE(c1.has_value());
  CHECK(*c0 == 0);
  CHECK(*c1 == 0);
  CHECK(ParseTrainFinal(w0.Log()).found);
  CHECK(ParseTrainFinal(w1.Log()).found);
  CHECK(server.Wait(30s) == std::optional<int>(0));
  CHECK(scheduler.Wait(30s) == std::optional<int>(0));
  // The members' ids come from the job id and the task rank: the scheduler registered them
  // under those.
  for (const std::string& id : {"server-" + job + "-0", "worker-" + job + "-0", "worker-" + job + "-1"}) {
    CHECK_THAT(scheduler.Log(), Catch::Contains(id + " registered as rank"));
  }
  // One line in each process says what was detected.
  CHECK_THAT(server.Log(), Catch::Contains("launcher slurm: role=server task=0 node_id=server-" + job + "-0"));
  CHECK_THAT(w1.Log(), Catch::Contains("launcher slurm: role=worker task=1 node_id=worker-" + job + "-1"));
  CHECK_THAT(scheduler.Log(), Catch::Contains("job_id=slurm-" + job));
}

}  // namespace pscore::testing
