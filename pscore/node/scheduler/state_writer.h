// StateWriter: writes the scheduler's state file off the loop thread. Submit() hands over
// a serialized snapshot and returns at once; one writer thread writes it as temp file +
// fsync + rename + fsync of the directory, so a crash leaves either the old or the new
// file, never a mix. Snapshots submitted while a write runs coalesce: only the newest
// pending one is written. Owned by the SchedulerNode; Submit/idle/stats from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "pscore/core/clock.h"
#include "pscore/core/status.h"

namespace pscore::node {

// The state file inside a --state_dir.
std::string StateFilePath(const std::string& state_dir);

// Reads a whole file: its bytes, kNotFound when it does not exist, kUnavailable when it
// cannot be read. The message names the file.
Result<std::string> ReadStateFile(const std::string& path);

class StateWriter {
 public:
  // path: the state file; its directory is created if missing (errors surface at Start).
  explicit StateWriter(std::string path);
  // Writes what is still pending, then stops the thread.
  ~StateWriter();
  StateWriter(const StateWriter&) = delete;
  StateWriter& operator=(const StateWriter&) = delete;

  // Called on the writer thread after each write (done or failed), e.g. to wake the loop
  // for answers that wait until their change is on disk. Set before Start.
  void SetOnWritten(std::function<void()> cb) { on_written_ = std::move(cb); }
  // Creates the directory and starts the thread.
  Status Start();
  // Replaces the pending snapshot (if any) with bytes. Never blocks on disk. Returns the
  // snapshot's number (1, 2, ...).
  uint64_t Submit(std::string bytes);
  // Number of the newest snapshot submitted, and of the newest one whose write ended (every
  // earlier one was written then too, or superseded by it).
  uint64_t submitted() const { return submitted_.load(); }
  uint64_t written_through() const { return written_through_.load(); }
  // True when nothing is pending or being written.
  bool idle() const { return !busy_.load(); }
  // Waits until every submitted snapshot is written (or failed); kTimeout otherwise.
  Status Flush(Duration timeout);
  uint64_t writes() const { return writes_.load(); }
  uint64_t failures() const { return failures_.load(); }
  const std::string& path() const { return path_; }

 private:
  void Run();
  Status WriteAtomically(const std::string& bytes) const;

  const std::string path_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::string> pending_;  // guarded by mu_
  bool writing_ = false;                // guarded by mu_
  bool stop_ = false;                   // guarded by mu_
  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> submitted_{0};
  std::atomic<uint64_t> written_through_{0};
  uint64_t pending_number_ = 0;  // guarded by mu_
  std::function<void()> on_written_;
  std::atomic<uint64_t> failures_{0};
  std::thread thread_;
};

}  // namespace pscore::node
