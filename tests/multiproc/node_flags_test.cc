// pscore-node and pscore-admin as an operator starts them: flag checks that exit 2 with one
// line, --help listing each program's own flags, and signals during start. Every process is
// the real binary, stopped by its pid; every wait has a deadline.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include <string>
#include <vector>

#include "multiproc/process.h"

#include <catch2/catch.hpp>

namespace pscore {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::TempDir;

struct Run {
  int code = -1;
  std::string out;  // stdout and stderr together
};

// Runs argv to its end (deadline 20 s; a process still running then is killed and fails).
Run RunToEnd(const TempDir& dir, const std::vector<std::string>& argv, const std::string& log) {
  Process p;
  REQUIRE(p.Start(argv, dir.File(log)));
  std::optional<int> code = p.Wait(20s);
  REQUIRE(code.has_value());
  return Run{*code, p.Log()};
}

TEST_CASE("a worker or server without --scheduler_port exits 2 naming the flag", "[multiproc]") {
  TempDir dir;
  REQUIRE(dir.ok());
  for (const std::string role : {"worker", "server"}) {
    Run r = RunToEnd(dir, {testing::NodeBinary(), "--role=" + role, "--connect_timeout_ms=60000"}, role + ".log");
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Catch::Contains("--scheduler_port"));
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
}

TEST_CASE("pscore-admin refuses a flag that does not apply to the command and names it", "[multiproc]") {
  TempDir dir;
  REQUIRE(dir.ok());
  // Port 1: nothing is dialled, the command line is refused first.
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"stop", "--workers=3"}, "--workers"},
      {{"enable", "--servers=2"}, "--servers"},
      {{"status", "--node_ids=s0"}, "--node_ids"},
      {{"scale-out", "--servers=2", "--node_ids=s0"}, "--node_ids"},
  };
  int i = 0;
  for (const auto& [args, flag] : cases) {
    std::vector<std::string> argv = {testing::AdminBinary(), "--scheduler_port=1", "--timeout_ms=2000"};
    argv.insert(argv.end(), args.begin(), args.end());
    Run r = RunToEnd(dir, argv, "admin" + std::to_string(i++) + ".log");
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Catch::Contains(flag + " does not apply"));
  }
}

TEST_CASE("each program's --help lists its own flags only and refuses the others'", "[multiproc]") {
  TempDir dir;
  REQUIRE(dir.ok());
  Run admin = RunToEnd(dir, {testing::AdminBinary(), "--help"}, "admin-help.log");
  CHECK(admin.code == 0);
  CHECK_THAT(admin.out, Catch::Contains("-wait_timeout_ms") && Catch::Contains("-scheduler_port"));
  for (const char* node_only : {"-state_dir", "-heartbeat_interval_ms", "-worker_num", "-steps"}) {
    CHECK_THAT(admin.out, !Catch::Contains(node_only));
  }
  Run node = RunToEnd(dir, {testing::NodeBinary(), "--help"}, "node-help.log");
  CHECK(node.code == 0);
  CHECK_THAT(node.out, Catch::Contains("-state_dir") && Catch::Contains("-scheduler_port"));
  for (const char* other : {"-wait_timeout_ms", "-node_ids", "-scale_out_at"}) {
    CHECK_THAT(node.out, !Catch::Contains(other));
  }
  Run refused = RunToEnd(dir, {testing::AdminBinary(), "--state_dir=/tmp", "status"}, "admin-refused.log");
  CHECK(refused.code == 2);
  CHECK_THAT(refused.out, Catch::Contains("unknown flag --state_dir"));
  // pscore-train: a worker's flags and its own, not a scheduler's, a server's or an admin's.
  const std::string train_bin = std::string(PSCORE_BIN_DIR) + "/pscore-train";
  Run train = RunToEnd(dir, {train_bin, "--help"}, "train-help.log");
  CHECK(train.code == 0);
  for (const char* own : {"-steps", "-scale_out_at", "-heartbeat_interval_ms", "-recovery_timeout_ms", "-node_id",
                          "-launcher", "-scheduler_port", "-tls_ca"}) {
    CHECK_THAT(train.out, Catch::Contains(own));
  }
  for (const char* other : {"-state_dir", "-worker_num", "-update_rule", "-data_dir", "-http_port", "-role",
                            "-wait_timeout_ms", "-node_ids"}) {
    CHECK_THAT(train.out, !Catch::Contains(other));
  }
  Run train_refused = RunToEnd(dir, {train_bin, "--update_rule=sgd", "--scheduler_port=1"}, "train-refused.log");
  CHECK(train_refused.code == 2);
  CHECK_THAT(train_refused.out, Catch::Contains("unknown flag --update_rule"));
}

TEST_CASE("each program's --version prints its name and version and exits 0", "[multiproc]") {
  TempDir dir;
  REQUIRE(dir.ok());
  for (const std::string bin : {"pscore-node", "pscore-admin", "pscore-train"}) {
    Run r = RunToEnd(dir, {std::string(PSCORE_BIN_DIR) + "/" + bin, "--version"}, bin + "-version.log");
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Catch::Matches("(.|\\n)*" + bin + " version [0-9]+\\.[0-9]+\\.[0-9]+(.|\\n)*"));
  }
}

TEST_CASE("SIGTERM while a worker waits for its scheduler ends it at once with exit 1", "[multiproc][net]") {
  TempDir dir;
  REQUIRE(dir.ok());
  // A port bound but not listening: nothing answers there for the whole test.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const int port = ntohs(addr.sin_port);
  for (const std::string role : {"worker", "server"}) {
    Process p;
    REQUIRE(p.Start({testing::NodeBinary(), "--role=" + role, "--scheduler_port=" + std::to_string(port),
                     "--connect_timeout_ms=120000"},
                    dir.File(role + ".log")));
    REQUIRE(p.WaitCatches(SIGTERM, 15s));  // started: its handler is in place
    std::this_thread::sleep_for(300ms);      // and dialling the silent port
    p.Signal(SIGTERM);
    // Far below the 120 s connect timeout the start would otherwise wait out.
    std::optional<int> code = p.Wait(15s);
    REQUIRE(code.has_value());
    CHECK(*code == 1);
    CHECK_THAT(p.Log(), Catch::Contains("signal 15 while starting"));
  }
  ::close(fd);
}

}  // namespace
}  // namespace pscore
