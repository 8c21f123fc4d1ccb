// Node callbacks run on the loop thread, which never takes the GIL: they queue here and
// Python reads them with next_event().
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "binding.h"
#include "pscore/node/common/node.h"

namespace pscore::python {

// Any thread; bounded (the oldest of 10,000 goes first).
struct EventQueue {
  std::mutex mu;
  std::condition_variable cv;
  struct Ev {
    std::string kind, from, payload;
    uint32_t event = 0;
    int code = 0;
  };
  std::deque<Ev> q;
  void Put(Ev e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (q.size() >= 10000) q.pop_front();
      q.push_back(std::move(e));
    }
    cv.notify_all();
  }
};

// Callbacks that queue user events, cluster events and the fatal end into q.
node::Node::Callbacks QueueCallbacks(const std::shared_ptr<EventQueue>& q);

// The next event as a dict (kind, source, event, payload, code), or None after `timeout`
// seconds. GIL held; released while waiting.
py::object NextEvent(EventQueue& q, double timeout);

}  // namespace pscore::python
