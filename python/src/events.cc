#include "events.h"

#include <algorithm>

namespace pscore::python {

node::Node::Callbacks QueueCallbacks(const std::shared_ptr<EventQueue>& q) {
  node::Node::Callbacks cb;
  cb.on_user_event = [q](const std::string& from, uint32_t event, const std::string& payload) {
    q->Put({"user", from, payload, event, 0});
  };
  cb.on_cluster_event = [q](const pb::ClusterEventMessage& ev) {
    q->Put({"cluster", ev.node_id(), ev.message(), static_cast<uint32_t>(ev.kind()), ev.error_code()});
  };
  cb.on_fatal = [q](const Status& st) { q->Put({"fatal", "", st.message(), 0, static_cast<int>(st.code())}); };
  return cb;
}

py::object NextEvent(EventQueue& q, double timeout) {
  auto deadline = std::chrono::steady_clock::now() + Seconds(timeout);
  for (;;) {
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lock(q.mu);
      auto until = std::min(deadline, std::chrono::steady_clock::now() + kSlice);
      q.cv.wait_until(lock, until, [&] { return !q.q.empty(); });
      if (!q.q.empty()) {
        EventQueue::Ev e = std::move(q.q.front());
        q.q.pop_front();
        lock.unlock();
        py::gil_scoped_acquire gil;
        py::dict d;
        d["kind"] = e.kind;
        d["source"] = e.from;
        d["event"] = e.event;
        d["payload"] = py::bytes(e.payload);
        d["code"] = e.code;
        return std::move(d);
      }
    }
    CheckSignals();
    if (std::chrono::steady_clock::now() >= deadline) return py::none();
  }
}

}  // namespace pscore::python
