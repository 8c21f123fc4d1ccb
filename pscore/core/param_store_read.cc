// ParamStore, reads: Pull, Lens and CopyValues (a copy into the caller's buffer),
// ShareValues and ShareOrCopyValues (slices pinning the stored blocks). See param_store.h.
#include "pscore/core/param_store.h"

#include <cstring>

#include <algorithm>
#include <string>
#include <utility>

#include "pscore/core/key_range.h"

namespace pscore {
namespace core {

template <typename Fn>
Status ParamStore::ForEachStored(const uint64_t* keys, size_t num_keys, bool share, Fn fn, size_t lanes,
                                 const std::atomic<bool>* stop) const {
  if (num_keys == 0) return Status::Ok();
  if (keys == nullptr) return Status(Code::kInvalidArgument, "pull of " + std::to_string(num_keys) + " null keys");
  if (num_keys > UINT32_MAX) {
    return Status(Code::kInvalidArgument, "pull of " + std::to_string(num_keys) + " keys: over 2^32");
  }
  // Key i of the batch in its stripe (lock held), walked on with c: fn once it is found,
  // or the first missing key kept in *lane_missing (then fn is not called again).
  auto visit = [&](size_t l, Stripe& stripe, Cursor& c, uint32_t i, size_t* lane_missing) {
    if (FindInRuns(stripe, keys[i], &c)) {
      if (*lane_missing != SIZE_MAX) return;
      if (!share) {
        const Run& run = stripe.runs[c.run];
        fn(l, i, run.At(c.pos), run.LenAt(c.pos), nullptr);
        return;
      }
      auto it = MoveToBlock(stripe, c);
      c = Cursor{};
      fn(l, i, it->second->values.data(), static_cast<uint32_t>(it->second->values.size()), &it->second);
      return;
    }
    auto it = stripe.entries.find(keys[i]);
    if (it == stripe.entries.end()) {
      *lane_missing = std::min<size_t>(*lane_missing, i);
    } else if (*lane_missing == SIZE_MAX) {
      fn(l, i, it->second->values.data(), static_cast<uint32_t>(it->second->values.size()), &it->second);
    }
  };
  auto not_found = [&](size_t i) {
    return Status(Code::kNotFound, "pull of unknown key " + std::to_string(keys[i]));
  };
  if (num_keys == 1) {  // a single key (the small pulls): no grouping, no lanes
    Stripe& stripe = stripes_[KeyPosition(keys[0]) >> (64 - kStripeBits)];  // as StripeFor
    std::lock_guard<std::mutex> lock(stripe.mu);
    Cursor c;
    size_t missing = SIZE_MAX;
    visit(0, stripe, c, 0, &missing);
    return missing == SIZE_MAX ? Status::Ok() : not_found(missing);
  }
  std::vector<size_t> missing(lanes, SIZE_MAX);  // per lane: its first missing key, in batch order
  // Each lane its share of the batch's keys, through every stripe (a read changes no
  // value: the lanes need not split the stripes, and each groups only its own keys). Lane
  // l starts at its share of the stripes, so the lanes rarely wait for one stripe's lock.
  RunLanes(lanes, [&](size_t l, size_t lanes_run) {
    size_t key_begin = 0;
    size_t key_end = 0;
    ShareOf(l, lanes_run, num_keys, &key_begin, &key_end);
    size_t stripe0 = 0;
    size_t unused = 0;
    ShareOf(l, lanes_run, kStripes, &stripe0, &unused);
    Groups g;
    std::array<Cursor, kStripes> cursors{};  // hints only: FindInRuns checks them
    size_t lane_missing = SIZE_MAX;
    for (size_t begin = key_begin; begin < key_end; begin += kWindowKeys) {
      GroupByStripe(keys, begin, std::min(key_end, begin + kWindowKeys), 0, kStripes, &g);
      for (size_t k = 0; k < kStripes; ++k) {
        const size_t s = (stripe0 + k) % kStripes;
        if (g.starts[s] == g.starts[s + 1]) continue;
        if (stop != nullptr && stop->load(std::memory_order_relaxed)) {
          missing[l] = lane_missing;
          return;
        }
        Stripe& stripe = stripes_[s];
        std::lock_guard<std::mutex> lock(stripe.mu);
        Cursor& c = cursors[s];
        for (size_t j = g.starts[s]; j < g.starts[s + 1]; ++j) visit(l, stripe, c, g.order[j], &lane_missing);
      }
    }
    missing[l] = lane_missing;
  });
  const size_t first_missing = *std::min_element(missing.begin(), missing.end());
  return first_missing == SIZE_MAX ? Status::Ok() : not_found(first_missing);
}

Status ParamStore::Pull(const uint64_t* keys, size_t num_keys, std::vector<uint32_t>* lens,
                        std::vector<float>* values) const {
  lens->clear();
  values->clear();
  if (num_keys > 0 && keys == nullptr) {
    return Status(Code::kInvalidArgument, "pull of " + std::to_string(num_keys) + " null keys");
  }
  lens->resize(num_keys);
  for (;;) {
    Status st = Lens(keys, num_keys, lens->data());
    if (st.ok()) {
      uint64_t total = 0;
      for (uint32_t l : *lens) total += l;
      values->resize(total);
      st = CopyValues(keys, num_keys, lens->data(), values->data());
      if (st.ok()) return st;
    }
    if (st.code() != Code::kAborted) {  // kAborted: a key replaced between the steps, read again
      lens->clear();
      values->clear();
      return st;
    }
  }
}

Status ParamStore::Lens(const uint64_t* keys, size_t num_keys, uint32_t* lens) const {
  return ForEachStored(
      keys, num_keys, false, [&](size_t, size_t i, const float*, uint32_t len, const BlockPtr*) { lens[i] = len; },
      LanesFor(num_keys));
}

Status ParamStore::CopyValues(const uint64_t* keys, size_t num_keys, const uint32_t* lens, float* out) const {
  const Offsets offsets(lens, num_keys);
  const size_t lanes = LanesFor(num_keys);
  // Per lane: the first key replaced by Insert since Lens (out has no room for it), and its
  // length now.
  std::vector<std::pair<size_t, uint32_t>> changed(lanes, {SIZE_MAX, 0});
  auto copy = [&](size_t l, size_t i, const float* v, uint32_t len, const BlockPtr*) {
    if (len != lens[i]) {
      if (i < changed[l].first) changed[l] = {i, len};
      return;
    }
    if (len == 0) return;  // memcpy from an empty vector's null data is undefined
    float* dst = out + offsets[i];
    if (len == 1) {
      *dst = *v;  // one float a key (a sparse model's rows): no call per key
    } else {
      std::memcpy(dst, v, len * sizeof(float));
    }
  };
  Status st = ForEachStored(keys, num_keys, false, copy, lanes);
  const auto first = *std::min_element(changed.begin(), changed.end());
  if (!st.ok() || first.first == SIZE_MAX) return st;
  return Status(Code::kAborted, "key " + std::to_string(keys[first.first]) + " changed from " +
                                    std::to_string(lens[first.first]) + " to " + std::to_string(first.second) +
                                    " floats while being read");
}

Status ParamStore::CopyUniform(const uint64_t* keys, size_t num_keys, uint32_t len, float* out) const {
  const size_t lanes = LanesFor(num_keys);
  // Per lane: the first key of another length, in batch order, and its length.
  std::vector<std::pair<size_t, uint32_t>> other_at(lanes, {SIZE_MAX, 0});
  std::atomic<bool> other{false};  // ends the walk: the batch goes the two-step way
  auto copy = [&](size_t l, size_t i, const float* v, uint32_t got, const BlockPtr*) {
    if (got != len) {
      other.store(true, std::memory_order_relaxed);
      if (i < other_at[l].first) other_at[l] = {i, got};
      return;
    }
    float* dst = out + i * size_t{len};
    if (len == 1) {
      *dst = *v;  // one float a key: no call per key
    } else if (len > 0) {
      std::memcpy(dst, v, len * sizeof(float));
    }
  };
  Status st = ForEachStored(keys, num_keys, false, copy, lanes, &other);
  const auto first = *std::min_element(other_at.begin(), other_at.end());
  if (first.first == SIZE_MAX) return st;
  return Status(Code::kFailedPrecondition, "key " + std::to_string(keys[first.first]) + " holds " +
                                               std::to_string(first.second) + " floats, not " + std::to_string(len));
}

namespace {
// A slice reading a block's values, pinning the block (readers) until let go.
template <typename BlockPtrT>
Slice PinnedSlice(const BlockPtrT& b) {
  b->readers.fetch_add(1, std::memory_order_relaxed);  // under the stripe lock: no writer can miss it
  Slice s;
  s.data = reinterpret_cast<const char*>(b->values.data());
  s.size = b->values.size() * sizeof(float);
  s.owner = std::shared_ptr<const void>(b->values.data(), [block = b](const void*) {
    block->readers.fetch_sub(1, std::memory_order_release);
  });
  return s;
}
}  // namespace

Status ParamStore::ShareValues(const uint64_t* keys, size_t num_keys, Slice* out) const {
  return ForEachStored(
      keys, num_keys, true, [&](size_t, size_t i, const float*, uint32_t, const BlockPtr* b) { out[i] = PinnedSlice(*b); },
      LanesFor(num_keys));
}

Status ParamStore::ShareOrCopyValues(const uint64_t* keys, size_t num_keys, Slice* out) const {
  auto copies = std::make_shared<std::vector<float>>();
  std::vector<uint64_t> copied_at;  // per key: its place in copies, or UINT64_MAX
  Status st = ForEachStored(keys, num_keys, false, [&](size_t, size_t i, const float* v, uint32_t len, const BlockPtr* b) {
    if (b != nullptr) {
      out[i] = PinnedSlice(*b);
      return;
    }
    if (copied_at.empty()) copied_at.assign(num_keys, UINT64_MAX);
    copied_at[i] = copies->size();
    copies->insert(copies->end(), v, v + len);
    out[i].size = uint64_t{len} * sizeof(float);
  });
  if (!st.ok() || copied_at.empty()) return st;
  std::shared_ptr<const void> owner(copies, copies->data());
  for (size_t i = 0; i < num_keys; ++i) {
    if (copied_at[i] == UINT64_MAX) continue;
    out[i].data = reinterpret_cast<const char*>(copies->data() + copied_at[i]);
    out[i].owner = owner;
  }
  return st;
}

}  // namespace core
}  // namespace pscore
