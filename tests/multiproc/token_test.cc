// A job with a cluster token: members and admin with the token work; a node with a
// wrong token is refused and exits 1; admin without it fails; HTTP mutations need the
// token as a bearer token.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "multiproc/process.h"

#include <catch2/catch.hpp>

namespace pscore {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::TempDir;

const std::vector<std::string> kFast = {"--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=1000",
                                        "--auto_finish=false"};

std::string Bin(const std::string& name) { return std::string(PSCORE_BIN_DIR) + "/" + name; }

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

std::vector<std::string> With(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Runs a short command to completion (or kills it at the deadline); returns its exit code.
int RunToEnd(const std::vector<std::string>& argv, const std::string& log, std::string* out) {
  Process p;
  REQUIRE(p.Start(argv, log));
  std::optional<int> code = p.Wait(20s);
  *out = p.Log();
  return code ? *code : -1;
}

// The local addresses ("0100007F:1F90" style, as /proc/net/tcp prints them) of the
// listening TCP sockets on `port`.
std::vector<std::string> ListenAddresses(int port) {
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      size_t colon = local.rfind(':');
      if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) out.push_back(local.substr(0, colon));
    }
  }
  return out;
}

}  // namespace

TEST_CASE("a job with a cluster token admits only holders of the token", "[multiproc][net][auth]") {
  TempDir dir;
  REQUIRE(dir.ok());
  WriteFile(dir.File("token"), "correct horse battery staple\n");
  WriteFile(dir.File("wrong"), "tr0ub4dor\n");
  const std::string tok = "--cluster_token_file=" + dir.File("token");

  Process sched;
  REQUIRE(sched.Start(With({Bin("pscore-node"), "--role=scheduler", "--worker_num=1", "--server_num=1",
                            "--port_file=" + dir.File("port"), "--http_port=0",
                            "--http_port_file=" + dir.File("http"), tok},
                           kFast),
                      dir.File("scheduler.log")));
  int port = testing::ReadPortFile(dir.File("port"), 10s);
  int http = testing::ReadPortFile(dir.File("http"), 10s);
  REQUIRE(port > 0);
  REQUIRE(http > 0);
  const std::string sp = "--scheduler_port=" + std::to_string(port);

  // A stranger with the wrong token is refused and gives up with exit code 1.
  std::string out;
  int code = RunToEnd(With({Bin("pscore-node"), "--role=server", "--node_id=intruder", sp,
                            "--connect_timeout_ms=1500", "--cluster_token_file=" + dir.File("wrong")},
                           kFast),
                      dir.File("intruder.log"), &out);
  CHECK(code == 1);
  CHECK_THAT(out, Catch::Contains("wrong cluster token proof"));

  // The HTTP endpoint listens on 127.0.0.1 only when --http_host is not given.
  CHECK(ListenAddresses(http) == std::vector<std::string>{"0100007F"});

  // The worker finds the token through PSCORE_CLUSTER_TOKEN_FILE instead of the flag.
  Process server, worker;
  REQUIRE(server.Start(With({Bin("pscore-node"), "--role=server", "--node_id=s0", sp, tok}, kFast),
                       dir.File("s0.log")));
  REQUIRE(worker.Start(With({"/usr/bin/env", "PSCORE_CLUSTER_TOKEN_FILE=" + dir.File("token"), Bin("pscore-node"),
                             "--role=worker", "--node_id=w0", sp},
                            kFast),
                       dir.File("w0.log")));

  // Admin with the token sees the job READY with exactly the two members.
  bool ready = false;
  for (auto deadline = std::chrono::steady_clock::now() + 15s; !ready && std::chrono::steady_clock::now() < deadline;) {
    code = RunToEnd({Bin("pscore-admin"), sp, tok, "status"}, dir.File("admin.log"), &out);
    ready = code == 0 && out.find("CLUSTER_READY") != std::string::npos;
    if (!ready) std::this_thread::sleep_for(100ms);
  }
  REQUIRE(ready);
  CHECK(sched.Log().find("intruder") == std::string::npos);  // It never registered.

  // Admin without the token gets nothing.
  code = RunToEnd({Bin("pscore-admin"), sp, "--timeout_ms=1500", "status"}, dir.File("admin2.log"), &out);
  CHECK(code != 0);
  CHECK_THAT(out, Catch::Contains("cluster token"));

  // HTTP: reading is open; mutating needs the bearer token.
  const std::string url = "http://127.0.0.1:" + std::to_string(http);
  code = RunToEnd({"/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", url + "/v1/disable"},
                  dir.File("curl1.log"), &out);
  CHECK(code == 0);
  CHECK(out == "401");
  code = RunToEnd({"/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-H",
                   "Authorization: Bearer tr0ub4dor", url + "/v1/disable"},
                  dir.File("curl1b.log"), &out);
  CHECK(out == "401");
  code = RunToEnd({"/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url + "/v1/cluster"},
                  dir.File("curl2.log"), &out);
  CHECK(out == "200");
  code = RunToEnd({"/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-H",
                   "Authorization: Bearer correct horse battery staple", url + "/v1/stop"},
                  dir.File("curl3.log"), &out);
  CHECK(out == "200");

  // stop ends the job: every process exits 0.
  CHECK(sched.Wait(10s) == std::optional<int>(0));
  CHECK(server.Wait(10s) == std::optional<int>(0));
  CHECK(worker.Wait(10s) == std::optional<int>(0));
}

}  // namespace pscore
