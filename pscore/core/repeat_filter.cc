#include "pscore/core/repeat_filter.h"

namespace pscore::core {

std::optional<int64_t> RepeatFilter::Admit(const std::string& subject, const std::string& message, TimePoint now) {
  auto it = seen_.find(subject);
  if (it != seen_.end() && it->second.message == message && now - it->second.written < period_) {
    ++it->second.repeats;
    return std::nullopt;
  }
  if (it == seen_.end()) {
    if (seen_.size() >= max_subjects_) seen_.clear();
    it = seen_.emplace(subject, Seen{}).first;
  }
  const int64_t repeats = it->second.repeats;
  it->second.message = message;
  it->second.written = now;
  it->second.repeats = 0;
  return repeats;
}

}  // namespace pscore::core
