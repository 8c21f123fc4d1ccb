#include "comm/request_tracker.h"

#include <algorithm>
#include <functional>
#include <vector>

namespace pscore::comm {

std::string RequestTracker::What(const Entry& e) const {
  if (describe_) return describe_(e.conn, e.cmd);
  return "request " + std::to_string(e.cmd) + " on connection " + std::to_string(e.conn);
}

uint64_t RequestTracker::Add(ConnId conn, TimePoint deadline, int cmd, ResponseCallback cb, AnswerSink sink) {
  uint64_t id = next_id_++;
  entries_.emplace(id, Entry{conn, deadline, cmd, std::move(cb), sink});
  PushDeadline(deadline, id);
  return id;
}

char* RequestTracker::TakeSink(uint64_t id, ConnId conn, uint64_t tail) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  Entry& e = it->second;
  if (e.sink.dst == nullptr || e.sink_taken || e.conn != conn || e.sink.len != tail) return nullptr;
  e.sink_taken = true;
  return e.sink.dst;
}

void RequestTracker::PushDeadline(TimePoint t, uint64_t id) {
  if (deadlines_.size() > 64 && deadlines_.size() > 2 * entries_.size()) {
    // Mostly completed requests: rebuild from the live ones.
    deadlines_.clear();
    for (auto& [live_id, e] : entries_) {
      if (live_id != id) deadlines_.emplace_back(e.deadline, live_id);
    }
    std::make_heap(deadlines_.begin(), deadlines_.end(), std::greater<Deadline>());
  }
  deadlines_.emplace_back(t, id);
  std::push_heap(deadlines_.begin(), deadlines_.end(), std::greater<Deadline>());
}

RequestTracker::Entry RequestTracker::Take(std::unordered_map<uint64_t, Entry>::iterator it) {
  const uint64_t id = it->first;
  Entry e = std::move(it->second);
  entries_.erase(it);
  if (e.sink_taken && on_sink_release_) on_sink_release_(e.conn, id);
  return e;
}

bool RequestTracker::Complete(uint64_t id, Result<Frame> result) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  Take(it).cb(std::move(result));  // taken first: the callback may add requests
  return true;
}

bool RequestTracker::CompleteFrom(ConnId conn, uint64_t id, Result<Frame> result) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.conn != conn) return false;
  Take(it).cb(std::move(result));
  return true;
}

size_t RequestTracker::FailConnection(ConnId conn, const Status& why) {
  // Rare (a lost peer), so a scan beats keeping a per-connection index on every request.
  std::vector<uint64_t> ids;
  for (auto& [id, e] : entries_) {
    if (e.conn == conn) ids.push_back(id);
  }
  // Fail in issue order so callers see a deterministic sequence.
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;  // A callback completed it meanwhile.
    Entry e = Take(it);
    e.cb(Status(why.code(), What(e) + ": " + why.message()));
  }
  return ids.size();
}

size_t RequestTracker::Expire(TimePoint now) {
  size_t n = 0;
  while (!deadlines_.empty() && deadlines_.front().first <= now) {
    uint64_t id = deadlines_.front().second;
    std::pop_heap(deadlines_.begin(), deadlines_.end(), std::greater<Deadline>());
    deadlines_.pop_back();
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;  // Completed already: a stale slot.
    Entry e = Take(it);
    ++n;
    e.cb(Status(Code::kTimeout, What(e) + ": no answer before the deadline"));
  }
  return n;
}

void RequestTracker::FailAll(const Status& why) {
  deadlines_.clear();
  while (!entries_.empty()) {
    Entry e = Take(entries_.begin());
    e.cb(Status(why.code(), What(e) + ": " + why.message()));
  }
}

}  // namespace pscore::comm
