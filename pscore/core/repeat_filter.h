// RepeatFilter: decides which lines of a repeating log message to write. The same message
// about the same subject (a node id) is written once per `period`; the repeats between are
// counted and the subject's next line written carries their count. A subject whose message
// changes is written at once. At most `max_subjects` subjects are remembered (the names
// come from the wire): past that the memory is cleared, and each subject's next line is
// written. (glog's LOG_EVERY_T throttles a call site across every subject: it would hide
// the first refusal of a second node behind the first node's.)
// Single-threaded (the owner's loop thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "pscore/core/clock.h"

namespace pscore::core {

class RepeatFilter {
 public:
  RepeatFilter(Duration period, size_t max_subjects) : period_(period), max_subjects_(max_subjects) {}

  // Write the line now (the value: the subject's lines left unwritten since its last one),
  // or nullopt: a repeat within the period, counted.
  std::optional<int64_t> Admit(const std::string& subject, const std::string& message, TimePoint now);
  // The subject's trouble is over (a refused node was admitted): its next line is written.
  void Forget(const std::string& subject) { seen_.erase(subject); }
  size_t subjects() const { return seen_.size(); }

 private:
  struct Seen {
    std::string message;
    TimePoint written;
    int64_t repeats = 0;  // since `written`
  };
  Duration period_;
  size_t max_subjects_;
  std::unordered_map<std::string, Seen> seen_;
};

}  // namespace pscore::core
