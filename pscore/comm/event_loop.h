// EventLoop: one libuv loop on one thread of its own.
// Any thread may Post closures; timers and every handle of the loop are touched only on
// its thread. Stop() runs the registered stop hooks (which close their handles), lets
// libuv finish the close callbacks and joins the thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pscore/core/clock.h"
#include "pscore/core/status.h"

struct uv_loop_s;

namespace pscore::comm {

using TimerId = uint64_t;

class EventLoop {
 public:
  explicit EventLoop(std::string name = "loop");
  ~EventLoop();  // Stops the loop if it is still running.
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Starts the loop thread. Posts made before Start run once it starts.
  Status Start();
  // Any thread but the loop's own. Idempotent. Returns kInternal if handles leaked
  // (uv_loop_close failed), which tests assert never happens.
  Status Stop();

  // Any thread. fn runs on the loop thread during a later iteration, in posting order.
  // Returns false, fn destroyed unrun, when the loop is stopping or stopped (a closure
  // posted before Stop still runs, ahead of the stop hooks).
  bool Post(std::function<void()> fn);
  // Runs fn now when called on the loop thread, else posts it. False as for Post.
  bool Run(std::function<void()> fn);
  // Runs fn on the loop thread and waits for it (at once when already there, or when the
  // loop is not running). When the loop is stopping, fn does not run: its stop hooks
  // clean up instead. Never call it from a callback that the loop thread waits on.
  void RunAndWait(const std::function<void()>& fn);
  // True on the loop thread, and on any thread while the loop is not running (code that
  // must run on the loop may then run inline).
  bool InLoopThread() const;
  // True only on the thread of the running loop: where a blocking call would deadlock.
  // One read of running_ (InLoopThread() answers true once Stop has cleared it).
  bool OnRunningLoop() const {
    return running_ && std::this_thread::get_id() == loop_thread_id_.load();
  }
  bool running() const { return running_; }

  // Loop thread only. One-shot or repeating (period > 0) timers.
  TimerId AddTimer(Duration delay, Duration period, std::function<void()> fn);
  void CancelTimer(TimerId id);

  // Loop thread only. Hooks run at Stop() (in reverse order of registration) so owners
  // close their handles; RemoveStopHook when the owner closes itself earlier.
  uint64_t AddStopHook(std::function<void()> fn);
  void RemoveStopHook(uint64_t id);

  // Loop thread only. fn runs once at the end of the current iteration (before polling
  // for I/O again). Used to coalesce writes issued in one iteration into one writev.
  void RunBeforePoll(std::function<void()> fn);

  // Loop thread only. The loop polls for I/O without sleeping until at least `d` from now
  // (windows overlap: the latest end counts), then sleeps in the poll again. Waking a
  // sleeping thread costs tens of microseconds on some machines (a halted virtual CPU);
  // a polling loop sees the next frame or post at once, at the price of a core meanwhile.
  void SpinFor(Duration d);
  // Loop thread only: a SpinFor window is open.
  bool spinning() const;

  uv_loop_s* uv_loop() { return loop_.get(); }
  const std::string& name() const { return name_; }

 private:
  struct Impl;
  void ThreadMain();
  void Drain();
  void OnStop();
  void RunQueuedBeforePoll();

  std::string name_;
  std::unique_ptr<uv_loop_s> loop_;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  // Read by any thread (Run, InLoopThread, running) while Start or Stop writes them.
  std::atomic<std::thread::id> loop_thread_id_{};
  std::atomic<bool> running_{false};
  bool stopped_ = false;
  Status close_status_;

  std::mutex post_mu_;
  std::vector<std::function<void()>> posted_;
  bool stopping_ = false;  // guarded by post_mu_

  // Loop-thread state.
  std::map<uint64_t, std::function<void()>> stop_hooks_;
  uint64_t next_hook_id_ = 1;
  std::vector<std::function<void()>> before_poll_;
  TimerId next_timer_id_ = 1;
};

}  // namespace pscore::comm
