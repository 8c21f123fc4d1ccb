// ServerJournal: a server's parameter journal on disk (`--data_dir`), so a server killed
// with SIGKILL and restarted with the same directory serves the parameters it had
// acknowledged. Record format and replay rules: pscore/core/param_journal.h.
//
// Files in the directory:
//   params.journal     a compacted state: a kCovers record naming the last segment whose
//                      changes it holds, the push dedup window (a kDedup record, when
//                      the journal has one), then insert records of every entry. Written to
//                      params.journal.tmp, fsync'ed and renamed over, never appended to.
//   params.journal.N   segment N (N >= 1): the changes made after it, one record each,
//                      appended with write(2) before the request is answered.
// Open() replays the compacted file, then every segment above the one it covers, in order
// (a torn last record, from a kill mid-append, is cut). Segments it covers are stale (a kill
// between the rename and their removal) and are removed.
//
// The page cache keeps appended records across a process kill; there is no fsync per
// record, so a machine crash or power loss may lose the newest ones.
//
// Compaction: Open() compacts at once. Later, once the current segment has grown past
// max(compact_floor, 4x the last compacted file), MaybeCompact() starts one in the
// background: under the owner's lock it pins the store's values (ParamStore::ShareValues:
// no copy; a push meanwhile writes a fresh block of its key) and moves appends on to a new
// segment; a thread of the journal's own then writes the pinned values to the temporary
// file, fsyncs it, renames it over the compacted file and removes the segments it covers.
// Nothing is copied on the appenders' side; they wait only if the new segment reaches
// twice the bound before the compaction is done (a disk slower than the pushes), and an
// appender on a loop thread never waits (MaybeCompact's may_wait).
//
// Not thread-safe: the owner serialises Open/Append/MaybeCompact (and orders them with the
// store changes they describe).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "pscore/core/buffer.h"
#include "pscore/core/param_journal.h"
#include "pscore/core/param_store.h"
#include "pscore/core/status.h"

namespace pscore::node {

struct ServerJournalOptions {
  uint64_t compact_floor = 64ull << 20;  // a segment smaller than this is never compacted
  // Tests: runs on the compaction's thread before it writes (to hold a compaction open).
  std::function<void()> before_compaction_write;
};

class ServerJournal {
 public:
  using Options = ServerJournalOptions;

  explicit ServerJournal(std::string dir, Options options = Options());
  // Waits for a compaction in progress (it completes: each of its steps leaves the
  // directory whole).
  ~ServerJournal();
  ServerJournal(const ServerJournal&) = delete;
  ServerJournal& operator=(const ServerJournal&) = delete;

  // Creates the directory if needed, replays what it holds into `store` (which must be
  // empty) and, when given, the push window into `dedup` (kept with every compaction
  // from then on: both must outlive the journal), then compacts. Errors name the file.
  Status Open(core::ParamStore* store, core::PushDedup* dedup = nullptr);
  // Appends one record (the store change it describes is applied by the caller after it;
  // on an error nothing of the record stays and the change must not be applied).
  Status Append(core::JournalOp op, std::string_view body);
  // The same with the record's header made beforehand (core::JournalRecordHeader: its
  // checksum is most of an append's CPU time, and needs no lock).
  Status AppendRecord(std::string_view header, std::string_view body);
  // Once the change is applied: ends a compaction the background has finished, or starts
  // one when the current segment has grown past its bound. With `may_wait` (the default)
  // it waits for a compaction still being written once the new segment has grown past
  // twice the bound; without (an event loop's thread, which must not stall on a disk),
  // the segment grows on until the compaction is done.
  void MaybeCompact(bool may_wait = true);
  // Waits for a compaction in progress and returns how it ended (tests).
  Status FinishCompaction();

  const std::string& path() const { return path_; }  // the compacted file
  std::string segment_path() const { return SegmentPath(segment_); }
  uint64_t bytes() const { return bytes_; }  // of the current segment
  size_t restored_keys() const { return restored_keys_; }
  bool compacting() const { return compactor_.joinable(); }
  uint64_t compactions() const { return compactions_; }  // finished, Open's included

 private:
  // Writes `covers` and the pinned values (one insert record per chunk of keys) to the
  // temporary file, fsyncs it, renames it over the compacted file and removes the
  // segments up to `covers`. *written gets the file's size. Uses only its arguments and
  // the paths, so the compactor thread runs it.
  Status WriteCompacted(uint64_t covers, const std::string& window, const std::vector<uint64_t>& keys,
                        const std::vector<Slice>& values, uint64_t* written) const;
  // Pins every entry of the store and takes the push window (the state as of the current
  // segment's end; `window` empty when there is no window).
  Status PinStore(std::string* window, std::vector<uint64_t>* keys, std::vector<Slice>* values) const;
  // Starts segment `n` (a fresh file with the file header) and appends there from now on.
  Status StartSegment(uint64_t n);
  void RemoveSegmentsUpTo(uint64_t n) const;
  std::string SegmentPath(uint64_t n) const { return path_ + "." + std::to_string(n); }

  std::string dir_;
  std::string path_;
  std::string tmp_;
  Options options_;
  int fd_ = -1;          // the current segment, appended to
  uint64_t segment_ = 0;  // its number
  uint64_t bytes_ = 0;    // its size
  uint64_t compact_at_ = 0;
  size_t restored_keys_ = 0;
  core::ParamStore* store_ = nullptr;
  core::PushDedup* dedup_ = nullptr;
  uint64_t compactions_ = 0;

  // The compaction in the background: started by the owner, run by compactor_, which sets
  // done_ last; its results are read after join().
  std::thread compactor_;
  std::atomic<bool> done_{false};
  Status compacted_status_;
  uint64_t compacted_bytes_ = 0;
};

}  // namespace pscore::node
