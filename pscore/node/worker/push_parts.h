// How a WorkerNode's pushes are split into one request per server: encoded on the calling
// thread straight from the caller's arrays (the one copy of the values, or none when they
// are shared and large), and split again on the loop thread when the server count changed.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "pscore/node/worker/kv_request.h"
#include "pscore/node/worker/scratch_arrays.h"

namespace pscore::node {

// Groups indices [0, n) of keys by owner among `servers`; the groups' arrays are taken
// from `scratch` when it keeps some of their size.
std::vector<std::vector<size_t>> ByOwner(const uint64_t* keys, size_t n, int servers,
                                         ScratchArrays* scratch = nullptr);

// A push's arrays: lens[i] floats of values belong to keys[i] (lens empty: row_len floats
// each); `shared`, when set, owns values, which may then be written to the sockets
// without a copy.
struct PushInput {
  const uint64_t* keys;
  size_t num_keys;
  const uint32_t* lens;  // null: rows of row_len floats
  uint32_t row_len;
  const float* values;
  size_t num_values;
  const std::shared_ptr<const void>& shared;

  // Whether values go to the sockets from where they are (shared and large: no copy).
  bool ZeroCopy() const;
  // Keys [begin, end) with their values, which start at float `value_begin`.
  PushInput Keys(size_t begin, size_t end, uint64_t value_begin) const;
};

// How many keys a slice of `in` holds: a push that copies its values and has more than
// slice_keys keys is cut into slices of that many consecutive keys, sent as requests of
// their own (NodeOptions::push_slice_keys); all of its keys when it is not.
size_t SliceKeys(const PushInput& in, size_t slice_keys);

// The parts of a push for `servers` servers (0: not yet known; one part, split again once
// they are): one per server for each slice (SliceKeys; slice_keys 0: no slices), in key
// order. A server applies a slice while the next arrives, and each slice's buffers come
// from the pools rather than being fresh memory. Copies are counted on op.
Status SplitPush(const PushInput& in, int servers, size_t slice_keys, KvRequest& op, std::vector<KvPart>* parts);

// `part`, encoded for another server count, split again from its own bytes for `servers`
// (made contiguous first when its values are the caller's, sent without a copy).
Status ResplitPush(const KvPart& part, int servers, KvRequest& op, std::vector<KvPart>* parts);

}  // namespace pscore::node
