// ServerJournal: a server's parameter journal on disk (`--data_dir`), so a server killed
// with SIGKILL and restarted with the same directory serves the parameters it had
// acknowledged. Format and replay rules: core/param_journal.h.
//
// Every change is appended (write(2), whole record, before the request is answered); the
// page cache keeps it across a process kill. There is no fsync per record, so a machine
// crash or power loss may lose the newest records. Open() replays the file, cuts a torn
// tail, and rewrites the journal compactly (one insert record per chunk of entries, written
// to a temporary file, fsync'ed and renamed); MaybeCompact() does the same once the file
// has grown past max(64 MiB, 4x its size after the last compaction).
//
// Not thread-safe: the owner serialises Open/Append (and orders them with the store
// changes they describe).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/param_journal.h"
#include "core/param_store.h"
#include "core/status.h"

namespace pscore::node {

class ServerJournal {
 public:
  explicit ServerJournal(std::string dir);
  ~ServerJournal();
  ServerJournal(const ServerJournal&) = delete;
  ServerJournal& operator=(const ServerJournal&) = delete;

  // Creates the directory if needed, replays an existing journal into `store` (which
  // must be empty), then compacts. Errors name the file.
  Status Open(core::ParamStore* store);
  // Appends one record (the store change it describes is applied by the caller after it;
  // on an error nothing of the record stays and the change must not be applied).
  Status Append(core::JournalOp op, std::string_view body);
  // The same with the record's header made beforehand (core::JournalRecordHeader: its
  // checksum is most of an append's CPU time, and needs no lock).
  Status AppendRecord(std::string_view header, std::string_view body);
  // Once the change is applied: compacts when the journal has grown past its bound.
  void MaybeCompact();

  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }
  size_t restored_keys() const { return restored_keys_; }

 private:
  Status Compact();
  Status WriteAll(int fd, std::string_view a, std::string_view b);

  std::string dir_;
  std::string path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  uint64_t compact_at_ = 0;
  size_t restored_keys_ = 0;
  core::ParamStore* store_ = nullptr;
};

}  // namespace pscore::node
