#include "pscore/comm/event_loop.h"

#include <pthread.h>
#include <signal.h>
#include <uv.h>

#include <algorithm>
#include <future>

#include "pscore/comm/uv_status.h"

namespace pscore::comm {

// A timer owns its uv_timer_t; freed in the close callback.
struct LoopTimer {
  uv_timer_t handle;
  TimerId id;
  std::function<void()> fn;
  bool repeating;
};

struct EventLoop::Impl {
  uv_async_t wakeup;
  uv_prepare_t prepare;  // runs before_poll_ callbacks queued by timers
  uv_check_t check;      // runs before_poll_ callbacks queued by I/O callbacks
  std::map<TimerId, LoopTimer*> timers;
  uv_idle_t spin;  // active while a SpinFor window is open: the poll does not block
  uint64_t spin_until_ns = 0;  // uv_hrtime() at which the window closes
};

EventLoop::EventLoop(std::string name)
    : name_(std::move(name)), loop_(new uv_loop_t), impl_(new Impl) {
  CHECK_EQ(uv_loop_init(loop_.get()), 0);
  loop_->data = this;
  impl_->wakeup.data = this;
  CHECK_EQ(uv_async_init(loop_.get(), &impl_->wakeup,
                         [](uv_async_t* h) { static_cast<EventLoop*>(h->data)->Drain(); }),
           0);
  impl_->prepare.data = this;
  CHECK_EQ(uv_prepare_init(loop_.get(), &impl_->prepare), 0);
  impl_->check.data = this;
  CHECK_EQ(uv_check_init(loop_.get(), &impl_->check), 0);
  impl_->spin.data = this;
  CHECK_EQ(uv_idle_init(loop_.get(), &impl_->spin), 0);
}

EventLoop::~EventLoop() {
  if (!stopped_) Stop().IgnoreError();
}

Status EventLoop::Start() {
  CHECK(!running_ && !stopped_) << "EventLoop " << name_ << " started twice";
  running_ = true;
  std::promise<void> started;
  thread_ = std::thread([this, &started] {
    // A write to a connection whose peer is gone must fail with EPIPE, not raise SIGPIPE
    // (whose default kills the process): blocked on this thread, it stays pending here. An
    // embedding program need not ignore SIGPIPE itself.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    loop_thread_id_ = std::this_thread::get_id();
    started.set_value();
    ThreadMain();
  });
  started.get_future().wait();
  return Status::Ok();
}

void EventLoop::ThreadMain() {
  Drain();  // Posts made before Start.
  uv_run(loop_.get(), UV_RUN_DEFAULT);
}

bool EventLoop::InLoopThread() const {
  return !running_ || std::this_thread::get_id() == loop_thread_id_;
}

bool EventLoop::Post(std::function<void()> fn) {
  // The wake-up is sent under post_mu_: Stop marks stopping_ under it before the loop
  // closes the async handle, so a send never reaches a closed handle (libuv aborts there).
  std::lock_guard<std::mutex> lock(post_mu_);
  if (stopping_) return false;  // The loop is gone or going: the closure would never run.
  posted_.push_back(std::move(fn));
  uv_async_send(&impl_->wakeup);  // May coalesce with earlier sends; Drain takes all.
  return true;
}

bool EventLoop::Run(std::function<void()> fn) {
  if (OnRunningLoop()) {
    fn();
    return true;
  }
  return Post(std::move(fn));
}

void EventLoop::RunAndWait(const std::function<void()>& fn) {
  if (!running_ || InLoopThread()) {
    fn();
    return;
  }
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    if (stopping_) return;
    posted_.push_back([&fn, done] {
      fn();
      done->set_value();
    });
    uv_async_send(&impl_->wakeup);  // under post_mu_, as in Post
  }
  fut.wait();
}

void EventLoop::Drain() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    batch.swap(posted_);
  }
  for (auto& fn : batch) fn();
}

TimerId EventLoop::AddTimer(Duration delay, Duration period, std::function<void()> fn) {
  DCHECK(InLoopThread());
  auto* t = new LoopTimer{};
  t->id = next_timer_id_++;
  t->fn = std::move(fn);
  t->repeating = period.count() > 0;
  t->handle.data = t;
  CHECK_EQ(uv_timer_init(loop_.get(), &t->handle), 0);
  impl_->timers[t->id] = t;
  uint64_t delay_ms = std::max<int64_t>(0, ToMillis(delay));
  uint64_t period_ms = t->repeating ? std::max<int64_t>(1, ToMillis(period)) : 0;
  uv_timer_start(&t->handle, [](uv_timer_t* h) {
    auto* timer = static_cast<LoopTimer*>(h->data);
    auto* loop = static_cast<EventLoop*>(h->loop->data);
    TimerId id = timer->id;
    if (!timer->repeating) {
      std::function<void()> fn = std::move(timer->fn);
      loop->CancelTimer(id);
      fn();
      return;
    }
    timer->fn();  // May cancel itself: CancelTimer defers the free to the close callback.
  }, delay_ms, period_ms);
  return t->id;
}

