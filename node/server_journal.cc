#include "node/server_journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <glog/logging.h>

#include "core/kv_codec.h"

namespace pscore::node {
namespace {

constexpr uint64_t kCompactFloor = 64ull << 20;
constexpr size_t kChunkBytes = 32u << 20;  // values per insert record when compacting

Status Errno(const std::string& what) { return Status(Code::kInternal, what + ": " + std::strerror(errno)); }

Status MakeDirs(const std::string& dir) {
  std::string partial;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') partial = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) return Errno("mkdir " + partial);
  }
  return Status::Ok();
}

}  // namespace

ServerJournal::ServerJournal(std::string dir) : dir_(std::move(dir)), path_(dir_ + "/params.journal") {}

ServerJournal::~ServerJournal() {
  if (fd_ >= 0) ::close(fd_);
}

Status ServerJournal::WriteAll(int fd, std::string_view a, std::string_view b) {
  iovec iov[2] = {{const_cast<char*>(a.data()), a.size()}, {const_cast<char*>(b.data()), b.size()}};
  int first = 0;
  while (first < 2) {
    ssize_t n = ::writev(fd, iov + first, 2 - first);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write " + path_);
    }
    size_t left = static_cast<size_t>(n);
    while (first < 2 && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (first < 2) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return Status::Ok();
}

Status ServerJournal::Open(core::ParamStore* store) {
  store_ = store;
  PSCORE_RETURN_IF_ERROR(MakeDirs(dir_));
  std::ifstream in(path_, std::ios::binary);
  if (in) {
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Result<core::ParsedJournal> parsed = core::ParseJournal(bytes);
    if (!parsed.ok()) return Status(parsed.status().code(), path_ + ": " + parsed.status().message());
    if (parsed->valid_bytes < bytes.size()) {
      LOG(WARNING) << path_ << ": cut a torn last record (" << bytes.size() - parsed->valid_bytes
                   << " bytes; a process killed while appending it, never acknowledged)";
    }
    Status st = core::ReplayJournal(parsed->records, store);
    if (!st.ok()) return Status(st.code(), path_ + ": " + st.message());
    restored_keys_ = store->num_keys();
    LOG(INFO) << path_ << ": replayed " << parsed->records.size() << " records, " << restored_keys_ << " keys";
  }
  return Compact();
}

// Writes the store's entries as insert records to a new file, then renames it over the
// journal: a crash at any point leaves either the old journal or the new one.
Status ServerJournal::Compact() {
  const std::string tmp = path_ + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open " + tmp);
  auto fail = [&](Status st) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  };
  uint64_t written = core::kJournalFileHeaderBytes;
  Status st = WriteAll(fd, core::JournalFileHeader(), {});
  if (!st.ok()) return fail(st);
  // Every entry (rank -1 owns nothing), in key order, without erasing.
  auto entries = store_->ExtractNotOwned(-1, 1, /*erase=*/false);
  for (size_t begin = 0; begin < entries.size();) {
    std::vector<uint64_t> keys;
    std::vector<uint32_t> lens;
    std::vector<float> values;
    size_t bytes = 0;
    size_t end = begin;
    for (; end < entries.size() && (end == begin || bytes < kChunkBytes); ++end) {
      keys.push_back(entries[end].first);
      lens.push_back(static_cast<uint32_t>(entries[end].second.size()));
      values.insert(values.end(), entries[end].second.begin(), entries[end].second.end());
      bytes += entries[end].second.size() * sizeof(float);
    }
    BufferPtr body = core::EncodeKvPairs(keys.data(), keys.size(), lens.data(), values.data(), values.size());
    std::string_view b(body->data(), body->size());
    st = WriteAll(fd, core::JournalRecordHeader(core::JournalOp::kInsert, b), b);
    if (!st.ok()) return fail(st);
    written += core::kJournalRecordHeaderBytes + b.size();
    begin = end;
  }
  if (::fsync(fd) != 0) return fail(Errno("fsync " + tmp));
  ::close(fd);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Errno("rename " + tmp);
  }
  int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) return Errno("open " + path_);
  bytes_ = written;
  compact_at_ = std::max(kCompactFloor, 4 * written);
  return Status::Ok();
}

Status ServerJournal::Append(core::JournalOp op, std::string_view body) {
  return AppendRecord(core::JournalRecordHeader(op, body), body);
}

Status ServerJournal::AppendRecord(std::string_view header, std::string_view body) {
  if (fd_ < 0) return Status(Code::kFailedPrecondition, "journal " + path_ + " is not open");
  Status st = WriteAll(fd_, header, body);
  if (!st.ok()) {
    // Part of the record may be on disk: cut it, so later records stay readable.
    if (::ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) {
      LOG(ERROR) << "cannot cut a failed append off " << path_ << ": " << std::strerror(errno);
    }
    return st;
  }
  bytes_ += header.size() + body.size();
  return Status::Ok();
}

void ServerJournal::MaybeCompact() {
  if (bytes_ <= compact_at_) return;
  Status st = Compact();
  if (!st.ok()) LOG(WARNING) << "journal compaction failed (appending continues): " << st;
}

}  // namespace pscore::node
