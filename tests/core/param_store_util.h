// Helpers shared by the ParamStore tests. Include after Catch (it uses REQUIRE).
#pragma once

#include <cstdint>
#include <vector>

#include "pscore/core/param_store.h"

namespace pscore::core::testing {

inline ParamStore::Options Rule(UpdateRule rule, float lr = 0.01f) {
  ParamStore::Options o;
  o.rule = rule;
  o.learning_rate = lr;
  return o;
}

// The values of one key, which must exist.
inline std::vector<float> PullOne(const ParamStore& store, uint64_t key) {
  std::vector<uint32_t> lens;
  std::vector<float> values;
  REQUIRE(store.Pull(&key, 1, &lens, &values).ok());
  REQUIRE(lens.size() == 1);
  REQUIRE(values.size() == lens[0]);
  return values;
}

}  // namespace pscore::core::testing