void EventLoop::CancelTimer(TimerId id) {
  DCHECK(InLoopThread());
  auto it = impl_->timers.find(id);
  if (it == impl_->timers.end()) return;
  LoopTimer* t = it->second;
  impl_->timers.erase(it);
  uv_timer_stop(&t->handle);
  uv_close(reinterpret_cast<uv_handle_t*>(&t->handle),
           [](uv_handle_t* h) { delete static_cast<LoopTimer*>(h->data); });
}

uint64_t EventLoop::AddStopHook(std::function<void()> fn) {
  DCHECK(InLoopThread());
  stop_hooks_[next_hook_id_] = std::move(fn);
  return next_hook_id_++;
}

void EventLoop::RemoveStopHook(uint64_t id) {
  DCHECK(InLoopThread());
  stop_hooks_.erase(id);
}

void EventLoop::RunBeforePoll(std::function<void()> fn) {
  DCHECK(InLoopThread());
  if (before_poll_.empty()) {
    uv_prepare_start(&impl_->prepare, [](uv_prepare_t* h) {
      static_cast<EventLoop*>(h->data)->RunQueuedBeforePoll();
    });
    uv_check_start(&impl_->check, [](uv_check_t* h) {
      static_cast<EventLoop*>(h->data)->RunQueuedBeforePoll();
    });
  }
  before_poll_.push_back(std::move(fn));
}

void EventLoop::SpinFor(Duration d) {
  DCHECK(InLoopThread());
  auto* handle = reinterpret_cast<uv_handle_t*>(&impl_->spin);
  if (uv_is_closing(handle)) return;  // OnStop closed it: close callbacks still to run open nothing
  const uint64_t until = uv_hrtime() + static_cast<uint64_t>(std::max<int64_t>(0, d.count()));
  impl_->spin_until_ns = std::max(impl_->spin_until_ns, until);
  if (spinning()) return;
  // An active idle handle makes uv_run poll with a zero timeout; its callback runs once
  // an iteration and closes the window when its time is up.
  uv_idle_start(&impl_->spin, [](uv_idle_t* h) {
    auto* loop = static_cast<EventLoop*>(h->data);
    if (uv_hrtime() >= loop->impl_->spin_until_ns) uv_idle_stop(h);
  });
}

bool EventLoop::spinning() const {
  DCHECK(InLoopThread());
  return uv_is_active(reinterpret_cast<const uv_handle_t*>(&impl_->spin)) != 0;
}

void EventLoop::RunQueuedBeforePoll() {
  // Callbacks may queue more work for this same phase; run until none is left.
  while (!before_poll_.empty()) {
    std::vector<std::function<void()>> batch;
    batch.swap(before_poll_);
    for (auto& fn : batch) fn();
  }
  uv_prepare_stop(&impl_->prepare);
  uv_check_stop(&impl_->check);
}

void EventLoop::OnStop() {
  // Hooks close their owners' handles; newest first so dependents go before their base.
  while (!stop_hooks_.empty()) {
    auto it = std::prev(stop_hooks_.end());
    std::function<void()> fn = std::move(it->second);
    stop_hooks_.erase(it);
    fn();
  }
  while (!impl_->timers.empty()) CancelTimer(impl_->timers.begin()->first);
  // Writes flushed by hooks are abandoned with their connections; drop pending work.
  before_poll_.clear();
  uv_prepare_stop(&impl_->prepare);
  uv_check_stop(&impl_->check);
  uv_close(reinterpret_cast<uv_handle_t*>(&impl_->prepare), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&impl_->check), nullptr);
  uv_idle_stop(&impl_->spin);
  uv_close(reinterpret_cast<uv_handle_t*>(&impl_->spin), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&impl_->wakeup), nullptr);
}

Status EventLoop::Stop() {
  if (stopped_) return close_status_;
  CHECK(!running_ || !InLoopThread()) << "EventLoop::Stop called on its own thread";
  stopped_ = true;
  if (running_) {
    {
      std::lock_guard<std::mutex> lock(post_mu_);
      posted_.push_back([this] { OnStop(); });
      stopping_ = true;
      uv_async_send(&impl_->wakeup);  // under post_mu_: an earlier wake-up may run OnStop
    }
    thread_.join();
  } else {
    Drain();
    {
      std::lock_guard<std::mutex> lock(post_mu_);
      stopping_ = true;
    }
    loop_thread_id_ = std::this_thread::get_id();
    OnStop();
    uv_run(loop_.get(), UV_RUN_DEFAULT);
  }
  running_ = false;
  int rc = uv_loop_close(loop_.get());
  if (rc != 0) {
    close_status_ = UvStatus(rc, "uv_loop_close on " + name_ + " (a handle was leaked)");
    LOG(ERROR) << close_status_;
  }
  return close_status_;
}

}  // namespace pscore::comm
