// What a pscore-train process printed on its last line ("... final loss L ... weights
// checksum C"), for tests that compare a disturbed job with an undisturbed one.
#pragma once

#include <cstdlib>
#include <string>

namespace pscore::testing {

struct TrainFinal {
  bool found = false;
  double loss = 0;
  double checksum = 0;
};

inline TrainFinal ParseTrainFinal(const std::string& log) {
  TrainFinal f;
  const size_t at = log.rfind(" final loss ");
  const size_t sum_at = log.rfind("weights checksum ");
  if (at == std::string::npos || sum_at == std::string::npos || sum_at < at) return f;
  f.loss = std::strtod(log.c_str() + at + 12, nullptr);
  f.checksum = std::strtod(log.c_str() + sum_at + 17, nullptr);
  f.found = true;
  return f;
}

}  // namespace pscore::testing
