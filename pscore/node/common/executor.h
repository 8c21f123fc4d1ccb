// Executor: a fixed pool of threads, each with its own FIFO queue. Work submitted with
// the same affinity key runs on the same thread, in submission order; the server uses
// the connection id, so one worker's requests are handled in the order sent (a Pull
// issued after a Push sees it). Owned by a node; Submit from any thread; Shutdown joins
// (closures already queued still run), except a lane released by its own task.
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
  // Called from a task of this executor that is about to wait for its Shutdown (a handler
  // that stops its node): that lane's queued tasks are dropped, and Shutdown lets its
  // thread finish the task and end on its own instead of joining it (which would deadlock).
  // False if the calling thread is not one of this executor's.
  bool ReleaseCallingLane();

 private:
  struct Lane {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;
    bool stopping = false;
    bool released = false;  // its thread is detached at Shutdown
    std::thread thread;
  };
  // The thread keeps its lane alive: a released one may outlive the executor.
  static void Run(std::shared_ptr<Lane> lane);
  std::vector<std::shared_ptr<Lane>> lanes_;
  std::mutex shutdown_mu_;
  bool shut_down_ = false;
};

}  // namespace pscore::node
