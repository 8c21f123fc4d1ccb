// libFuzzer target: the push/pull payload reader (core::DecodeKvPairs) and the parameter
// store behind it. The input is one payload, copied into an 8-byte aligned buffer as a
// received payload is. It is decoded as a pull request (expect_values false), as a push
// (true) and as a pull answer, which may leave its keys out; whatever decodes is read in
// full, re-encoded and decoded again (must round-trip), and a push is applied to a fresh
// core::ParamStore and pulled back, copied and shared (the zero-copy answer must be the
// copying encoder's bytes, and its head alone must decode to the same keys and lens). A
// push may carry row_len in place of lens. Every split of the input where a head may end
// (the values' count matches the bytes after it) is decoded as a head received apart from
// its values: in a buffer of exactly its size (ASan sees any read past it), and when it
// decodes, the whole input must decode as a push with the same keys, lens and value count.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "pscore/core/kv_codec.h"
#include "pscore/core/param_store.h"

namespace {

using pscore::core::DecodeKvPairs;
using pscore::core::KvView;

// Reads every element the view points at, so ASan sees any read outside the buffer.
uint64_t Touch(const KvView& v) {
  uint64_t acc = v.op + v.keyless_answer;
  for (size_t i = 0; v.keys != nullptr && i < v.num_keys; ++i) acc += v.keys[i];
  for (size_t i = 0; i < v.num_lens; ++i) acc += v.lens[i];
  for (size_t i = 0; i < v.num_values; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v.values[i], sizeof bits);
    acc ^= bits;
  }
  return acc;
}

void CheckRoundTrip(const KvView& v, bool expect_values) {
  // A push of rows of one length (row_len in place of lens) through the rows encoder, which
  // writes no op.
  const bool rows = expect_values && v.lens == nullptr && v.row_len > 0;
  pscore::BufferPtr again =
      rows ? pscore::core::EncodeKvPairsRows(v.keys, v.num_keys, v.row_len, v.values)
           : pscore::core::EncodeKvPairs(v.keys, v.num_keys, v.lens, v.values, v.num_values, v.op);
  auto back = DecodeKvPairs(again->data(), again->size(), expect_values);
  if (!back.ok()) __builtin_trap();
  if (back->num_keys != v.num_keys || back->num_lens != v.num_lens || back->num_values != v.num_values ||
      (!rows && back->op != v.op) || (rows && back->row_len != v.row_len)) {
    __builtin_trap();
  }
  if (v.num_keys && std::memcmp(back->keys, v.keys, v.num_keys * sizeof(uint64_t)) != 0) __builtin_trap();
  if (v.num_lens && std::memcmp(back->lens, v.lens, v.num_lens * sizeof(uint32_t)) != 0) __builtin_trap();
  if (v.num_values && std::memcmp(back->values, v.values, v.num_values * sizeof(float)) != 0) __builtin_trap();
}

// The zero-copy pull answer: the store's shared values equal the copied ones, and the
// head-plus-slices payload is byte for byte the buffer the copying encoder builds.
void SharedAnswer(const pscore::core::ParamStore& store, const KvView& v, const std::vector<uint32_t>& lens,
                  const std::vector<float>& values) {
  std::vector<pscore::Slice> slices(v.num_keys);
  if (!store.ShareValues(v.keys, v.num_keys, slices.data()).ok()) __builtin_trap();
  size_t at = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    if (slices[i].size != lens[i] * sizeof(float)) __builtin_trap();
    if (slices[i].size && std::memcmp(slices[i].data, values.data() + at, slices[i].size) != 0) __builtin_trap();
    at += lens[i];
  }
  auto shared = pscore::core::EncodeKvPairsShared(v.keys, v.num_keys, lens.data(), std::move(slices));
  if (!shared.ok()) __builtin_trap();
  // Empty arrays as non-null pointers: the copying encoder leaves a null array out.
  const float no_value = 0;
  const uint32_t no_len = 0;
  pscore::BufferPtr copied = pscore::core::EncodeKvPairs(v.keys, v.num_keys, lens.empty() ? &no_len : lens.data(),
                                                         values.empty() ? &no_value : values.data(), values.size());
  if (shared->Flatten()->view() != copied->view()) __builtin_trap();
  std::vector<char> head(shared->head->data(), shared->head->data() + shared->head->size());
  std::vector<uint64_t> aligned_head((head.size() + 7) / 8);
  std::memcpy(aligned_head.data(), head.data(), head.size());
  auto h = pscore::core::DecodeKvPairsHead(reinterpret_cast<char*>(aligned_head.data()), head.size(),
                                           values.size() * sizeof(float));
  if (!h.ok() || h->num_keys != v.num_keys || h->num_values != values.size() || h->num_lens != lens.size()) {
    __builtin_trap();
  }
  if (!lens.empty() && std::memcmp(h->lens, lens.data(), lens.size() * sizeof(uint32_t)) != 0) __builtin_trap();
}

