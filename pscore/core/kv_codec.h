// Push/pull payload codec: KvPairs flatbuffers (pscore/proto/kv.fbs) encode, and a
// verified in-place decode that copies nothing.
//
// Wire: one finished KvPairs flatbuffer, no size prefix, 8-byte aligned.
//   keys:   [uint64]  required (may be empty)
//   lens:   [uint32]  absent, or one per key: the float count of each key
//   values: [float]   sum(lens) floats back to back; absent in a pull request
//   op:     uint8     update rule selector for a push (0 = the store's default)
//   keyless_answer: bool  a pull request: the sender reads answers without keys
//   row_len: uint32   with lens absent: every key holds row_len (> 0) floats
// A push of rows of one length carries row_len in place of lens (keys present).
// A pull answer to a request that set keyless_answer may leave keys out: it answers the
// request's keys in their order, one len each, or, when all hold as many floats, with
// row_len in place of lens (len(values) / row_len keys).
// Limits: the flatbuffers verifier bounds every offset and vector by the buffer
// size (and the 2 GiB flatbuffers limit), so a hostile buffer cannot make the
// decoder read outside it.
//
// Free functions; any thread may call them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "pscore/core/buffer.h"
#include "pscore/core/row_lens.h"
#include "pscore/core/status.h"

namespace pscore {
namespace core {

// Builds a KvPairs buffer. Every array is copied exactly once, straight into
// the returned Buffer (the builder only lays out the small skeleton). keys may
// be null only when num_keys is 0; lens may be null (absent: a pull request
// without lengths); values may be null (absent: a pull request). The encoder
// does not check sum(lens) == num_values; the decoder does.
BufferPtr EncodeKvPairs(const uint64_t* keys, size_t num_keys, const uint32_t* lens,
                        const float* values, size_t num_values, uint8_t op = 0);
// A push of rows of one length: every key holds row_len floats, taken back to back from
// values (row_len x num_keys of them); row_len stands in for lens (row_len 0: lens of
// zeros, written into the buffer).
BufferPtr EncodeKvPairsRows(const uint64_t* keys, size_t num_keys, uint32_t row_len, const float* values);

// Points into the decoded buffer: valid while that buffer lives; no copy.
// Absent vectors are null pointers with a zero count.
// Like EncodeKvPairs, for the subset `indices` of a larger batch: key i has lens[i]
// floats starting at values + value_offsets[i]. Values are still copied exactly once.
BufferPtr EncodeKvPairsGather(const uint64_t* keys, const uint32_t* lens, const float* values,
                              const uint64_t* value_offsets, const size_t* indices,
                              size_t num_indices, uint8_t op = 0);
// The same for rows of one length: key i has row_len floats at values + i * row_len (no
// arrays of lens or offsets); row_len stands in for lens as in EncodeKvPairsRows.
BufferPtr EncodeKvPairsGatherRows(const uint64_t* keys, uint32_t row_len, const float* values, const size_t* indices,
                                  size_t num_indices);

// A KvPairs with keys and lens copied from the caller and the values written in place
// by fill(dst) (num_values floats; dst is 4-byte aligned). A fill error is returned.
// With Keys::kLeftOut (a pull answer to a keyless_answer request) the keys are not
// written: num_keys only counts the lens (Uniform, len > 0: no lens either, row_len).
enum class Keys { kWritten, kLeftOut };
Result<BufferPtr> EncodeKvPairsFilled(const uint64_t* keys, size_t num_keys, const uint32_t* lens,
                                      size_t num_values, const std::function<Status(float*)>& fill,
                                      Keys written = Keys::kWritten);
// The same with every key `len` floats long (num_keys * len values): the lens are written
// into the buffer, not copied from an array.
Result<BufferPtr> EncodeKvPairsUniform(const uint64_t* keys, size_t num_keys, uint32_t len,
                                       const std::function<Status(float*)>& fill, Keys written = Keys::kWritten);

// A pull request for `keys` that asks for answers without keys (keyless_answer).
BufferPtr EncodePullRequest(const uint64_t* keys, size_t num_keys);
// The same request with its num_keys keys written in place by fill(dst) (dst is 8-byte
// aligned): keys gathered from a larger array are copied once.
BufferPtr EncodePullRequestFilled(size_t num_keys, const std::function<void(uint64_t*)>& fill);
// The same request with the keys not copied: the head holds everything up to the first
// key, and the keys follow it as the payload's tail (a slice of `keys`, held alive by
// `owner`), so the sender writes them from where they live. A receiver sees the same
// bytes as EncodePullRequest's.
Payload EncodePullRequestShared(const uint64_t* keys, size_t num_keys, std::shared_ptr<const void> owner);

// Average value bytes per key from which writing values from where they live (tail slices,
// one writev entry each) beats copying them into one buffer: zero-copy pulls and ZPush.
inline constexpr size_t kZeroCopyBytes = 64 * 1024;
// The fewest keys a KvPairs head of `head_bytes` (EncodeKvPairsShared's, SplitValuesTail's)
// holds: each key takes 8 bytes and at most 4 of lens, and the rest of a head made here is
// under kKvHeadFixedBytes. A receiver may judge a head by its size before reading it; a
// head padded past that counts as more keys than it holds, which errs only towards
// receiving the push whole.
inline constexpr size_t kKvHeadFixedBytes = 128;
inline constexpr size_t kKvHeadMostBytesPerKey = sizeof(uint64_t) + sizeof(uint32_t);  // a key and its len
inline constexpr size_t FewestKeysInHead(uint64_t head_bytes) {
  return head_bytes > kKvHeadFixedBytes
             ? static_cast<size_t>((head_bytes - kKvHeadFixedBytes) / kKvHeadMostBytesPerKey)
             : 0;
}

// Average value bytes per key from which a server writes a pull answer from the store
// itself (pinned slices) rather than copying the values into it. Lower than
// kZeroCopyBytes: an answer's slices are the store's, so nothing is copied to make them;
// at 4 KiB a key that measured level with copying
// and leaves the worker's copy the only one in that direction.
inline constexpr size_t kSharedAnswerBytes = 2 * 1024;

// A KvPairs whose values are not copied: the returned head holds everything up to the
// first value, and `values` (slices of sum(lens) floats in all, back to back) follow it
// as the payload's tail, so the sender writes them from where they live. A receiver sees
// an ordinary KvPairs buffer. With lens null, every key holds row_len floats, written as
// row_len in place of lens (as EncodeKvPairsRows does). kInvalidArgument when the slices
// are not whole floats, or, with lens null, not num_keys rows of row_len (row_len > 0).
Result<Payload> EncodeKvPairsShared(const uint64_t* keys, size_t num_keys, const uint32_t* lens,
                                    std::vector<Slice> values, uint32_t row_len = 0);

// An encoded KvPairs (from EncodeKvPairs or EncodeKvPairsGather, whose values are its last
// `value_bytes` bytes) as head and tail, without a copy: the head is a view of everything
// up to the first value and the tail one slice of the values, both kept alive by
// `encoded`. Sent so, the frame names its head (payload_head) and a receiver may take the
// values apart from it, as it takes EncodeKvPairsShared's (a server folds a large push into
// the store as it arrives). `encoded` as it is when value_bytes is 0 or not below its size.
Payload SplitValuesTail(BufferPtr encoded, size_t value_bytes);

struct KvView {
  const uint64_t* keys = nullptr;
  size_t num_keys = 0;
  const uint32_t* lens = nullptr;
  size_t num_lens = 0;
  const float* values = nullptr;
  size_t num_values = 0;
  uint8_t op = 0;
  bool keyless_answer = false;
  uint32_t row_len = 0;  // with lens absent: every key's length (a push, or an answer)

