#include "pscore/comm/request_tracker.h"

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
  ConnIndex& ix = by_conn_[conn];
  if (ix.ids.size() > 64 && ix.ids.size() > 2 * ix.live) {
    // Mostly completed requests: keep the live ones (ids are unique to one connection).
    ix.ids.erase(std::remove_if(ix.ids.begin(), ix.ids.end(), [this](uint64_t i) { return entries_.count(i) == 0; }),
                 ix.ids.end());
  }
  ix.ids.push_back(id);
  ++ix.live;
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
  if (e.indexed) {
    auto ix = by_conn_.find(e.conn);
    if (ix != by_conn_.end() && --ix->second.live == 0) ix->second.ids.clear();  // capacity kept
  }
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
  auto ix = by_conn_.find(conn);
  if (ix == by_conn_.end()) return 0;
  // Taken out first: a callback may issue requests (on this connection too; those are
  // not failed here, as they were not pending when it closed).
  std::vector<uint64_t> ids = std::move(ix->second.ids);
  by_conn_.erase(ix);
  for (uint64_t id : ids) {
    auto it = entries_.find(id);
    if (it != entries_.end()) it->second.indexed = false;  // its index is gone
  }
  size_t n = 0;
  for (uint64_t id : ids) {  // issue order, so callers see a deterministic sequence
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;  // Completed already, or by a callback meanwhile.
    Entry e = Take(it);
    ++n;
    e.cb(Status(why.code(), What(e) + ": " + why.message()));
  }
  return n;
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
  by_conn_.clear();
  while (!entries_.empty()) {
    Entry e = Take(entries_.begin());
    e.cb(Status(why.code(), What(e) + ": " + why.message()));
  }
}

}  // namespace pscore::comm
