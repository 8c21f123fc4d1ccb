// A blocking raw TCP client for multi-process tests that play a hostile or hand-made peer
// (closed at destruction), and a reader of a child process's memory figures.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "pscore/comm/frame.h"
#include "pscore/proto/comm.pb.h"
#include "multiproc/process.h"

namespace pscore::testing {

// A field of /proc/PID/status in KiB ("VmRSS:", "VmSize:"); -1 when the process is gone.
inline int64_t StatusKb(pid_t pid, const std::string& field) {
  const std::string status = ReadFile("/proc/" + std::to_string(pid) + "/status");
  const size_t at = status.find(field);
  if (at == std::string::npos) return -1;
  return std::stoll(status.substr(at + field.size()));
}

class RawConn {
  using Clock = std::chrono::steady_clock;

 public:
  explicit RawConn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawConn() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;
  bool ok() const { return fd_ >= 0; }

  bool Send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;  // the peer may close while we write: that is an answer too
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads until the peer closes (true) or the deadline passes (false); *got collects bytes.
  bool ReadUntilClosed(std::chrono::milliseconds timeout, std::string* got = nullptr) {
    const auto deadline = Clock::now() + timeout;
    char buf[4096];
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      if (::poll(&p, 1, std::max(left, 1)) <= 0) continue;
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;  // EOF or reset
      if (got != nullptr) got->append(buf, static_cast<size_t>(n));
    }
    return false;
  }
  // Reads exactly n bytes with a deadline.
  bool ReadExact(size_t n, std::string* out, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    out->clear();
    while (out->size() < n && Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      ssize_t r = ::recv(fd_, buf, std::min(sizeof(buf), n - out->size()), 0);
      if (r <= 0) return false;
      out->append(buf, static_cast<size_t>(r));
    }
    return out->size() == n;
  }
  // Reads one frame's meta (the payload is skipped); nullopt on close or timeout.
  std::optional<pb::MessageMeta> ReadMeta(std::chrono::milliseconds timeout) {
    std::string header;
    if (!ReadExact(comm::kHeaderBytes, &header, timeout)) return std::nullopt;
    comm::FrameHeader h = comm::LoadHeader(header.data());
    if (h.magic != comm::kMagic || h.meta_len > comm::kMaxMetaBytes || h.data_len > (1u << 20)) return std::nullopt;
    std::string meta, data;
    if (!ReadExact(h.meta_len, &meta, timeout) || !ReadExact(h.data_len, &data, timeout)) return std::nullopt;
    pb::MessageMeta m;
    if (!m.ParseFromString(meta)) return std::nullopt;
    return m;
  }

 private:
  int fd_ = -1;
};

}  // namespace pscore::testing
