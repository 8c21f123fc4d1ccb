// Test-only helpers for multi-process tests: a child process started with fork/exec
// whose stdout and stderr go to a log file, killed by pid and reaped in the destructor
// (so a failing test leaves no process behind); a temporary directory; reading a
// --port_file with a deadline. With PSCORE_TEST_TLS=1 our binaries are started with TLS
// (test_tls.h). Used from the test thread only.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "multiproc/test_tls.h"

namespace pscore::testing {

// The pscore-node and pscore-admin binaries of this build tree.
inline std::string NodeBinary() { return std::string(PSCORE_BIN_DIR) + "/pscore-node"; }
inline std::string AdminBinary() { return std::string(PSCORE_BIN_DIR) + "/pscore-admin"; }

// A fresh directory under $TMPDIR (or /tmp), removed with its content at destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/pscore-mp-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  // Removed with everything in it, unless PSCORE_KEEP_TEST_DIRS is set (to read the logs
  // of a failed run).
  ~TempDir() {
    if (path_.empty() || std::getenv("PSCORE_KEEP_TEST_DIRS") != nullptr) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Waits until `path` holds a port number (written atomically by --port_file); 0 on timeout.
inline int ReadPortFile(const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

// One child process. Not copyable; the destructor SIGKILLs it (if still running) and reaps it.
class Process {
 public:
  Process() = default;
  ~Process() { Kill(); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Starts argv[0] with argv; stdout and stderr are appended to log_path. False if fork fails.
  // In the TLS pass (test_tls.h) our binaries get the TLS flags of their identity.
  bool Start(const std::vector<std::string>& argv_in, const std::string& log_path) {
    log_path_ = log_path;
    const std::vector<std::string> argv = WithTestTls(argv_in);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    pid_ = pid;
    exited_ = false;
    return true;
  }

  pid_t pid() const { return pid_; }
  bool running() {
    Poll();
    return pid_ > 0 && !exited_;
  }
  void Signal(int sig) {
    if (running()) ::kill(pid_, sig);
  }
  // Waits for the exit with a deadline; the exit code (128 + signal if killed), or
  // nullopt if the process is still running at the deadline.
  std::optional<int> Wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      Poll();
      if (exited_) return exit_code_;
      if (pid_ <= 0 || std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // SIGKILL and reap (bounded). Idempotent.
  void Kill() {
    if (pid_ <= 0 || exited_) return;
    ::kill(pid_, SIGKILL);
    Wait(std::chrono::seconds(10));
  }
  std::string Log() const { return ReadFile(log_path_); }
  // Waits until the process has a handler for `sig` (the SigCgt mask of /proc/<pid>/status),
  // so that a signal sent next reaches the program and not the default action. False at
  // the deadline or once the process has exited.
  bool WaitCatches(int sig, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const unsigned long long bit = 1ULL << (sig - 1);
    while (running() && std::chrono::steady_clock::now() < deadline) {
      std::istringstream status(ReadFile("/proc/" + std::to_string(pid_) + "/status"));
      for (std::string line; std::getline(status, line);) {
        if (line.rfind("SigCgt:", 0) == 0 && (std::stoull(line.substr(7), nullptr, 16) & bit) != 0) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

 private:
  void Poll() {
    if (pid_ <= 0 || exited_) return;
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r != pid_) return;
    exited_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  pid_t pid_ = -1;
  bool exited_ = true;
  int exit_code_ = -1;
  std::string log_path_;
};

}  // namespace pscore::testing
