#include "pscore/comm/conn_sweep.h"

#include <algorithm>

#include "pscore/comm/event_loop.h"

namespace pscore::comm {

Duration ConnSweep::Period(Duration shortest, Duration longest) {
  const Duration floor = std::chrono::milliseconds(10);
  return std::clamp<Duration>(shortest / 4, floor, std::max(floor, longest));
}

void ConnSweep::Start(EventLoop* loop, Duration period, std::function<void()> pass) {
  DCHECK(loop->InLoopThread());
  if (timer_ != 0) return;
  loop_ = loop;
  timer_ = loop_->AddTimer(period, period, std::move(pass));
}

void ConnSweep::Stop() {
  if (timer_ == 0) return;
  DCHECK(loop_->InLoopThread());
  loop_->CancelTimer(timer_);
  timer_ = 0;
}

}  // namespace pscore::comm
