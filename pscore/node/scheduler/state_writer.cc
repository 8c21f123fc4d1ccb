#include "pscore/node/scheduler/state_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <glog/logging.h>

namespace pscore::node {
namespace {

Status Errno(const std::string& what, const std::string& path) {
  return Status(Code::kUnavailable, what + " " + path + ": " + std::strerror(errno));
}

std::string DirOf(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

Status WriteAll(int fd, const std::string& bytes, const std::string& path) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("write", path);
    off += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status FsyncPath(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Errno("open", path);
  int rc = ::fsync(fd);
  Status st = rc == 0 ? Status::Ok() : Errno("fsync", path);
  ::close(fd);
  return st;
}

}  // namespace

std::string StateFilePath(const std::string& state_dir) { return state_dir + "/scheduler.state"; }

Result<std::string> ReadStateFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status(Code::kNotFound, "no state file " + path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return Errno("cannot open", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Errno("cannot read", path);
  return ss.str();
}

StateWriter::StateWriter(std::string path) : path_(std::move(path)) {}

StateWriter::~StateWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status StateWriter::Start() {
  std::error_code ec;
  std::filesystem::create_directories(DirOf(path_), ec);
  if (ec) return Status(Code::kUnavailable, "cannot create state directory " + DirOf(path_) + ": " + ec.message());
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

uint64_t StateWriter::Submit(std::string bytes) {
  uint64_t number = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = std::move(bytes);  // An older pending snapshot is dropped: this one supersedes it.
    number = submitted_.fetch_add(1) + 1;
    pending_number_ = number;
    busy_.store(true);
  }
  cv_.notify_all();
  return number;
}

Status StateWriter::Flush(Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return !pending_ && !writing_; })) {
    return Status(Code::kTimeout, "state file " + path_ + " not written within " +
                                      std::to_string(ToMillis(timeout)) + " ms");
  }
  return Status::Ok();
}

// Drains what is pending even after stop_, so the last snapshot of a clean shutdown lands.
void StateWriter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || pending_.has_value(); });
    if (!pending_) return;  // stop_ and nothing left
    std::string bytes = std::move(*pending_);
    const uint64_t number = pending_number_;
    pending_.reset();
    writing_ = true;
    lock.unlock();
    Status st = WriteAtomically(bytes);
    if (st.ok()) {
      writes_.fetch_add(1);
    } else {
      // Tried again at every scheduler tick while the disk refuses: a line every 10 s.
      const uint64_t failures = failures_.fetch_add(1) + 1;
      LOG_EVERY_T(ERROR, 10.0) << "scheduler state not persisted: " << st << " (" << failures
                               << " writes failed so far; answers do not wait for it)";
    }
    written_through_.store(number);
    if (on_written_) on_written_();
    lock.lock();
    writing_ = false;
    if (!pending_) busy_.store(false);
    cv_.notify_all();
  }
}

Status StateWriter::WriteAtomically(const std::string& bytes) const {
  const std::string tmp = path_ + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", tmp);
  Status st = WriteAll(fd, bytes, tmp);
  if (st.ok() && ::fsync(fd) != 0) st = Errno("fsync", tmp);
  if (::close(fd) != 0 && st.ok()) st = Errno("close", tmp);
  if (st.ok() && std::rename(tmp.c_str(), path_.c_str()) != 0) st = Errno("rename to", path_);
  // The rename is durable only once the directory entry is.
  if (st.ok()) st = FsyncPath(DirOf(path_), O_RDONLY | O_DIRECTORY);
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

}  // namespace pscore::node
