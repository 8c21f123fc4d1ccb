// A server's and a worker's /metrics (--http_port): the real pscore-node binaries on
// loopback, read over a raw socket.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "multiproc/process.h"

#include <catch2/catch.hpp>

namespace pscore {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::TempDir;

// One GET over a fresh connection (Connection: close), read to EOF; "" on any failure.
std::string HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      const auto deadline = std::chrono::steady_clock::now() + 5s;
      char buf[4096];
      while (std::chrono::steady_clock::now() < deadline) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        out.append(buf, static_cast<size_t>(n));
      }
    }
  }
  ::close(fd);
  return out;
}

std::string Body(const std::string& answer) {
  size_t at = answer.find("\r\n\r\n");
  return at == std::string::npos ? "" : answer.substr(at + 4);
}

// Every line is a HELP, a TYPE or a sample of the text format 0.0.4.
bool ValidText(const std::string& body) {
  const std::regex help(R"(# HELP [a-zA-Z_:][a-zA-Z0-9_:]* \S.*)");
  const std::regex type(R"(# TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (counter|gauge))");
  const std::regex sample(
      R"([a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*\})? [0-9]+)");
  std::istringstream in(body);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    if (!std::regex_match(line, help) && !std::regex_match(line, type) && !std::regex_match(line, sample)) {
      UNSCOPED_INFO("bad line: " << line);
      return false;
    }
  }
  return lines > 0 && body.back() == '\n';
}

TEST_CASE("a server and a worker started with --http_port serve their /metrics", "[multiproc][net]") {
  TempDir dir;
  REQUIRE(dir.ok());
  const std::vector<std::string> beat = {"--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=2000"};
  std::vector<std::string> args = {testing::NodeBinary(), "--role=scheduler", "--server_num=1", "--worker_num=1",
                                   "--port_file=" + dir.File("sched.port")};
  args.insert(args.end(), beat.begin(), beat.end());
  Process sched, server, worker;
  REQUIRE(sched.Start(args, dir.File("scheduler.log")));
  const int port = testing::ReadPortFile(dir.File("sched.port"), 10s);
  REQUIRE(port > 0);
  auto member = [&](Process& p, const std::string& role) {
    std::vector<std::string> a = {testing::NodeBinary(), "--role=" + role, "--node_id=" + role + "0",
                                  "--scheduler_port=" + std::to_string(port), "--auto_finish=false",
                                  "--http_port=0", "--http_port_file=" + dir.File(role + ".http")};
    a.insert(a.end(), beat.begin(), beat.end());
    REQUIRE(p.Start(a, dir.File(role + ".log")));
  };
  member(server, "server");
  member(worker, "worker");
  for (const std::string role : {"server", "worker"}) {
    INFO(role);
    const int http = testing::ReadPortFile(dir.File(role + ".http"), 15s);
    REQUIRE(http > 0);
    // READY comes with the metadata; the scrape sees it before the deadline.
    std::string body;
    const auto deadline = std::chrono::steady_clock::now() + 15s;
    while (std::chrono::steady_clock::now() < deadline) {
      body = Body(HttpGet(http, "/metrics"));
      if (body.find("pscore_cluster_state{state=\"CLUSTER_READY\"} 1") != std::string::npos) break;
      std::this_thread::sleep_for(50ms);
    }
    INFO(body);
    CHECK(body.find("pscore_cluster_state{state=\"CLUSTER_READY\"} 1") != std::string::npos);
    CHECK(body.find("pscore_member_info{role=\"" + role + "\",node_id=\"" + role + "0\"} 1") != std::string::npos);
    CHECK(body.find("pscore_member_rank 0") != std::string::npos);
    CHECK(body.find("pscore_messages_total{direction=\"out\",cmd=\"REGISTER\"} 1") != std::string::npos);
    CHECK(body.find("pscore_wire_bytes_total{direction=\"in\"}") != std::string::npos);
    CHECK(ValidText(body));
    // promtool (Debian package prometheus), where installed, checks the format and its lint.
    if (::access("/usr/bin/promtool", X_OK) == 0) {
      const std::string file = dir.File(role + ".metrics");
      { std::ofstream(file) << body; }
      Process promtool;
      REQUIRE(promtool.Start({"/bin/sh", "-c", "exec /usr/bin/promtool check metrics < " + file},
                             dir.File(role + ".promtool")));
      std::optional<int> code = promtool.Wait(30s);
      INFO(promtool.Log());
      CHECK(code == std::optional<int>(0));
    }
    if (role == "worker") CHECK(body.find("pscore_worker_direct_pulls_total") != std::string::npos);
    if (role == "server") CHECK(body.find("pscore_server_journal_errors_total 0") != std::string::npos);
    const std::string other = HttpGet(http, "/v1/cluster");
    CHECK(other.rfind("HTTP/1.1 404", 0) == 0);
  }
  server.Kill();
  worker.Kill();
  sched.Kill();
}

}  // namespace
}  // namespace pscore
