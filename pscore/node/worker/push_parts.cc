#include "pscore/node/worker/push_parts.h"

#include <algorithm>
#include <numeric>

#include "pscore/core/key_range.h"
#include "pscore/core/kv_codec.h"
#include "pscore/node/worker/worker_node.h"

namespace pscore::node {

namespace {

// A copied push part (EncodeKvPairsGather) of large values sent as head and tail, as
// ZPush's are: a server then folds the values into the store as they arrive instead of
// reading the whole frame into memory first (ServerNode::OnRequestStream).
Payload PushPayload(BufferPtr encoded, uint64_t floats, size_t num_keys) {
  if (floats * sizeof(float) < WorkerNode::kStreamedPushBytes * num_keys) return encoded;
  return core::SplitValuesTail(std::move(encoded), floats * sizeof(float));
}

// Each key's float offset in values laid out back to back by lens.
std::vector<uint64_t> Offsets(const uint32_t* lens, size_t n, uint64_t* total) {
  std::vector<uint64_t> offsets(n);
  uint64_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    offsets[i] = off;
    off += lens[i];
  }
  *total = off;
  return offsets;
}

// The part of group `g` whose values are written from the caller's memory (ZPush).
Result<Payload> SharedPart(const PushInput& in, const std::vector<uint64_t>& offsets, const std::vector<size_t>& g) {
  std::vector<uint64_t> k;
  std::vector<uint32_t> l;
  std::vector<Slice> tail;
  k.reserve(g.size());
  l.reserve(g.size());
  tail.reserve(g.size());
  for (size_t i : g) {
    k.push_back(in.keys[i]);
    l.push_back(in.lens[i]);
    tail.push_back(
        Slice{in.shared, reinterpret_cast<const char*>(in.values + offsets[i]), in.lens[i] * sizeof(float)});
  }
  return core::EncodeKvPairsShared(k.data(), k.size(), l.data(), std::move(tail));
}

// The copied part of the keys `g` of a push's arrays: key i has lens[i] floats at
// values + offsets[i], or, with lens null, row_len floats at values + i * row_len (sent with
// row_len in place of lens). Sets *floats to the part's value count.
Payload CopiedPart(const uint64_t* keys, const uint32_t* lens, uint32_t row_len, const float* values,
                   const std::vector<uint64_t>& offsets, const std::vector<size_t>& g, uint64_t* floats) {
  BufferPtr encoded;
  if (lens == nullptr) {
    *floats = uint64_t{row_len} * g.size();
    encoded = core::EncodeKvPairsGatherRows(keys, row_len, values, g.data(), g.size());
  } else {
    *floats = 0;
    for (size_t i : g) *floats += lens[i];
    encoded = core::EncodeKvPairsGather(keys, lens, values, offsets.data(), g.data(), g.size());
  }
  return PushPayload(std::move(encoded), *floats, g.size());
}

}  // namespace

std::vector<std::vector<size_t>> ByOwner(const uint64_t* keys, size_t n, int servers, ScratchArrays* scratch) {
  std::vector<std::vector<size_t>> out(servers);
  auto room = [scratch](std::vector<size_t>& group, size_t count) {
    if (scratch != nullptr) group = scratch->TakeWords(count);
    group.reserve(count);
  };
  if (servers == 1) {
    room(out[0], n);
    out[0].resize(n);
    std::iota(out[0].begin(), out[0].end(), size_t{0});
    return out;
  }
  // Counted first, so each group is allocated once at its size (millions of keys per call).
  std::vector<size_t> counts(servers);
  for (size_t i = 0; i < n; ++i) ++counts[core::ServerForKey(keys[i], servers)];
  for (int s = 0; s < servers; ++s) room(out[s], counts[s]);
  for (size_t i = 0; i < n; ++i) out[core::ServerForKey(keys[i], servers)].push_back(i);
  return out;
}

bool PushInput::ZeroCopy() const {
  // Shared values are written from where they are when that beats copying them
  // (core::kZeroCopyBytes per key on average).
  return shared && num_values * sizeof(float) >= core::kZeroCopyBytes * num_keys;
}

PushInput PushInput::Keys(size_t begin, size_t end, uint64_t value_begin) const {
  const uint64_t value_end =
      lens ? std::accumulate(lens + begin, lens + end, value_begin) : uint64_t{row_len} * end;
  return PushInput{keys + begin, end - begin, lens ? lens + begin : nullptr, row_len, values + value_begin,
                   value_end - value_begin, shared};
}

size_t SliceKeys(const PushInput& in, size_t slice_keys) {
  if (in.ZeroCopy() || slice_keys == 0 || in.num_keys <= slice_keys) return in.num_keys;
  return slice_keys;
}

