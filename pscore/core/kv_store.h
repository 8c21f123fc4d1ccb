// KvStore: the scheduler's coordination key-value store, with blocking Get.
// Owned by the scheduler node; not thread-safe: call every method from the scheduler's loop
// thread. Callbacks run synchronously inside the call that answers them (Set, Get, Tick, ...),
// after the store's state is updated, so a callback may call back into the store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pscore/core/clock.h"
#include "pscore/core/status.h"

namespace pscore::core {

// Longest key accepted after normalisation; keys travel in control messages and are held in
// memory for the job's life, so they stay small.
inline constexpr size_t kMaxKeyBytes = 4096;

// The most bytes of keys and values any store holds, whatever it is configured with: the
// state file (pscore/core/state_file.h) is sized so a store this full, framed, always fits.
inline constexpr uint64_t kMaxKvTotalBytes = uint64_t{1} << 30;

// Normalises a '/'-separated key: repeated slashes collapse to one, leading and trailing
// slashes are dropped ("//a//b/" -> "a/b"). A key that is empty after that, or longer than
// kMaxKeyBytes, is kInvalidArgument. Components are taken literally ("." and ".." are names).
Result<std::string> NormalizeKey(std::string_view key);

class KvStore {
 public:
  // Answers a Get: the value, or why there is none. Called exactly once per Get.
  using GetCallback = std::function<void(Result<std::string>)>;
  using Entries = std::vector<std::pair<std::string, std::string>>;

  // At most this many keys by default: what a state file may hold (kMaxStateKvEntries),
  // so a scheduler can always load the state it wrote.
  static constexpr size_t kDefaultMaxEntries = size_t{1} << 20;

  // clock must outlive the store. Values longer than max_value_bytes are refused, and so
  // is a Set that would take the keys and values stored past max_total_bytes (0, or more
  // than kMaxKvTotalBytes: kMaxKvTotalBytes), or add a key past max_entries.
  KvStore(const Clock* clock, size_t max_value_bytes, uint64_t max_total_bytes = 0,
          size_t max_entries = kDefaultMaxEntries);
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Stores value under key. An existing key without overwrite is kAlreadyExists and keeps its
  // old value; a value over the bound or a bad key is kInvalidArgument; a store that would
  // grow past max_total_bytes, or a new key past max_entries, is kResourceExhausted (the
  // old value is kept). Wakes every Get
  // waiting on the key.
  [[nodiscard]] Status Set(const std::string& key, std::string value, bool overwrite);

  // Answers at once if the key exists (or the key is invalid, or timeout <= 0); otherwise waits
  // until a Set of the key or the deadline (kTimeout naming the key). Returns a waiter id for
  // CancelGet, or 0 if answered at once.
  uint64_t Get(const std::string& key, Duration timeout, GetCallback cb);
  // Answers a waiting Get with kCancelled (e.g. its connection closed). Unknown id: no-op.
  void CancelGet(uint64_t waiter_id);
  // Answers every waiting Get with `why` (which must not be OK), e.g. on shutdown.
  void CancelAllGets(const Status& why);

  // The value, or kNotFound at once (kInvalidArgument for a bad key).
  Result<std::string> TryGet(const std::string& key) const;
  // The same without a copy: the view holds until the store next changes.
  Result<std::string_view> TryGetView(const std::string& key) const;
  // Every key strictly under dir/ (recursively), sorted bytewise. "" or "/" lists everything.
  Entries List(const std::string& dir) const;
  // Removes key and everything under key/ ("a/b" keeps "a/bc"). Missing or invalid key: no-op.
  void Delete(const std::string& key);

  // Answers with kTimeout every waiting Get whose deadline is at or before now.
  void Tick();
  // Earliest deadline of a waiting Get, so the owner can arm one timer instead of polling.
  std::optional<TimePoint> NextDeadline() const;

  size_t size() const { return entries_.size(); }
  // Bytes of keys and values stored (what max_total_bytes bounds).
  uint64_t total_bytes() const { return total_bytes_; }
  // The cap in force (kMaxKvTotalBytes at most).
  uint64_t max_total_bytes() const { return max_total_bytes_; }
  size_t waiting() const { return waiters_.size(); }

  // For persistence: all entries, sorted; Restore replaces the contents with them (entries
  // with a bad key or an oversized value are skipped with a warning; a total over the cap is
  // kept, with a warning, and only Sets that shrink it pass) and wakes waiting Gets.
  Entries Snapshot() const;
  void Restore(const Entries& entries);

 private:
  struct Waiter {
    std::string key;
    TimePoint deadline;
    Duration timeout;
    GetCallback cb;
  };
  using Answers = std::vector<std::pair<GetCallback, Result<std::string>>>;

  Status CheckValue(const std::string& key, const std::string& value) const;
  // Removes the waiter from every index and returns its callback.
  GetCallback TakeWaiter(uint64_t id);
  // Moves every waiter on key (oldest first) into answers, with the key's current value.
  void WakeKey(const std::string& key, Answers* answers);
  static void Deliver(Answers* answers);

  const Clock* clock_;
  size_t max_value_bytes_;
  uint64_t max_total_bytes_;
  size_t max_entries_;
  uint64_t total_bytes_ = 0;  // sum of key and value sizes in entries_
  std::map<std::string, std::string> entries_;  // Ordered, so List is a range scan.
  std::unordered_map<uint64_t, Waiter> waiters_;
  std::map<std::string, std::set<uint64_t>> waiters_by_key_;  // Ids ascend: oldest first.
  std::set<std::pair<TimePoint, uint64_t>> deadlines_;
  uint64_t next_waiter_id_ = 1;
};

}  // namespace pscore::core
