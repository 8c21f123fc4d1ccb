// SchedulerWatch: a member's judgement of whether its scheduler is alive, from the times
// the scheduler answered. Pure bookkeeping fed a clock; owned by the Node and called on its
// loop thread only (not thread-safe). The node turns each Check() verdict into a log line,
// a redial or its termination.
#pragma once

#include <optional>

#include "pscore/core/clock.h"

namespace pscore::core {

class SchedulerWatch {
 public:
  struct Config {
    Duration silence_timeout;  // no answer this long: the scheduler is silent
    Duration give_up_after;    // no answer this long: give up (raised to silence_timeout)
  };
  enum class Verdict {
    kAlive,    // nothing to do
    kSilent,   // silence just began: log it once, close and redial the link
    kRedial,   // still silent, another silence_timeout passed: close and redial again
    kGiveUp,   // silent past give_up_after: terminate (reported once)
  };

  SchedulerWatch(Config config, const Clock* clock);

  // Starts watching; now counts as an answer.
  void Start();
  // The scheduler answered. When that ends a silence, returns how long it lasted (log the
  // recovery once); otherwise nullopt.
  std::optional<Duration> Answered();
  // Called periodically (several times per silence_timeout) while watching. A call more
  // than silence_timeout / 2 after the previous one means this node itself did not run
  // (stopped, swapped out): answers may be waiting unread in its socket, so that gap is
  // not counted as the scheduler's silence.
  Verdict Check();
  bool silent() const { return silent_; }
  // Time since the last answer.
  Duration since_answer() const { return clock_->Now() - last_answer_; }
  const Config& config() const { return config_; }

 private:
  Config config_;
  const Clock* clock_;
  bool started_ = false;
  bool silent_ = false;
  bool gave_up_ = false;
  TimePoint last_answer_{};
  TimePoint last_redial_{};
  TimePoint last_check_{};
};

}  // namespace pscore::core
