// Restores the process-wide buffer pool limit (Buffer::SetPoolLimit) when a test ends, on a
// failing REQUIRE too, so a test that changes it leaves later tests of its process the
// limit it found.
#pragma once

#include <cstddef>

#include "pscore/core/buffer.h"

namespace pscore {

struct PoolLimitGuard {
  size_t saved = Buffer::PoolLimit();
  ~PoolLimitGuard() { Buffer::SetPoolLimit(saved); }
};

}  // namespace pscore
