// RequestTracker: request_id -> pending callback, with a deadline per request.
// Pure bookkeeping (no I/O): the Messenger feeds it completions, connection losses and
// the time. Every callback runs exactly once: answer, deadline, lost peer or shutdown.
// Loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "pscore/comm/frame_decoder.h"
#include "pscore/comm/transport_types.h"
#include "pscore/core/clock.h"
#include "pscore/core/status.h"

namespace pscore::comm {

using ResponseCallback = std::function<void(Result<Frame>)>;

// Memory a request's answer may be read into: when the answer's payload comes as a head
// plus a tail of exactly `len` bytes (payload_head), the tail is written to dst as it
// arrives and the answer's Frame holds only the head (tail_bytes = len). dst must stay
// valid until the request's callback runs; nothing is written there after that.
struct AnswerSink {
  char* dst = nullptr;
  uint64_t len = 0;
};

class RequestTracker {
 public:
  // Names a request in error messages ("SEND_DATA to 127.0.0.1:4000"); called only when
  // a request fails, so the hot path builds no strings.
  using Describer = std::function<std::string(ConnId conn, int cmd)>;
  RequestTracker() = default;
  explicit RequestTracker(Describer describe) : describe_(std::move(describe)) {}

  // Registers a request; returns its id (never 0, never reused).
  uint64_t Add(ConnId conn, TimePoint deadline, int cmd, ResponseCallback cb, AnswerSink sink = {});
  // The sink of pending request `id` for a tail of `tail` bytes arriving on `conn`: once
  // per request, only on its own connection and only for exactly its length; else null.
  char* TakeSink(uint64_t id, ConnId conn, uint64_t tail);
  // Runs, before the callback, for every request whose sink was taken (the owner stops
  // whatever may still be writing into it).
  void set_on_sink_release(std::function<void(ConnId, uint64_t id)> fn) { on_sink_release_ = std::move(fn); }
  // Completes request `id` with `result`. False if it is unknown (late or duplicate answer).
  bool Complete(uint64_t id, Result<Frame> result);
  // The same for an answer that arrived on `conn`: false, and the request left pending,
  // if `id` went out on another connection (a peer may not answer another's request).
  bool CompleteFrom(ConnId conn, uint64_t id, Result<Frame> result);
  // Fails every request pending on `conn` with `why`, in issue order; returns how many.
  // Costs O(requests of that connection), whatever else is pending, so closing N
  // connections at once costs O(total requests), not O(N x total). Also forgets `conn`.
  size_t FailConnection(ConnId conn, const Status& why);
  // Fails every request whose deadline is at or before `now`.
  size_t Expire(TimePoint now);
  // Fails everything (shutdown).
  void FailAll(const Status& why);
  size_t pending() const { return entries_.size(); }
  // Connections with an index (tests: FailConnection forgets them).
  size_t connections_indexed() const { return by_conn_.size(); }

 private:
  struct Entry {
    ConnId conn;
    TimePoint deadline;
    int cmd;
    ResponseCallback cb;
    AnswerSink sink;
    bool sink_taken = false;
    bool indexed = true;  // counted in by_conn_[conn].live
  };
  // Deadlines in a min-heap with lazy deletion: a completed request's slot stays until
  // it reaches the top (or the heap is rebuilt), so adding and completing a request
  // allocate nothing but the map node. Rebuilt when more than half of it is stale.
  using Deadline = std::pair<TimePoint, uint64_t>;
  std::unordered_map<uint64_t, Entry> entries_;
  std::vector<Deadline> deadlines_;
  // The ids issued on each connection, in issue order, with lazy deletion as for the
  // heap: a completed id stays until the list is compacted (when over half of it is
  // stale) or emptied (when its last live request ends). The list of a connection is
  // kept while it is open (no allocation per request), dropped by FailConnection.
  struct ConnIndex {
    std::vector<uint64_t> ids;
    size_t live = 0;
  };
  std::unordered_map<ConnId, ConnIndex> by_conn_;
  void PushDeadline(TimePoint t, uint64_t id);
  uint64_t next_id_ = 1;
  Describer describe_;
  std::function<void(ConnId, uint64_t)> on_sink_release_;
  std::string What(const Entry& e) const;

  Entry Take(std::unordered_map<uint64_t, Entry>::iterator it);
};

}  // namespace pscore::comm
