// The demo job scaled out mid-training, as `scripts/demo.sh --cpp --scale-out-at=STEP` runs it:
// real pscore-node and pscore-train processes, worker rank 0 asks for a third server after
// step STEP, and the test starts that server once the scheduler reports CLUSTER_SCALE_OUT
// (as demo.sh does). Synchronous SGD must end with the same weights as an unscaled run of
// the same job: final loss and weights checksum equal within 1e-6 (float additions on the
// servers may only differ in their order).
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "pscore/node/common/admin_client.h"
#include "multiproc/process.h"
#include "multiproc/train_log.h"

#include <catch2/catch.hpp>

namespace pscore {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::TempDir;

const std::vector<std::string> kCommon = {"--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=3000"};

std::string TrainBinary() { return std::string(PSCORE_BIN_DIR) + "/pscore-train"; }

std::vector<std::string> With(std::vector<std::string> args) {
  args.insert(args.end(), kCommon.begin(), kCommon.end());
  return args;
}

using Final = testing::TrainFinal;
constexpr auto ParseFinal = testing::ParseTrainFinal;

bool ScaleOutRunning(node::AdminClient& admin) {
  Result<pb::AdminResponse> r = admin.Admin("status");
  return r.ok() && r->cluster_state() == pb::CLUSTER_SCALE_OUT;
}

// One demo job: scheduler, 2 sgd servers, 2 trainers of 60 steps; with scale_out_at >= 0
// a third server joins when the trainers' scale-out starts. Returns both trainers' finals.
std::vector<Final> RunDemo(int scale_out_at) {
  TempDir dir;
  REQUIRE(dir.ok());
  INFO("scale_out_at " << scale_out_at << ", logs in " << dir.path());
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  Process scheduler;
  REQUIRE(scheduler.Start(With({testing::NodeBinary(), "--role=scheduler", "--worker_num=2", "--server_num=2",
                                "--scheduler_port=0", "--port_file=" + dir.File("sched.port")}),
                          dir.File("scheduler.log")));
  const int port = testing::ReadPortFile(dir.File("sched.port"), 10s);
  REQUIRE(port > 0);
  std::vector<std::unique_ptr<Process>> servers;
  auto start_server = [&](int i) {
    const std::string id = "server" + std::to_string(i);
    servers.push_back(std::make_unique<Process>());
    REQUIRE(servers.back()->Start(With({testing::NodeBinary(), "--role=server", "--node_id=" + id,
                                        "--scheduler_port=" + std::to_string(port), "--update_rule=sgd",
                                        "--learning_rate=2"}),
                                  dir.File(id + ".log")));
  };
  start_server(0);
  start_server(1);
  std::vector<std::unique_ptr<Process>> trainers;
  for (int i = 0; i < 2; ++i) {
    trainers.push_back(std::make_unique<Process>());
    REQUIRE(trainers.back()->Start(With({TrainBinary(), "--node_id=worker" + std::to_string(i),
                                         "--scheduler_port=" + std::to_string(port), "--steps=60",
                                         "--scale_out_at=" + std::to_string(scale_out_at)}),
                                   dir.File("worker" + std::to_string(i) + ".log")));
  }
  if (scale_out_at >= 0) {
    node::AdminClientOptions ao;
    ao.scheduler_port = port;
    ao.timeout = 5s;
    node::AdminClient admin(ao);
    REQUIRE(admin.Connect().ok());
    bool started = false;
    while (!started && trainers[0]->running() && std::chrono::steady_clock::now() < deadline) {
      started = ScaleOutRunning(admin);
      if (!started) std::this_thread::sleep_for(20ms);
    }
    INFO(trainers[0]->Log());
    REQUIRE(started);
    start_server(2);
  }
  std::vector<Final> finals;
  for (auto& t : trainers) {
    std::optional<int> code = t->Wait(std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()));
    INFO(t->Log());
    REQUIRE(code == std::optional<int>(0));
    finals.push_back(ParseFinal(t->Log()));
    REQUIRE(finals.back().found);
  }
  // The job ends by itself; the added server took part to the end (a refused one exits 1).
  for (auto& s : servers) {
    INFO(s->Log());
    CHECK(s->Wait(30s) == std::optional<int>(0));
  }
  CHECK(scheduler.Wait(30s) == std::optional<int>(0));
  if (scale_out_at >= 0) {
    std::string sched_log = scheduler.Log();
    INFO(sched_log);
    CHECK(sched_log.find("scale-out started: workers 2 -> 2, servers 2 -> 3") != std::string::npos);
    CHECK(sched_log.find("scale operation done: 2 workers, 3 servers") != std::string::npos);
  }
  return finals;
}

}  // namespace

TEST_CASE("the demo scaled out mid-training ends with the weights of the unscaled run",
          "[multiproc][net][demo][scale]") {
  std::vector<Final> plain = RunDemo(-1);
  REQUIRE(plain.size() == 2);
  for (int at : {1, 20}) {  // right after the first gradient, and mid-training
    std::vector<Final> scaled = RunDemo(at);
    REQUIRE(scaled.size() == 2);
    for (size_t i = 0; i < 2; ++i) {
      INFO("scale-out at step " << at << ", trainer " << i << ": loss " << plain[i].loss << " vs "
                                << scaled[i].loss << ", checksum " << plain[i].checksum << " vs "
                                << scaled[i].checksum);
      CHECK(std::fabs(plain[i].loss - scaled[i].loss) <= 1e-6);
      CHECK(std::fabs(plain[i].checksum - scaled[i].checksum) <= 1e-6);
    }
  }
}

}  // namespace pscore
