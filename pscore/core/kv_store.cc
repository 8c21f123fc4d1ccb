#include "pscore/core/kv_store.h"

#include <algorithm>

#include <glog/logging.h>

namespace pscore::core {
namespace {

// Deadline now + timeout, saturating instead of overflowing for huge timeouts.
TimePoint DeadlineAfter(TimePoint now, Duration timeout) {
  if (timeout >= TimePoint::max() - now) return TimePoint::max();
  return now + timeout;
}

bool HasPrefix(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

Result<std::string> NormalizeKey(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (char c : key) {
    if (c == '/' && (out.empty() || out.back() == '/')) continue;  // Leading or repeated.
    out.push_back(c);
  }
  if (!out.empty() && out.back() == '/') out.pop_back();
  if (out.empty()) {
    return Status(Code::kInvalidArgument, "kv key '" + std::string(key) + "' is empty");
  }
  if (out.size() > kMaxKeyBytes) {
    return Status(Code::kInvalidArgument, "kv key of " + std::to_string(out.size()) +
                                              " bytes is over the " +
                                              std::to_string(kMaxKeyBytes) + "-byte limit");
  }
  return out;
}

KvStore::KvStore(const Clock* clock, size_t max_value_bytes, uint64_t max_total_bytes, size_t max_entries)
    : clock_(clock),
      max_value_bytes_(max_value_bytes),
      max_total_bytes_(max_total_bytes == 0 ? kMaxKvTotalBytes : std::min(max_total_bytes, kMaxKvTotalBytes)),
      max_entries_(max_entries) {
  CHECK(clock_ != nullptr);
}

Status KvStore::CheckValue(const std::string& key, const std::string& value) const {
  if (value.size() <= max_value_bytes_) return Status::Ok();
  return Status(Code::kInvalidArgument, "kv value for key " + key + " is " +
                                            std::to_string(value.size()) + " bytes, over the " +
                                            std::to_string(max_value_bytes_) + "-byte limit");
}

Status KvStore::Set(const std::string& key, std::string value, bool overwrite) {
  Result<std::string> norm = NormalizeKey(key);
  if (!norm.ok()) return norm.status();
  PSCORE_RETURN_IF_ERROR(CheckValue(*norm, value));
  auto it = entries_.find(*norm);
  if (it != entries_.end() && !overwrite) {
    return Status(Code::kAlreadyExists, "kv key " + *norm + " already exists");
  }
  const uint64_t old_bytes = it == entries_.end() ? 0 : it->first.size() + it->second.size();
  const uint64_t new_bytes = norm->size() + value.size();
  const uint64_t total = total_bytes_ - old_bytes + new_bytes;
  if (total > max_total_bytes_ && new_bytes > old_bytes) {
    return Status(Code::kResourceExhausted, "kv store full: setting " + *norm + " would hold " +
                                                std::to_string(total) + " bytes of keys and values, over the " +
                                                std::to_string(max_total_bytes_) + "-byte cap");
  }
  if (it == entries_.end() && entries_.size() >= max_entries_) {
    return Status(Code::kResourceExhausted, "kv store full: it holds " + std::to_string(entries_.size()) +
                                                " keys, the most it may (a new key " + *norm + " is refused)");
  }
  total_bytes_ = total;
  if (it == entries_.end()) {
    entries_.emplace(*norm, std::move(value));
  } else {
    it->second = std::move(value);
  }
  Answers answers;
  WakeKey(*norm, &answers);
  Deliver(&answers);
  return Status::Ok();
}

uint64_t KvStore::Get(const std::string& key, Duration timeout, GetCallback cb) {
  Result<std::string> norm = NormalizeKey(key);
  if (!norm.ok()) {
    cb(norm.status());
    return 0;
  }
  auto it = entries_.find(*norm);
  if (it != entries_.end()) {
    cb(it->second);
    return 0;
  }
  if (timeout <= Duration::zero()) {
    cb(Status(Code::kTimeout, "kv get " + *norm + " timed out after 0 ms: key not set"));
    return 0;
  }
  uint64_t id = next_waiter_id_++;
  TimePoint deadline = DeadlineAfter(clock_->Now(), timeout);
  waiters_by_key_[*norm].insert(id);
  deadlines_.emplace(deadline, id);
  waiters_.emplace(id, Waiter{std::move(*norm), deadline, timeout, std::move(cb)});
  return id;
}

KvStore::GetCallback KvStore::TakeWaiter(uint64_t id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return nullptr;
  Waiter& w = it->second;
  auto by_key = waiters_by_key_.find(w.key);
  if (by_key != waiters_by_key_.end()) {
    by_key->second.erase(id);
    if (by_key->second.empty()) waiters_by_key_.erase(by_key);
  }
  deadlines_.erase({w.deadline, id});
  GetCallback cb = std::move(w.cb);
  waiters_.erase(it);
  return cb;
}

void KvStore::CancelGet(uint64_t waiter_id) {
  auto it = waiters_.find(waiter_id);
  if (it == waiters_.end()) return;
  std::string key = it->second.key;
  GetCallback cb = TakeWaiter(waiter_id);
  cb(Status(Code::kCancelled, "kv get " + key + " cancelled"));
}

void KvStore::CancelAllGets(const Status& why) {
  CHECK(!why.ok()) << "CancelAllGets needs an error status";
  Answers answers;
  while (!waiters_.empty()) {
    answers.emplace_back(TakeWaiter(waiters_.begin()->first), why);
  }
  Deliver(&answers);
}

void KvStore::WakeKey(const std::string& key, Answers* answers) {
  auto by_key = waiters_by_key_.find(key);
  auto entry = entries_.find(key);
  if (by_key == waiters_by_key_.end() || entry == entries_.end()) return;
  std::vector<uint64_t> ids(by_key->second.begin(), by_key->second.end());
  for (uint64_t id : ids) answers->emplace_back(TakeWaiter(id), entry->second);
}

void KvStore::Deliver(Answers* answers) {
  // State is final before the first callback runs, so callbacks may re-enter the store.
  for (auto& [cb, result] : *answers) cb(std::move(result));
  answers->clear();
}

Result<std::string> KvStore::TryGet(const std::string& key) const {
  Result<std::string_view> view = TryGetView(key);
  if (!view.ok()) return view.status();
  return std::string(*view);
}

Result<std::string_view> KvStore::TryGetView(const std::string& key) const {
  Result<std::string> norm = NormalizeKey(key);
  if (!norm.ok()) return norm.status();
  auto it = entries_.find(*norm);
  if (it == entries_.end()) return Status(Code::kNotFound, "kv key " + *norm + " not found");
  return std::string_view(it->second);
}

KvStore::Entries KvStore::List(const std::string& dir) const {
  Entries out;
  Result<std::string> norm = NormalizeKey(dir);
  // Only a key made of slashes (or nothing) fails to normalise for being empty: the root.
  std::string prefix = norm.ok() ? *norm + "/" : std::string();
  if (!norm.ok() && dir.find_first_not_of('/') != std::string::npos) return out;  // Too long.
  for (auto it = entries_.lower_bound(prefix); it != entries_.end(); ++it) {
    if (!HasPrefix(it->first, prefix)) break;
    out.emplace_back(it->first, it->second);
  }
  return out;
}

void KvStore::Delete(const std::string& key) {
  Result<std::string> norm = NormalizeKey(key);
  if (!norm.ok()) return;
  auto forget = [this](std::map<std::string, std::string>::iterator it) {
    total_bytes_ -= it->first.size() + it->second.size();
    return entries_.erase(it);
  };
  if (auto it = entries_.find(*norm); it != entries_.end()) forget(it);
  // Children sort contiguously after "key/"; siblings like "key!" or "keyc" lie outside.
  std::string prefix = *norm + "/";
  for (auto it = entries_.lower_bound(prefix); it != entries_.end() && HasPrefix(it->first, prefix);) it = forget(it);
}

void KvStore::Tick() {
  TimePoint now = clock_->Now();
  Answers answers;
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    uint64_t id = deadlines_.begin()->second;
    const Waiter& w = waiters_.at(id);
    Status timeout(Code::kTimeout, "kv get " + w.key + " timed out after " +
                                       std::to_string(ToMillis(w.timeout)) +
                                       " ms: key not set");
    answers.emplace_back(TakeWaiter(id), std::move(timeout));
  }
  Deliver(&answers);
}

std::optional<TimePoint> KvStore::NextDeadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

KvStore::Entries KvStore::Snapshot() const {
  return Entries(entries_.begin(), entries_.end());
}

void KvStore::Restore(const Entries& entries) {
  entries_.clear();
  total_bytes_ = 0;
  for (const auto& [key, value] : entries) {
    Result<std::string> norm = NormalizeKey(key);
    Status st = norm.ok() ? CheckValue(*norm, value) : norm.status();
    if (!st.ok()) {
      LOG(WARNING) << "kv restore skips an entry: " << st;
      continue;
    }
    auto [it, added] = entries_.try_emplace(*norm);
    if (!added) total_bytes_ -= it->first.size() + it->second.size();  // a key given twice: the last wins
    it->second = value;
    total_bytes_ += it->first.size() + it->second.size();
  }
  if (total_bytes_ > max_total_bytes_) {
    // Nothing restored is dropped: the cap only refuses Sets that would grow the store.
    LOG(WARNING) << "kv restore holds " << total_bytes_ << " bytes of keys and values, over the " << max_total_bytes_
                 << "-byte cap";
  }
  Answers answers;
  std::vector<std::string> keys;
  for (const auto& [key, ids] : waiters_by_key_) keys.push_back(key);
  for (const std::string& key : keys) WakeKey(key, &answers);
  Deliver(&answers);
}

}  // namespace pscore::core