// The input split after byte `cut` into a head (in a buffer of exactly that size) and a tail.
void HeadApart(const char* p, size_t size, size_t cut) {
  // operator new aligns to 16, and the allocation is exactly `cut` bytes for ASan.
  std::unique_ptr<char[]> room(new char[cut]);
  char* head = room.get();
  std::memcpy(head, p, cut);
  auto h = pscore::core::DecodeKvPairsHead(head, cut, size - cut);
  if (!h.ok()) return;
  auto whole = DecodeKvPairs(p, size, /*expect_values=*/true);
  if (!whole.ok() || whole->num_keys != h->num_keys || whole->num_lens != h->num_lens ||
      whole->row_len != h->row_len || whole->num_values != h->num_values ||
      whole->values != reinterpret_cast<const float*>(p + cut)) {
    __builtin_trap();
  }
  if (h->num_keys && std::memcmp(whole->keys, h->keys, h->num_keys * sizeof(uint64_t)) != 0) __builtin_trap();
  if (h->num_lens && std::memcmp(whole->lens, h->lens, h->num_lens * sizeof(uint32_t)) != 0) __builtin_trap();
}

void PushAndPull(const KvView& v) {
  pscore::core::ParamStore::Options opts;
  opts.rule = static_cast<pscore::core::UpdateRule>(v.op % 3);
  pscore::core::ParamStore store(opts);
  // A refused key (length mismatch) is an answer, not a failure.
  store.Push(v.keys, v.Lengths(), v.values, v.num_keys).IgnoreError();
  std::vector<uint32_t> lens;
  std::vector<float> values;
  if (store.Pull(v.keys, v.num_keys, &lens, &values).ok()) {
    if (lens.size() != v.num_keys) __builtin_trap();
    uint64_t total = 0;
    for (uint32_t l : lens) total += l;
    if (total != values.size()) __builtin_trap();
    SharedAnswer(store, v, lens, values);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint64_t> aligned((size + 7) / 8);
  if (size > 0) std::memcpy(aligned.data(), data, size);
  const char* p = reinterpret_cast<const char*>(aligned.data());

  volatile uint64_t sink = 0;
  for (bool expect_values : {false, true}) {
    auto view = DecodeKvPairs(p, size, expect_values);
    if (!view.ok()) continue;
    sink = sink + Touch(*view);
    CheckRoundTrip(*view, expect_values);
    if (expect_values) PushAndPull(*view);
  }
  // As a pull answer: with keys it is what a push decodes to (lens, or rows of row_len
  // floats); without, one len per key, or rows of row_len floats that make up the values
  // exactly.
  auto answer = DecodeKvPairs(p, size, /*expect_values=*/true, /*answer=*/true);
  if (answer.ok()) {
    sink = sink + Touch(*answer);
    auto push = DecodeKvPairs(p, size, /*expect_values=*/true);
    const KvView& a = *answer;
    const bool rows = a.lens == nullptr && a.row_len > 0 && uint64_t{a.row_len} * a.num_keys == a.num_values;
    if (a.keys != nullptr ? !push.ok() || push->num_keys != a.num_keys || push->row_len != a.row_len
                          : push.ok() || !(rows || (a.lens != nullptr && a.num_lens == a.num_keys))) {
      __builtin_trap();
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < a.num_keys; ++i) sum += a.Len(i);
    if (sum != a.num_values) __builtin_trap();
  }
  for (size_t cut = 4; cut < size; cut += 4) {
    uint32_t count;
    std::memcpy(&count, p + cut - 4, sizeof count);
    if (uint64_t{count} * sizeof(float) == size - cut) HeadApart(p, size, cut);
  }
  // An unaligned start must be refused, never read.
  if (size > 1) {
    auto view = DecodeKvPairs(p + 1, size - 1, true);
    if (view.ok()) __builtin_trap();
  }
  (void)sink;
  return 0;
}
