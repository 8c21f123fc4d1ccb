#include "pscore/node/worker/push_parts.h"

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

}  // namespace

std::vector<std::vector<size_t>> ByOwner(const uint64_t* keys, size_t n, int servers) {
  std::vector<std::vector<size_t>> out(servers);
  if (servers == 1) {
    out[0].resize(n);
    std::iota(out[0].begin(), out[0].end(), size_t{0});
    return out;
  }
  // Counted first, so each group is allocated once at its size (millions of keys per call).
  std::vector<size_t> counts(servers);
  for (size_t i = 0; i < n; ++i) ++counts[core::ServerForKey(keys[i], servers)];
  for (int s = 0; s < servers; ++s) out[s].reserve(counts[s]);
  for (size_t i = 0; i < n; ++i) out[core::ServerForKey(keys[i], servers)].push_back(i);
  return out;
}

Status SplitPush(const PushInput& in, int servers, KvRequest& op, std::vector<KvPart>* parts) {
  // Shared values are written from where they are when that beats copying them
  // (core::kZeroCopyBytes per key on average).
  const bool zero_copy = in.shared && in.num_values * sizeof(float) >= core::kZeroCopyBytes * in.keys.size();
  const int n = std::max(1, servers);
  const int for_servers = servers > 0 ? n : 0;  // 0: split again once servers are known
  if (n == 1 && !zero_copy) {
    // One server takes every key: the caller's arrays are copied into the request as they
    // are (no index of the keys, no gathering).
    KvPart part;
    part.server = 0;
    part.for_servers = for_servers;
    part.num_keys = in.keys.size();
    part.payload = PushPayload(
        in.lens.empty() ? core::EncodeKvPairsRows(in.keys.data(), in.keys.size(), in.row_len, in.values)
                        : core::EncodeKvPairs(in.keys.data(), in.keys.size(), in.lens.data(), in.values, in.num_values),
        in.num_values, in.keys.size());
    op.CountCopied(in.num_values * sizeof(float));
    parts->push_back(std::move(part));
    return Status::Ok();
  }
  const bool rows = in.lens.empty();
  if (rows && zero_copy) {  // SharedPart reads a len per key
    const std::vector<uint32_t> lens(in.keys.size(), in.row_len);
    return SplitPush(PushInput{in.keys, lens, 0, in.values, in.num_values, in.shared}, servers, op, parts);
  }
  uint64_t total = 0;
  const std::vector<uint64_t> offsets = rows ? std::vector<uint64_t>() : Offsets(in.lens.data(), in.keys.size(), &total);
  const std::vector<std::vector<size_t>> groups = ByOwner(in.keys.data(), in.keys.size(), n);
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
    } else if (rows) {
      const uint64_t floats = uint64_t{in.row_len} * g.size();
      part.payload = PushPayload(core::EncodeKvPairsGatherRows(in.keys.data(), in.row_len, in.values, g.data(), g.size()),
                                 floats, g.size());
      op.CountCopied(floats * sizeof(float));
    } else {
      uint64_t floats = 0;
      for (size_t i : g) floats += in.lens[i];
      part.payload = PushPayload(core::EncodeKvPairsGather(in.keys.data(), in.lens.data(), in.values,
                                                           offsets.data(), g.data(), g.size()),
                                 floats, g.size());
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
  uint64_t total = 0;
  const std::vector<uint64_t> offsets = Offsets(v->lens, v->num_keys, &total);
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
    for (size_t i : g) floats += v->lens[i];
    sub.payload = PushPayload(
        core::EncodeKvPairsGather(v->keys, v->lens, v->values, offsets.data(), g.data(), g.size()), floats,
        g.size());
    parts->push_back(std::move(sub));
  }
  return Status::Ok();
}

}  // namespace pscore::node