  uint32_t Len(size_t i) const { return lens != nullptr ? lens[i] : row_len; }
  // Every key's length as the store takes it (absent in a pull request).
  RowLens Lengths() const {
    if (lens != nullptr) return RowLens(lens);
    return row_len > 0 ? RowLens::All(row_len) : RowLens();
  }
};

// Verifies `data` with the flatbuffers Verifier, then checks consistency:
// - keys present (an `answer` to a pull may leave them out when it has lens: num_keys is
//   then the lens' count and keys null; or with neither keys nor lens, row_len > 0 and
//   len(values) a multiple of it: num_keys len(values) / row_len, read lens with Len);
//   lens absent or exactly one per key; with keys and without lens, row_len (when > 0)
//   is every key's length;
// - expect_values (push, pull response): lens present or row_len in their place,
//   sum(lens) == num_values (values may be absent when that sum is 0);
// - !expect_values (pull request): values absent or empty.
// `data` must be 8-byte aligned (a Buffer's data is). Failures are
// kInvalidArgument (unaligned, not a KvPairs buffer) or kProtocol
// (inconsistent), with a message naming the numbers.
Result<KvView> DecodeKvPairs(const char* data, size_t size, bool expect_values, bool answer = false);

// A KvPairs whose values were received apart from the rest: `head` holds every byte
// before the first value (it ends with the values' length field, as EncodeKvPairsShared's
// head does) and `tail_bytes` bytes of floats followed it on the wire, now elsewhere
// (comm::AnswerSink). Verified as DecodeKvPairs verifies a whole buffer with
// expect_values, reading only the head; the view's values is null (the caller knows
// where they are) and num_values their count. The count field is zeroed while the
// verifier runs and restored before returning. Same alignment rule, `answer` and error
// codes.
Result<KvView> DecodeKvPairsHead(char* head, size_t size, uint64_t tail_bytes, bool answer = false);

}  // namespace core
}  // namespace pscore
