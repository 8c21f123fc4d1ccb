// Executor: a fixed pool of threads, each with its own FIFO queue. Work submitted with
// the same affinity key runs on the same thread, in submission order; the server uses
// the connection id, so one worker's requests are handled in the order sent (a Pull
// issued after a Push sees it). Owned by a node; Submit from any thread; Shutdown joins
// (closures already queued still run).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pscore::node {

class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();
  void Submit(uint64_t affinity, std::function<void()> fn);
  void Shutdown();

 private:
  struct Lane {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;
    bool stopping = false;
    std::thread thread;
  };
  static void Run(Lane* lane);
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::mutex shutdown_mu_;
  bool shut_down_ = false;
};

}  // namespace pscore::node
