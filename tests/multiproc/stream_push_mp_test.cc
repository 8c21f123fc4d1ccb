// Large ZPushes folded into the store as they arrive, with real processes: a scheduler,
// two servers without --data_dir (so they take large pushes piece by piece) and two
// soak_driver workers pushing +1 to 4 keys of 8 MiB in a loop. One worker is SIGKILLed
// right after a push was acknowledged, so in the middle of sending the next (a part of
// 16 MiB per server), and started again; then both stop and w0 checks every key:
// acknowledged pushes <= value <= sent pushes (a push cut off by the kill is dropped
// whole, never half applied: every float of a key must hold the same value). Every child
// is killed by pid when the test ends.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "multiproc/process.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<std::string> Timing() {
  return {"--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=2000", "--connect_timeout_ms=20000"};
}

std::string DriverBinary() { return std::string(PSCORE_BIN_DIR) + "/soak_driver_bench"; }

uint64_t FileSize(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  return f ? static_cast<uint64_t>(f.tellg()) : 0;
}

// Waits until `path` holds more than `bytes` bytes (a driver's acknowledged pushes).
bool WaitGrows(const std::string& path, uint64_t bytes, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (FileSize(path) > bytes) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

}  // namespace

TEST_CASE("a worker SIGKILLed in the middle of large ZPushes leaves no half push and loses none of the others",
          "[multiproc][net][stream][tlspass]") {
  TempDir dir;
  REQUIRE(dir.ok());
  Process scheduler;
  std::vector<std::string> argv = {NodeBinary(), "--role=scheduler", "--recoverable_roles=worker,server", "--scheduler_port=0", "--worker_num=2",
                                   "--server_num=2", "--port_file=" + dir.File("sched.port")};
  for (auto& f : Timing()) argv.push_back(f);
  REQUIRE(scheduler.Start(argv, dir.File("scheduler.log")));
  const int port = ReadPortFile(dir.File("sched.port"), 10s);
  REQUIRE(port > 0);
  Process servers[2];
  for (int i = 0; i < 2; ++i) {
    const std::string id = "s" + std::to_string(i);
    std::vector<std::string> a = {NodeBinary(), "--role=server", "--node_id=" + id,
                                  "--scheduler_port=" + std::to_string(port), "--auto_finish=false"};
    for (auto& f : Timing()) a.push_back(f);
    REQUIRE(servers[i].Start(a, dir.File(id + ".log")));
  }
  auto driver = [&](const std::string& id) {
    std::vector<std::string> a = {DriverBinary(), "--scheduler_port=" + std::to_string(port), "--node_id=" + id,
                                  "--dir=" + dir.path(), "--keys=4", "--floats=2097152", "--pause_us=0",
                                  "--heartbeat_interval_ms=100", "--connect_timeout_ms=20000"};
    if (id == "w0") {
      a.push_back("--check");
      a.push_back("--peers=w0,w1");
    }
    return a;
  };
  Process w0, w1;
  REQUIRE(w0.Start(driver("w0"), dir.File("w0.log")));
  REQUIRE(w1.Start(driver("w1"), dir.File("w1.log")));
  // Both push; then w1 dies as soon as one more push of its was acknowledged (the next
  // one is on its way then) and comes back under the same id.
  REQUIRE(WaitGrows(dir.File("w0.acked"), 5, 60s));
  REQUIRE(WaitGrows(dir.File("w1.acked"), 5, 60s));
  REQUIRE(WaitGrows(dir.File("w1.acked"), FileSize(dir.File("w1.acked")), 60s));
  w1.Signal(SIGKILL);
  REQUIRE(w1.Wait(10s).has_value());
  const uint64_t w1_acked = FileSize(dir.File("w1.acked"));
  const uint64_t w0_acked = FileSize(dir.File("w0.acked"));
  REQUIRE(w1.Start(driver("w1"), dir.File("w1.log")));
  REQUIRE(WaitGrows(dir.File("w1.acked"), w1_acked + 5, 60s));
  CHECK(FileSize(dir.File("w0.acked")) > w0_acked);  // w0 went on meanwhile
  { std::ofstream stop(dir.File("stop")); }
  std::optional<int> checked = w0.Wait(120s);
  INFO(w0.Log());
  REQUIRE(checked.has_value());
  CHECK(*checked == 0);
  CHECK(w0.Log().find("lost updates 0, duplicated updates 0, torn keys 0") != std::string::npos);
  REQUIRE(w1.Wait(30s).has_value());
  // The servers folded pushes in as they arrived (each says how many when it stops). Not
  // all of them: a push finding a key held by the other worker's stream, or behind its own
  // link's push still on a handler thread, is applied whole (few are folded under TSan).
  uint64_t folded = 0;
  for (Process& s : servers) {
    s.Signal(SIGTERM);
    REQUIRE(s.Wait(20s).has_value());
    const std::string log = s.Log();
    const std::string tail = " pushes folded into the store as they arrived";
    const size_t at = log.find(tail);
    REQUIRE(at != std::string::npos);
    const size_t from = log.rfind(' ', at - 1) + 1;
    folded += std::stoull(log.substr(from, at - from));
  }
  CHECK(folded > 0);
}

}  // namespace pscore::testing
