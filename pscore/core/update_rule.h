// The built-in update rules of the parameter store (ParamStore::Options::rule): how a
// pushed value folds into a stored one. The per-value rule is written once, here; every
// path that applies a push (a key in a run, a key in a block of its own, a streamed push,
// a journal replayed through Push) goes through ApplyRule or ApplyRuleInto. Pure
// functions, any thread.
#pragma once

#include <cstddef>

namespace pscore::core {

enum class UpdateRule { kAssign, kSum, kSgd };

namespace rule_internal {

// The new value of one float: assign takes the pushed value, sum adds it, sgd subtracts
// learning_rate times it.
struct Assign {
  float operator()(float, float incoming) const { return incoming; }
};
struct Sum {
  float operator()(float stored, float incoming) const { return stored + incoming; }
};
struct Sgd {
  float learning_rate;
  float operator()(float stored, float incoming) const { return stored - learning_rate * incoming; }
};

// Calls fn with the rule's per-value function object. The switch is taken once per key,
// so each loop below is compiled (and vectorised) per rule.
template <typename Fn>
inline void VisitRule(UpdateRule rule, float learning_rate, Fn&& fn) {
  switch (rule) {
    case UpdateRule::kAssign: fn(Assign{}); break;
    case UpdateRule::kSum: fn(Sum{}); break;
    case UpdateRule::kSgd: fn(Sgd{learning_rate}); break;
  }
}

}  // namespace rule_internal

// stored[i] = rule(stored[i], incoming[i]) for i < n, in place. incoming must not overlap
// stored.
inline void ApplyRule(UpdateRule rule, float learning_rate, float* stored, const float* incoming, size_t n) {
  rule_internal::VisitRule(rule, learning_rate, [&](auto op) {
    for (size_t i = 0; i < n; ++i) stored[i] = op(stored[i], incoming[i]);
  });
}

// out[i] = rule(stored[i], incoming[i]) for i < n, into out, which overlaps neither input
// (a streamed push writes the new values beside the stored ones).
inline void ApplyRuleInto(UpdateRule rule, float learning_rate, const float* stored, const float* incoming, size_t n,
                          float* out) {
  rule_internal::VisitRule(rule, learning_rate, [&](auto op) {
    for (size_t i = 0; i < n; ++i) out[i] = op(stored[i], incoming[i]);
  });
}

}  // namespace pscore::core
