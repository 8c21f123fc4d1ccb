// The demo job as a test: the real binaries, as scripts/demo.sh --cpp starts them. One
// pscore-node scheduler (port 0, read back from --port_file), two pscore-node servers
// with the sgd rule, two pscore-train workers; both trainers must exit 0 and end with a
// final line whose loss gap to the generating weights is at most 0.01. Every child is
// killed by pid when the test ends, whatever the outcome (multiproc/process.h). In the TLS
// pass every link runs TLS (multiproc/test_tls.h).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "multiproc/process.h"

namespace {

using namespace std::chrono_literals;
using pscore::testing::NodeBinary;
using pscore::testing::Process;
using pscore::testing::ReadPortFile;
using pscore::testing::TempDir;

bool FileExecutable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

}  // namespace

TEST_CASE("the demo job (1 scheduler, 2 servers, 2 trainers as processes) converges",
          "[multiproc][net][demo][tlspass]") {
  const std::string train_bin = std::string(PSCORE_BIN_DIR) + "/pscore-train";
  REQUIRE(FileExecutable(NodeBinary()));
  REQUIRE(FileExecutable(train_bin));
  TempDir dir;
  REQUIRE(dir.ok());
  INFO("logs in " << dir.path());
  // One deadline for the whole job.
  const auto deadline = std::chrono::steady_clock::now() + 150s;
  auto left = [&] {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return std::max(ms, std::chrono::milliseconds(1));
  };
  const std::vector<std::string> common = {"--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=3000"};
  auto with_common = [&](std::vector<std::string> v) {
    v.insert(v.end(), common.begin(), common.end());
    return v;
  };

  Process scheduler;
  REQUIRE(scheduler.Start(with_common({NodeBinary(), "--role=scheduler", "--worker_num=2", "--server_num=2",
                                       "--scheduler_port=0", "--port_file=" + dir.File("scheduler.port")}),
                          dir.File("scheduler.log")));
  const int port = ReadPortFile(dir.File("scheduler.port"), 20s);
  INFO(scheduler.Log());
  REQUIRE(port > 0);

  std::vector<std::unique_ptr<Process>> servers, trainers;
  for (int i = 0; i < 2; ++i) {
    const std::string id = "server" + std::to_string(i);
    servers.push_back(std::make_unique<Process>());
    REQUIRE(servers.back()->Start(with_common({NodeBinary(), "--role=server", "--node_id=" + id,
                                               "--scheduler_port=" + std::to_string(port), "--update_rule=sgd",
                                               "--learning_rate=2"}),
                                  dir.File(id + ".log")));
  }
  for (int i = 0; i < 2; ++i) {
    const std::string id = "worker" + std::to_string(i);
    trainers.push_back(std::make_unique<Process>());
    REQUIRE(trainers.back()->Start(
        with_common({train_bin, "--node_id=" + id, "--scheduler_port=" + std::to_string(port), "--steps=60"}),
        dir.File(id + ".log")));
  }

  for (int i = 0; i < 2; ++i) {
    const std::optional<int> code = trainers[i]->Wait(left());
    const std::string log = trainers[i]->Log();
    INFO("worker" << i << " log:\n" << log);
    REQUIRE(code.has_value());
    REQUIRE(*code == 0);
    // The final line: "worker R final loss L acc A | generating weights w*: ... | gap +G | ...".
    const size_t at = log.rfind(" final loss ");
    REQUIRE(at != std::string::npos);
    const size_t gap_at = log.find("gap ", at);
    REQUIRE(gap_at != std::string::npos);
    CHECK(std::strtod(log.c_str() + gap_at + 4, nullptr) <= 0.01);
  }
  // The job then ends by itself: servers and scheduler leave through the finish barrier.
  for (auto& s : servers) CHECK(s->Wait(left()) == std::optional<int>(0));
  CHECK(scheduler.Wait(left()) == std::optional<int>(0));
}
