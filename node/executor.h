// Executor: a fixed pool of threads running posted closures in FIFO order.
// Used so user handlers never run on (or delay) the loop thread. Owned by a node;
// Submit from any thread; Shutdown joins (pending closures still run).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pscore::node {

class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();
  void Submit(std::function<void()> fn);
  void Shutdown();

 private:
  void Worker();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

}  // namespace pscore::node
