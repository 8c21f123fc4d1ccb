// How a WorkerNode's pushes are split into one request per server: encoded on the calling
// thread straight from the caller's arrays (the one copy of the values, or none when they
// are shared and large), and split again on the loop thread when the server count changed.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "pscore/node/worker/kv_request.h"

namespace pscore::node {

// Groups indices [0, n) of keys by owner among `servers`.
std::vector<std::vector<size_t>> ByOwner(const uint64_t* keys, size_t n, int servers);

// A push's arrays: lens[i] floats of values belong to keys[i] (lens empty: row_len floats
// each); `shared`, when set, owns values, which may then be written to the sockets
// without a copy.
struct PushInput {
  const std::vector<uint64_t>& keys;
  const std::vector<uint32_t>& lens;
  uint32_t row_len;
  const float* values;
  size_t num_values;
  const std::shared_ptr<const void>& shared;
};

// The parts of a push for `servers` servers (0: not yet known; one part, split again once
// they are). Copies are counted on op.
Status SplitPush(const PushInput& in, int servers, KvRequest& op, std::vector<KvPart>* parts);

// `part`, encoded for another server count, split again from its own bytes for `servers`
// (made contiguous first when its values are the caller's, sent without a copy).
Status ResplitPush(const KvPart& part, int servers, KvRequest& op, std::vector<KvPart>* parts);

}  // namespace pscore::node
