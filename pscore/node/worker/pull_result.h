// What the pulls of a WorkerNode answer (pscore/node/worker/worker_node.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pscore/core/buffer.h"

namespace pscore::node {

struct PullResult {
  std::vector<float> values;  // back to back, in the order of the requested keys
  std::vector<uint32_t> lens;
};

// ZPull's answer: every key's floats where they arrived (inside the servers' answer
// buffers, read in place), kept alive by this object; nothing is copied.
struct PullView {
  std::vector<uint32_t> lens;         // per requested key
  std::vector<const float*> values;   // per requested key: lens[i] floats (not to be read when 0)
  std::vector<BufferPtr> owners;      // the answers the pointers point into
  size_t num_floats() const {
    size_t n = 0;
    for (uint32_t l : lens) n += l;
    return n;
  }
};

}  // namespace pscore::node
