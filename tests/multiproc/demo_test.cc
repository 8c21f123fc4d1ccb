// The demo job as a test: the real binaries, as scripts/demo.sh --cpp starts them. One
// pscore-node scheduler (port 0, read back from --port_file), two pscore-node servers
// with the sgd rule, two pscore-train workers; both trainers must exit 0 and end with a
// final line whose loss gap to the generating weights is at most 0.01. Every child is
// killed by pid when the test ends, whatever the outcome.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// One child process; killed (SIGKILL) and reaped by the destructor if still running.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& log_path) {
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
      }
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Waits until the child exits or the deadline passes; returns its exit code, or -1
  // (still running at the deadline) or 128+signal.
  int Wait(Clock::time_point deadline) {
    while (!exited_) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (r < 0 || Clock::now() >= deadline) return -1;
      std::this_thread::sleep_for(20ms);
    }
    return code_;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
};

// A fresh directory for the job's logs and port file (kept when a REQUIRE fails).
struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/pscore-demo-test.XXXXXX";
    path = mkdtemp(tmpl) ? tmpl : "/tmp";
  }
  std::string path;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool FileExecutable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

}  // namespace

TEST_CASE("the demo job (1 scheduler, 2 servers, 2 trainers as processes) converges",
          "[multiproc][net][demo]") {
  const std::string bin = PSCORE_BIN_DIR;
  const std::string node_bin = bin + "/pscore-node";
  const std::string train_bin = bin + "/pscore-train";
  REQUIRE(FileExecutable(node_bin));
  REQUIRE(FileExecutable(train_bin));
  TempDir dir;
  INFO("logs in " << dir.path);
  const auto deadline = Clock::now() + 150s;
  const std::vector<std::string> common = {"--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=3000"};
  auto with_common = [&](std::vector<std::string> v) {
    v.insert(v.end(), common.begin(), common.end());
    return v;
  };

  const std::string port_file = dir.path + "/scheduler.port";
  Child scheduler(with_common({node_bin, "--role=scheduler", "--worker_num=2", "--server_num=2",
                               "--scheduler_port=0", "--port_file=" + port_file}),
                  dir.path + "/scheduler.log");
  REQUIRE(scheduler.pid() > 0);
  std::string port;
  for (;;) {
    port = ReadFile(port_file);
    while (!port.empty() && (port.back() == '\n' || port.back() == ' ')) port.pop_back();
    if (!port.empty()) break;
    REQUIRE(scheduler.Wait(Clock::now()) == -1);  // the scheduler must still be running
    REQUIRE(Clock::now() < deadline);
    std::this_thread::sleep_for(20ms);
  }
  REQUIRE(std::atoi(port.c_str()) > 0);

  std::vector<std::unique_ptr<Child>> servers;
  for (int i = 0; i < 2; ++i) {
    servers.push_back(std::make_unique<Child>(
        with_common({node_bin, "--role=server", "--node_id=server" + std::to_string(i), "--scheduler_port=" + port,
                     "--update_rule=sgd", "--learning_rate=2"}),
        dir.path + "/server" + std::to_string(i) + ".log"));
  }
  std::vector<std::unique_ptr<Child>> trainers;
  for (int i = 0; i < 2; ++i) {
    trainers.push_back(std::make_unique<Child>(
        with_common({train_bin, "--node_id=worker" + std::to_string(i), "--scheduler_port=" + port, "--steps=60"}),
        dir.path + "/worker" + std::to_string(i) + ".log"));
  }

  for (int i = 0; i < 2; ++i) {
    int code = trainers[i]->Wait(deadline);
    std::string log = ReadFile(dir.path + "/worker" + std::to_string(i) + ".log");
    INFO("worker" << i << " log:\n" << log);
    REQUIRE(code == 0);
    // The final line: "worker R final loss L acc A | generating weights w*: ... | gap +G | ...".
    size_t at = log.rfind(" final loss ");
    REQUIRE(at != std::string::npos);
    size_t gap_at = log.find("gap ", at);
    REQUIRE(gap_at != std::string::npos);
    double gap = std::strtod(log.c_str() + gap_at + 4, nullptr);
    CHECK(gap <= 0.01);
  }
  // The job then ends by itself: servers and scheduler leave through the finish barrier.
  for (auto& s : servers) CHECK(s->Wait(deadline) == 0);
  CHECK(scheduler.Wait(deadline) == 0);
  std::error_code ignored;
  std::filesystem::remove_all(dir.path, ignored);  // reached only when no REQUIRE failed
}
