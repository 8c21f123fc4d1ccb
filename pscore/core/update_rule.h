// The built-in update rules of the parameter store (ParamStore::Options::rule): how a
// pushed value folds into a stored one. The per-value rule is written once, here; every
// path that applies a push (a key in a run, a key in a block of its own, a streamed push,
// a journal replayed through Push) goes through ApplyRule or ApplyRuleInto. Pure
// functions, any thread.
#pragma once

#include <algorithm>
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

// One span under one rule, in place or into `out`. Assign keeps nothing of the stored
// value, so its span is one copy (a memmove), as fast for a gigabyte key as for a row.
template <typename Op>
inline void Span(Op op, float* stored, const float* incoming, size_t n) {
  for (size_t i = 0; i < n; ++i) stored[i] = op(stored[i], incoming[i]);
}
inline void Span(Assign, float* stored, const float* incoming, size_t n) { std::copy(incoming, incoming + n, stored); }
template <typename Op>
inline void SpanInto(Op op, const float* stored, const float* incoming, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = op(stored[i], incoming[i]);
}
inline void SpanInto(Assign, const float*, const float* incoming, size_t n, float* out) {
  std::copy(incoming, incoming + n, out);
}

}  // namespace rule_internal

// stored[i] = rule(stored[i], incoming[i]) for i < n, in place. incoming must not overlap
// stored.
inline void ApplyRule(UpdateRule rule, float learning_rate, float* stored, const float* incoming, size_t n) {
  rule_internal::VisitRule(rule, learning_rate, [&](auto op) { rule_internal::Span(op, stored, incoming, n); });
}

// out[i] = rule(stored[i], incoming[i]) for i < n, into out, which overlaps neither input
// (a streamed push writes the new values beside the stored ones).
inline void ApplyRuleInto(UpdateRule rule, float learning_rate, const float* stored, const float* incoming, size_t n,
                          float* out) {
  rule_internal::VisitRule(rule, learning_rate,
                           [&](auto op) { rule_internal::SpanInto(op, stored, incoming, n, out); });
}

}  // namespace pscore::core
