#include "comm/request_tracker.h"

#include <algorithm>
#include <vector>

namespace pscore::comm {

std::string RequestTracker::What(const Entry& e) const {
  if (describe_) return describe_(e.conn, e.cmd);
  return "request " + std::to_string(e.cmd) + " on connection " + std::to_string(e.conn);
}

uint64_t RequestTracker::Add(ConnId conn, TimePoint deadline, int cmd, ResponseCallback cb) {
  uint64_t id = next_id_++;
  auto by_deadline = deadlines_.emplace(deadline, id);
  entries_.emplace(id, Entry{conn, deadline, cmd, std::move(cb), by_deadline});
  by_conn_.emplace(conn, id);
  return id;
}

RequestTracker::Entry RequestTracker::Take(std::unordered_map<uint64_t, Entry>::iterator it) {
  Entry e = std::move(it->second);
  uint64_t id = it->first;
  entries_.erase(it);
  deadlines_.erase(e.by_deadline);
  auto range = by_conn_.equal_range(e.conn);
  for (auto c = range.first; c != range.second; ++c) {
    if (c->second == id) {
      by_conn_.erase(c);
      break;
    }
  }
  return e;
}

bool RequestTracker::Complete(uint64_t id, Result<Frame> result) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  Entry e = Take(it);
  e.cb(std::move(result));
  return true;
}

size_t RequestTracker::FailConnection(ConnId conn, const Status& why) {
  std::vector<uint64_t> ids;
  auto range = by_conn_.equal_range(conn);
  for (auto c = range.first; c != range.second; ++c) ids.push_back(c->second);
  // Fail in issue order so callers see a deterministic sequence.
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;
    Entry e = Take(it);
    e.cb(Status(why.code(), What(e) + ": " + why.message()));
  }
  return ids.size();
}

size_t RequestTracker::Expire(TimePoint now) {
  size_t n = 0;
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    auto it = entries_.find(deadlines_.begin()->second);
    Entry e = Take(it);
    ++n;
    e.cb(Status(Code::kTimeout, What(e) + ": no answer before the deadline"));
  }
  return n;
}

void RequestTracker::FailAll(const Status& why) {
  while (!entries_.empty()) {
    Entry e = Take(entries_.begin());
    e.cb(Status(why.code(), What(e) + ": " + why.message()));
  }
}

}  // namespace pscore::comm
