// A disk that refuses writes, for tests of what a server's journal does then: FileSizeLimit
// holds every file of this process under a size (RLIMIT_FSIZE, with SIGXFSZ ignored, so a
// write past it fails with EFBIG as a full disk fails with ENOSPC). Process-wide: only for
// tests that write no other file while it lives. Include before Catch.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace pscore::testing {

class FileSizeLimit {
 public:
  explicit FileSizeLimit(uint64_t bytes) {
    if (::getrlimit(RLIMIT_FSIZE, &saved_) != 0 || ::sigaction(SIGXFSZ, nullptr, &saved_action_) != 0) return;
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    rlimit limit = saved_;
    limit.rlim_cur = std::min<rlim_t>(bytes, saved_.rlim_max);
    if (::sigaction(SIGXFSZ, &ignore, nullptr) != 0) return;
    set_ = true;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &limit) == 0;
  }
  ~FileSizeLimit() { Lift(); }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

  bool ok() const { return ok_; }
  // Files may grow again (the disk has room).
  void Lift() {
    if (!set_) return;
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::sigaction(SIGXFSZ, &saved_action_, nullptr);
    set_ = false;
  }

 private:
  rlimit saved_ = {};
  struct sigaction saved_action_ = {};
  bool set_ = false;
  bool ok_ = false;
};

// The size of the newest segment (params.journal.N, N highest) of the journal in `dir`;
// 0 when there is none.
inline uint64_t NewestSegmentBytes(const std::string& dir) {
  uint64_t bytes = 0;
  for (int n = 1; n < 1000; ++n) {
    struct stat st;
    if (::stat((dir + "/params.journal." + std::to_string(n)).c_str(), &st) == 0) {
      bytes = static_cast<uint64_t>(st.st_size);
    }
  }
  return bytes;
}

}  // namespace pscore::testing