Status SplitPush(const PushInput& in, int servers, size_t slice_keys, KvRequest& op, std::vector<KvPart>* parts) {
  const size_t slice = SliceKeys(in, slice_keys);
  if (slice < in.num_keys) {
    uint64_t value_begin = 0;
    for (size_t begin = 0; begin < in.num_keys; begin += slice) {
      const PushInput keys_in = in.Keys(begin, std::min(in.num_keys, begin + slice), value_begin);
      value_begin += keys_in.num_values;
      const Status st = SplitPush(keys_in, servers, 0, op, parts);
      if (!st.ok()) return st;
    }
    return Status::Ok();
  }
  const bool zero_copy = in.ZeroCopy();
  const int n = std::max(1, servers);
  const int for_servers = servers > 0 ? n : 0;  // 0: split again once servers are known
  const uint64_t value_bytes = uint64_t{in.num_values} * sizeof(float);
  if (n == 1) {
    // One server takes every key: the caller's arrays go into the request as they are (no
    // index of the keys, no gathering). Shared values are one range of the caller's memory,
    // written from there as one slice once they reach core::kZeroCopyBytes in all, however
    // small each key's; otherwise they are copied into the request.
    KvPart part;
    part.server = 0;
    part.for_servers = for_servers;
    part.num_keys = in.num_keys;
    if (in.shared && value_bytes >= core::kZeroCopyBytes) {
      Result<Payload> p = core::EncodeKvPairsShared(
          in.keys, in.num_keys, in.lens, {Slice{in.shared, reinterpret_cast<const char*>(in.values), value_bytes}},
          in.row_len);
      if (!p.ok()) return p.status();
      part.payload = std::move(*p);
    } else {
      part.payload = PushPayload(
          in.lens == nullptr ? core::EncodeKvPairsRows(in.keys, in.num_keys, in.row_len, in.values)
                             : core::EncodeKvPairs(in.keys, in.num_keys, in.lens, in.values, in.num_values),
          in.num_values, in.num_keys);
      op.CountCopied(value_bytes);
    }
    parts->push_back(std::move(part));
    return Status::Ok();
  }
  const bool rows = in.lens == nullptr;
  if (rows && zero_copy) {  // SharedPart reads a len per key
    const std::vector<uint32_t> lens(in.num_keys, in.row_len);
    return SplitPush(PushInput{in.keys, in.num_keys, lens.data(), 0, in.values, in.num_values, in.shared}, servers, 0,
                     op, parts);
  }
  uint64_t total = 0;
  const std::vector<uint64_t> offsets = rows ? std::vector<uint64_t>() : Offsets(in.lens, in.num_keys, &total);
  const std::vector<std::vector<size_t>> groups = ByOwner(in.keys, in.num_keys, n);
  for (int s = 0; s < n; ++s) {
    const std::vector<size_t>& g = groups[s];
    if (g.empty()) continue;
    KvPart part;
    part.server = s;
    part.for_servers = for_servers;
    part.num_keys = g.size();
    if (zero_copy) {
      Result<Payload> p = SharedPart(in, offsets, g);
      if (!p.ok()) return p.status();
      part.payload = std::move(*p);
    } else {
      uint64_t floats = 0;
      part.payload = CopiedPart(in.keys, in.lens, in.row_len, in.values, offsets, g, &floats);
      op.CountCopied(floats * sizeof(float));
    }
    parts->push_back(std::move(part));
  }
  return Status::Ok();
}

Status ResplitPush(const KvPart& part, int servers, KvRequest& op, std::vector<KvPart>* parts) {
  BufferPtr bytes = part.payload.Flatten();
  if (!part.payload.tail.empty() && bytes) op.CountCopied(bytes->size());
  if (!bytes) return Status(Code::kInternal, "push part without payload");
  Result<core::KvView> v = core::DecodeKvPairs(bytes->data(), bytes->size(), true);
  if (!v.ok()) return v.status();
  const bool rows = v->lens == nullptr;  // row_len in place of lens
  uint64_t total = v->num_values;
  const std::vector<uint64_t> offsets = rows ? std::vector<uint64_t>() : Offsets(v->lens, v->num_keys, &total);
  op.CountCopied(total * sizeof(float));  // every value once, into the new parts
  const std::vector<std::vector<size_t>> groups = ByOwner(v->keys, v->num_keys, servers);
  for (int s = 0; s < servers; ++s) {
    const std::vector<size_t>& g = groups[s];
    if (g.empty()) continue;
    KvPart sub = part.Successor();
    sub.server = s;
    sub.for_servers = servers;
    sub.num_keys = g.size();
    uint64_t floats = 0;
    sub.payload = CopiedPart(v->keys, v->lens, v->row_len, v->values, offsets, g, &floats);
    parts->push_back(std::move(sub));
  }
  return Status::Ok();
}

}  // namespace pscore::node
