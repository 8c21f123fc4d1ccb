#include "pscore/core/scheduler_watch.h"

#include <algorithm>

namespace pscore::core {

SchedulerWatch::SchedulerWatch(Config config, const Clock* clock) : config_(config), clock_(clock) {
  config_.give_up_after = std::max(config_.give_up_after, config_.silence_timeout);
}

void SchedulerWatch::Start() {
  started_ = true;
  last_answer_ = clock_->Now();
  last_check_ = last_answer_;
}

std::optional<Duration> SchedulerWatch::Answered() {
  const TimePoint now = clock_->Now();
  const Duration silence = now - last_answer_;
  last_answer_ = now;
  if (!silent_) return std::nullopt;
  silent_ = false;
  return silence;
}

// A stopped scheduler keeps its socket open and the kernel still accepts connections for
// it, so a silent link is closed and dialed again every silence_timeout: when the
// scheduler runs again it finds a fresh link with a REGISTER waiting.
SchedulerWatch::Verdict SchedulerWatch::Check() {
  if (!started_ || gave_up_) return Verdict::kAlive;
  const TimePoint now = clock_->Now();
  const Duration stalled = now - last_check_;
  last_check_ = now;
  if (stalled > config_.silence_timeout / 2) {
    last_answer_ = std::min(now, last_answer_ + stalled);
    last_redial_ = std::min(now, last_redial_ + stalled);
  }
  const Duration silence = now - last_answer_;
  if (silence >= config_.give_up_after) {
    gave_up_ = true;
    return Verdict::kGiveUp;
  }
  if (silence < config_.silence_timeout) return Verdict::kAlive;
  if (!silent_) {
    silent_ = true;
    last_redial_ = now;
    return Verdict::kSilent;
  }
  if (now - last_redial_ < config_.silence_timeout) return Verdict::kAlive;
  last_redial_ = now;
  return Verdict::kRedial;
}

}  // namespace pscore::core
