#include "pscore/node/server/server_journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <glog/logging.h>

#include "pscore/core/kv_codec.h"

namespace pscore::node {
namespace {

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

// Writes a then b to fd, whole; `name` is the file's, for the error.
Status WriteFd(int fd, const std::string& name, std::string_view a, std::string_view b) {
  iovec iov[2] = {{const_cast<char*>(a.data()), a.size()}, {const_cast<char*>(b.data()), b.size()}};
  int first = 0;
  while (first < 2) {
    ssize_t n = ::writev(fd, iov + first, 2 - first);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write " + name);
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

// The numbers N of the files "<base>.N" in dir, ascending.
std::vector<uint64_t> ListSegments(const std::string& dir, const std::string& base) {
  std::vector<uint64_t> out;
  const std::string prefix = base.substr(base.rfind('/') + 1) + ".";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.size() > prefix.size() + 19 || name.compare(0, prefix.size(), prefix) != 0) {
      continue;
    }
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    out.push_back(std::stoull(digits));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// Reads and parses one journal file (found: false when it does not exist). A torn last
// record is cut with a log line; damage is an error naming the file. A segment may be
// shorter than the file header: killed right after it was created, it holds no record.
Status ReadJournalFile(const std::string& path, bool segment, std::string* bytes, core::ParsedJournal* parsed,
                       bool* found) {
  std::ifstream in(path, std::ios::binary);
  *found = static_cast<bool>(in);
  if (!*found) return Status::Ok();
  bytes->assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (segment && bytes->size() < core::kJournalFileHeaderBytes &&
      core::JournalFileHeader().compare(0, bytes->size(), *bytes) == 0) {
    LOG(WARNING) << path << ": a segment cut short in its header (" << bytes->size()
                 << " bytes; a process killed as it was created): no records";
    return Status::Ok();
  }
  Result<core::ParsedJournal> p = core::ParseJournal(*bytes);
  if (!p.ok()) return Status(p.status().code(), path + ": " + p.status().message());
  if (p->valid_bytes < bytes->size()) {
    LOG(WARNING) << path << ": cut a torn last record (" << bytes->size() - p->valid_bytes
                 << " bytes; a process killed while appending it, never acknowledged)";
  }
  *parsed = std::move(*p);
  return Status::Ok();
}

}  // namespace

ServerJournal::ServerJournal(std::string dir, Options options)
    : dir_(std::move(dir)), path_(dir_ + "/params.journal"), tmp_(path_ + ".tmp"), options_(options) {}

ServerJournal::~ServerJournal() {
  if (compactor_.joinable()) compactor_.join();
  if (fd_ >= 0) ::close(fd_);
}

Status ServerJournal::Open(core::ParamStore* store, core::PushDedup* dedup) {
  store_ = store;
  dedup_ = dedup;
  PSCORE_RETURN_IF_ERROR(MakeDirs(dir_));
  // The compacted file, then the segments after the last one it covers, in order.
  uint64_t covers = 0;
  size_t records = 0;
  {
    std::string bytes;
    core::ParsedJournal parsed;
    bool found = false;
    PSCORE_RETURN_IF_ERROR(ReadJournalFile(path_, /*segment=*/false, &bytes, &parsed, &found));
    if (found && !parsed.records.empty() && parsed.records[0].op == core::JournalOp::kCovers) {
      Result<uint64_t> c = core::DecodeJournalCovers(parsed.records[0].body);
      if (!c.ok()) return Status(c.status().code(), path_ + ": " + c.status().message());
      covers = *c;
    }
    Status st = core::ReplayJournal(parsed.records, store, dedup);
    if (!st.ok()) return Status(st.code(), path_ + ": " + st.message());
    records += parsed.records.size();
  }
  uint64_t last = covers;
  for (uint64_t n : ListSegments(dir_, path_)) {
    last = std::max(last, n);
    if (n <= covers) continue;  // already in the compacted file
    std::string bytes;
    core::ParsedJournal parsed;
    bool found = false;
    PSCORE_RETURN_IF_ERROR(ReadJournalFile(SegmentPath(n), /*segment=*/true, &bytes, &parsed, &found));
    Status st = core::ReplayJournal(parsed.records, store, dedup);
    if (!st.ok()) return Status(st.code(), SegmentPath(n) + ": " + st.message());
    records += parsed.records.size();
  }
  restored_keys_ = store->num_keys();
  if (records > 0) LOG(INFO) << path_ << ": replayed " << records << " records, " << restored_keys_ << " keys";
  // Compacted at once: everything replayed goes into one file covering `last`.
  std::string window;
  std::vector<uint64_t> keys;
  std::vector<Slice> values;
  PSCORE_RETURN_IF_ERROR(PinStore(&window, &keys, &values));
  uint64_t written = 0;
  PSCORE_RETURN_IF_ERROR(WriteCompacted(last, window, keys, values, &written));
  compact_at_ = std::max(options_.compact_floor, 4 * written);
  ++compactions_;
  return StartSegment(last + 1);
}

Status ServerJournal::PinStore(std::string* window, std::vector<uint64_t>* keys, std::vector<Slice>* values) const {
  window->clear();
  if (dedup_ != nullptr && dedup_->writers() > 0) *window = dedup_->Encode();
  *keys = store_->Keys();
  std::sort(keys->begin(), keys->end());
  values->assign(keys->size(), Slice{});
  // Keys in runs are copied (cheap, and they stay in their runs); blocks are pinned.
  return store_->ShareOrCopyValues(keys->data(), keys->size(), values->data());
}

Status ServerJournal::StartSegment(uint64_t n) {
  const std::string path = SegmentPath(n);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open " + path);
  Status st = WriteFd(fd, path, core::JournalFileHeader(), {});
  if (!st.ok()) {
    ::close(fd);
    ::unlink(path.c_str());
    return st;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  segment_ = n;
  bytes_ = core::kJournalFileHeaderBytes;
  return Status::Ok();
}

void ServerJournal::RemoveSegmentsUpTo(uint64_t n) const {
  for (uint64_t s : ListSegments(dir_, path_)) {
    if (s <= n && ::unlink(SegmentPath(s).c_str()) != 0 && errno != ENOENT) {
      LOG(WARNING) << "cannot remove " << SegmentPath(s) << " (a restart skips it): " << std::strerror(errno);
    }
  }
}

// A crash before the rename leaves the old compacted file and every segment; one after it,
// the new file and the segments after `covers` (those up to it are skipped by Open).
Status ServerJournal::WriteCompacted(uint64_t covers, const std::string& window, const std::vector<uint64_t>& keys,
                                     const std::vector<Slice>& values, uint64_t* written) const {
  int fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open " + tmp_);
  auto fail = [&](Status st) {
    ::close(fd);
    ::unlink(tmp_.c_str());
    return st;
  };
  Status st = WriteFd(fd, tmp_, core::JournalFileHeader(), {});
  const std::string mark = core::EncodeJournalCovers(covers);
  if (st.ok()) st = WriteFd(fd, tmp_, core::JournalRecordHeader(core::JournalOp::kCovers, mark), mark);
  if (st.ok() && !window.empty()) {
    st = WriteFd(fd, tmp_, core::JournalRecordHeader(core::JournalOp::kDedup, window), window);
  }
  if (!st.ok()) return fail(st);
  uint64_t n = core::kJournalFileHeaderBytes + core::kJournalRecordHeaderBytes + mark.size();
  if (!window.empty()) n += core::kJournalRecordHeaderBytes + window.size();
  // The pinned values, a chunk of keys per insert record, written from where they are.
  for (size_t begin = 0; begin < keys.size();) {
    std::vector<uint32_t> lens;
    std::vector<Slice> tail;
    size_t bytes = 0;
    size_t end = begin;
    for (; end < keys.size() && (end == begin || bytes < kChunkBytes); ++end) {
      lens.push_back(static_cast<uint32_t>(values[end].size / sizeof(float)));
      tail.push_back(values[end]);
      bytes += values[end].size;
    }
    Result<Payload> body = core::EncodeKvPairsShared(keys.data() + begin, end - begin, lens.data(), std::move(tail));
    if (!body.ok()) return fail(body.status());
    st = WriteFd(fd, tmp_, core::JournalRecordHeader(core::JournalOp::kInsert, *body),
                 std::string_view(body->head->data(), body->head->size()));
    for (size_t i = 0; st.ok() && i < body->tail.size(); ++i) {
      st = WriteFd(fd, tmp_, std::string_view(body->tail[i].data, body->tail[i].size), {});
    }
    if (!st.ok()) return fail(st);
    n += core::kJournalRecordHeaderBytes + body->size();
    begin = end;
  }
  if (::fsync(fd) != 0) return fail(Errno("fsync " + tmp_));
  if (::close(fd) != 0) {
    ::unlink(tmp_.c_str());
    return Errno("close " + tmp_);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp_.c_str());
    return Errno("rename " + tmp_);
  }
  int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  RemoveSegmentsUpTo(covers);
  *written = n;
  return Status::Ok();
}

Status ServerJournal::Append(core::JournalOp op, std::string_view body) {
  return AppendRecord(core::JournalRecordHeader(op, body), body);
}

Status ServerJournal::AppendRecord(std::string_view header, std::string_view body) {
  if (fd_ < 0) return Status(Code::kFailedPrecondition, "journal " + path_ + " is not open");
  Status st = WriteFd(fd_, SegmentPath(segment_), header, body);
  if (!st.ok()) {
    // Part of the record may be on disk: cut it, so later records stay readable.
    if (::ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) {
      LOG(ERROR) << "cannot cut a failed append off " << SegmentPath(segment_) << ": " << std::strerror(errno);
    }
    return st;
  }
  bytes_ += header.size() + body.size();
  return Status::Ok();
}

void ServerJournal::MaybeCompact(bool may_wait) {
  if (compactor_.joinable()) {
    // Still writing: appends go on, until the new segment reaches twice the bound (a disk
    // slower than the pushes); then they wait for it, so the files stay bounded, unless
    // they must not wait.
    if (!done_.load(std::memory_order_acquire) && (!may_wait || bytes_ <= 2 * compact_at_)) return;
    Status st = FinishCompaction();
    if (!st.ok()) LOG(WARNING) << "journal compaction failed (appending continues): " << st;
    return;
  }
  if (bytes_ <= compact_at_) return;
  // The state as of this segment's end (the owner's lock keeps store and journal in step):
  // pinned, not copied; appends move on to the next segment.
  std::string window;
  std::vector<uint64_t> keys;
  std::vector<Slice> values;
  Status st = PinStore(&window, &keys, &values);
  if (st.ok()) st = StartSegment(segment_ + 1);
  if (!st.ok()) {
    LOG(WARNING) << "journal compaction not started (appending continues): " << st;
    compact_at_ = bytes_ + options_.compact_floor;
    return;
  }
  const uint64_t covers = segment_ - 1;
  done_.store(false, std::memory_order_relaxed);
  compactor_ = std::thread([this, covers, window = std::move(window), keys = std::move(keys),
                            values = std::move(values)]() mutable {
    if (options_.before_compaction_write) options_.before_compaction_write();
    uint64_t written = 0;
    compacted_status_ = WriteCompacted(covers, window, keys, values, &written);
    compacted_bytes_ = written;
    values.clear();  // the store's blocks are free again
    done_.store(true, std::memory_order_release);
  });
}

Status ServerJournal::FinishCompaction() {
  if (!compactor_.joinable()) return Status::Ok();
  compactor_.join();
  if (compacted_status_.ok()) {
    compact_at_ = std::max(options_.compact_floor, 4 * compacted_bytes_);
    ++compactions_;
  } else {
    compact_at_ = bytes_ + options_.compact_floor;  // tried again after another floor's worth
  }
  return compacted_status_;
}

}  // namespace pscore::node
