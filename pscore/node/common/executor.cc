#include "pscore/node/common/executor.h"

namespace pscore::node {

namespace {
thread_local const void* t_lane = nullptr;  // the lane whose thread this is, if any
}  // namespace

Executor::Executor(int threads) {
  for (int i = 0; i < threads; ++i) {
    lanes_.push_back(std::make_shared<Lane>());
    std::shared_ptr<Lane> lane = lanes_.back();
    lane->thread = std::thread([lane] { Run(lane); });
  }
}

bool Executor::ReleaseCallingLane() {
  for (auto& lane : lanes_) {
    if (lane.get() != t_lane) continue;
    std::lock_guard<std::mutex> lock(lane->mu);
    lane->released = true;
    lane->queue.clear();  // nothing more runs there: the node is stopping
    return true;
  }
  return false;
}

Executor::~Executor() { Shutdown(); }

void Executor::Submit(uint64_t affinity, std::function<void()> fn) {
  if (lanes_.empty()) return;
  Lane& lane = *lanes_[affinity % lanes_.size()];
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    if (lane.stopping) return;
    lane.queue.push_back(std::move(fn));
  }
  lane.cv.notify_one();
}

void Executor::Shutdown() {
  std::lock_guard<std::mutex> guard(shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& lane : lanes_) {
    {
      std::lock_guard<std::mutex> lock(lane->mu);
      lane->stopping = true;
    }
    lane->cv.notify_all();
  }
  for (auto& lane : lanes_) {
    if (!lane->thread.joinable()) continue;
    bool released;
    {
      std::lock_guard<std::mutex> lock(lane->mu);
      released = lane->released;
    }
    if (released) {
      lane->thread.detach();  // ends after the task that released it (it holds the lane)
    } else if (lane->thread.get_id() != std::this_thread::get_id()) {
      lane->thread.join();
    }
  }
}

void Executor::Run(std::shared_ptr<Lane> lane) {
  t_lane = lane.get();
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(lane->mu);
      lane->cv.wait(lock, [lane] { return lane->stopping || !lane->queue.empty(); });
      if (lane->queue.empty()) return;
      fn = std::move(lane->queue.front());
      lane->queue.pop_front();
    }
    fn();
  }
}

}  // namespace pscore::node
