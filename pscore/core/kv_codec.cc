#include "pscore/core/kv_codec.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "pscore/core/endian.h"
#include "pscore/proto/kv_generated.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pscore {
namespace core {
namespace {

// A vector whose elements the builder reserved but did not fill: where it will
// sit in the finished buffer (as a distance from its end, which never changes
// while the builder grows) and what to copy there.
struct Segment {
  const void* source;
  size_t bytes;
};
struct Hole {
  size_t offset_from_end = 0;
  size_t bytes = 0;
  std::vector<Segment> segments;  // filled back to back
  std::function<Status(char*)> fill;  // or written by the caller, in place
};

template <typename T>
flatbuffers::Offset<flatbuffers::Vector<T>> Reserve(flatbuffers::FlatBufferBuilder* fbb,
                                                     const T* source, size_t count,
                                                     std::vector<Hole>* holes) {
  T* unused = nullptr;
  auto offset = fbb->CreateUninitializedVector<T>(count, &unused);
  // CreateUninitializedVector leaves GetSize() - 4 (the length field) at the
  // element start; the elements begin right after the length.
  const size_t data_from_end = offset.o - sizeof(flatbuffers::uoffset_t);
  if (count > 0) holes->push_back(Hole{data_from_end, count * sizeof(T), {{source, count * sizeof(T)}}, nullptr});
  return offset;
}

// Holes of at least this many bytes are filled with non-temporal stores (CopyStreaming).
constexpr size_t kStreamingCopyBytes = 256u << 10;

// memcpy for a large encoded buffer: its bytes are read next by the kernel's send copy
// on another thread, milliseconds later, after megabytes of other traffic, so ordinary
// stores only leave dirty lines in this core's cache for the sender to fetch back.
// Non-temporal stores write them to memory directly (measured
// +3 to +18 % for the copying Push of 1 to 64 MiB).
void CopyStreaming(char* dst, const char* src, size_t n) {
#if defined(__SSE2__)
  const size_t lead = std::min(n, (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
  std::memcpy(dst, src, lead);
  dst += lead;
  src += lead;
  n -= lead;
  for (; n >= 64; n -= 64, src += 64, dst += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
  }
  _mm_sfence();  // the stores are visible before the buffer is handed to another thread
#endif
  std::memcpy(dst, src, n);
}

// Copies the builder's skeleton around the holes and fills each hole from its segments:
// every array byte is copied once, straight from the caller's memory. Only the first
// `keep` bytes of the finished buffer are produced (all of it by default); holes past
// them are the caller's.
Result<BufferPtr> Assemble(const flatbuffers::FlatBufferBuilder& fbb, std::vector<Hole> holes,
                           size_t keep = SIZE_MAX) {
  const size_t full = fbb.GetSize();
  const size_t size = std::min(keep, full);
  const char* built = reinterpret_cast<const char*>(fbb.GetBufferPointer());
  BufferPtr out = Buffer::Allocate(size);
  std::sort(holes.begin(), holes.end(),
            [](const Hole& a, const Hole& b) { return a.offset_from_end > b.offset_from_end; });
  size_t cursor = 0;
  for (const Hole& h : holes) {
    const size_t begin = full - h.offset_from_end;
    std::memcpy(out->data() + cursor, built + cursor, begin - cursor);
    size_t at = begin;
    if (h.fill) {
      Status st = h.fill(out->data() + begin);
      if (!st.ok()) return st;
    }
    const bool streaming = h.bytes >= kStreamingCopyBytes;
    for (const Segment& seg : h.segments) {
      const char* from = static_cast<const char*>(seg.source);
      if (streaming) {
        CopyStreaming(out->data() + at, from, seg.bytes);
      } else if (seg.bytes > 0) {
        std::memcpy(out->data() + at, from, seg.bytes);
      }
      at += seg.bytes;
    }
    cursor = begin + h.bytes;
  }
  std::memcpy(out->data() + cursor, built + cursor, size - cursor);
  return out;
}

// Lays out lens and keys (holes that Assemble fills from the caller's arrays), then the
// table over them and values_off, and finishes the buffer.
void FinishKvPairs(flatbuffers::FlatBufferBuilder* fbb, const uint64_t* keys, const uint32_t* lens, size_t num_keys,
                   flatbuffers::Offset<flatbuffers::Vector<float>> values_off, uint8_t op, std::vector<Hole>* holes,
                   Keys written = Keys::kWritten, uint32_t row_len = 0) {
  flatbuffers::Offset<flatbuffers::Vector<uint32_t>> lens_off;
  if (row_len == 0) lens_off = Reserve(fbb, lens, num_keys, holes);
  flatbuffers::Offset<flatbuffers::Vector<uint64_t>> keys_off;
  if (written == Keys::kWritten) keys_off = Reserve(fbb, keys, num_keys, holes);
  fb::KvPairsBuilder kv(*fbb);
  if (written == Keys::kWritten) kv.add_keys(keys_off);
  if (row_len == 0) {
    kv.add_lens(lens_off);
  } else {
    kv.add_row_len(row_len);
  }
  kv.add_values(values_off);
  kv.add_op(op);
  fb::FinishKvPairsBuffer(*fbb, kv.Finish());
}

Result<BufferPtr> EncodeFilled(const uint64_t* keys, size_t num_keys, const uint32_t* lens, uint32_t uniform_len,
                               size_t num_values, const std::function<Status(float*)>& fill, Keys written);

// Of the holes FinishKvPairs reserved (from holes[first] on), the lens' one (the one not
// copying `keys`; its source only sized it) is filled with `len` per key instead.
void FillLensWith(std::vector<Hole>* holes, size_t first, const uint64_t* keys, size_t num_keys, uint32_t len) {
  for (size_t h = first; h < holes->size(); ++h) {
    Hole& hole = (*holes)[h];
    if (hole.segments.front().source == keys) continue;
    hole.segments.clear();
    hole.fill = [num_keys, len](char* dst) {
      std::fill_n(reinterpret_cast<uint32_t*>(dst), num_keys, len);
      return Status::Ok();
    };
  }
}

// A pull request's table over its keys vector (keys_off), finished.
void FinishPullRequest(flatbuffers::FlatBufferBuilder* fbb, flatbuffers::Offset<flatbuffers::Vector<uint64_t>> keys_off) {
  fb::KvPairsBuilder kv(*fbb);
  kv.add_keys(keys_off);
  kv.add_keyless_answer(true);
  fb::FinishKvPairsBuffer(*fbb, kv.Finish());
}

// Marks the builder's uninitialized vector `off` of `count` elements as a hole that
// Assemble fills by calling fill(where its elements go).
template <typename T>
void AddFilledHole(flatbuffers::Offset<flatbuffers::Vector<T>> off, size_t count, std::function<Status(char*)> fill,
                   std::vector<Hole>* holes) {
  if (count == 0) return;
  Hole h;
  h.offset_from_end = off.o - sizeof(flatbuffers::uoffset_t);
  h.bytes = count * sizeof(T);
  h.fill = std::move(fill);
  holes->push_back(std::move(h));
}

// The head of a buffer whose first vector built, of `count` elements of T, is left out:
// the builder laid out a stand-in of `stand_in` elements in its place (from_end: the
// stand-in's bytes after its length field), and the length field, the head's last 4
// bytes, is set to count. The stand-in must be a whole number of 8-byte words shorter
// than the real vector (8, the largest alignment here), so every pad the builder added is
// the one it would add for the real vector; a stand-in that does not end the buffer is
// kInternal.
template <typename T>
Result<BufferPtr> HeadBeforeTail(const flatbuffers::FlatBufferBuilder& fbb, std::vector<Hole> holes, size_t stand_in,
                                 size_t from_end, size_t count) {
  if (from_end != stand_in * sizeof(T)) return Status(Code::kInternal, "KvPairs: the tail vector does not end the buffer");
  Result<BufferPtr> head = Assemble(fbb, std::move(holes), fbb.GetSize() - from_end);
  if (!head.ok()) return head.status();
  // Little-endian like all of flatbuffers.
  flatbuffers::WriteScalar<flatbuffers::uoffset_t>((*head)->data() + (*head)->size() - sizeof(flatbuffers::uoffset_t),
                                                   static_cast<flatbuffers::uoffset_t>(count));
  return head;
}

}  // namespace

BufferPtr EncodeKvPairs(const uint64_t* keys, size_t num_keys, const uint32_t* lens,
                        const float* values, size_t num_values, uint8_t op) {
  if (keys == nullptr) num_keys = 0;
  // Room for all arrays plus skeleton and padding, so the builder never
  // reallocates (a reallocation would copy the reserved arrays).
  const size_t estimate = 128 + num_keys * sizeof(uint64_t) +
                          (lens ? num_keys * sizeof(uint32_t) : 0) +
                          (values ? num_values * sizeof(float) : 0);
  flatbuffers::FlatBufferBuilder fbb(estimate);
  std::vector<Hole> holes;
  flatbuffers::Offset<flatbuffers::Vector<float>> values_off;
  flatbuffers::Offset<flatbuffers::Vector<uint32_t>> lens_off;
  if (values != nullptr) values_off = Reserve(&fbb, values, num_values, &holes);
  if (lens != nullptr) lens_off = Reserve(&fbb, lens, num_keys, &holes);
  auto keys_off = Reserve(&fbb, keys, num_keys, &holes);
  fb::KvPairsBuilder kv(fbb);
  kv.add_keys(keys_off);
  if (lens != nullptr) kv.add_lens(lens_off);
  if (values != nullptr) kv.add_values(values_off);
  kv.add_op(op);
  fb::FinishKvPairsBuffer(fbb, kv.Finish());

  return *Assemble(fbb, std::move(holes));
}

BufferPtr EncodeKvPairsRows(const uint64_t* keys, size_t num_keys, uint32_t row_len, const float* values) {
  if (keys == nullptr || (values == nullptr && row_len > 0)) num_keys = 0;
  const size_t num_values = size_t{row_len} * num_keys;
  flatbuffers::FlatBufferBuilder fbb(128 + num_keys * (sizeof(uint64_t) + sizeof(uint32_t)) +
                                     num_values * sizeof(float));
  std::vector<Hole> holes;
  auto values_off = Reserve(&fbb, values, num_values, &holes);
  const size_t first = holes.size();
  // row_len in place of lens; keys of no floats carry lens of zeros (a row_len of 0 would
  // read as lens absent).
  const uint32_t no_floats = 0;
  FinishKvPairs(&fbb, keys, &no_floats, num_keys, values_off, 0, &holes, Keys::kWritten, row_len);
  if (row_len == 0) FillLensWith(&holes, first, keys, num_keys, 0);
  return *Assemble(fbb, std::move(holes));
}

// Average value bytes per key from which a gather lists each key's values as a piece of its
// own (copied with non-temporal stores when the values are large, kStreamingCopyBytes).
constexpr size_t kGatherPieceBytes = 4096;

namespace {

// Where key i's values lie in a batch: lens[i] floats at values + offsets[i].
struct Listed {
  const uint32_t* lens;
  const uint64_t* offsets;
  uint32_t Len(size_t i) const { return lens[i]; }
  uint64_t Off(size_t i) const { return offsets[i]; }
};
// Rows of one length: row_len floats at values + i * row_len.
struct Rows {
  uint32_t row_len;
  uint32_t Len(size_t) const { return row_len; }
  uint64_t Off(size_t i) const { return uint64_t{i} * row_len; }
};

template <typename Layout>
BufferPtr Gather(const uint64_t* keys, const Layout& at, const float* values, const size_t* indices,
                 size_t num_indices, uint8_t op) {
  constexpr bool kRows = std::is_same<Layout, Rows>::value;
  Hole value_hole;
  size_t num_values = 0;
  bool consecutive = true;  // indices i0, i0 + 1, ...: keys, lens and values are one stretch each
  for (size_t j = 0; j < num_indices; ++j) {
    const size_t i = indices[j];
    num_values += at.Len(i);
    consecutive = consecutive && i == indices[0] + j;
  }
  if (num_indices > 0 && consecutive) {
    value_hole.segments.push_back(Segment{values + at.Off(indices[0]), num_values * sizeof(float)});
  } else if (num_values * sizeof(float) >= kGatherPieceBytes * num_indices) {
    for (size_t j = 0; j < num_indices; ++j) {
      const size_t i = indices[j];
      value_hole.segments.push_back(Segment{values + at.Off(i), at.Len(i) * sizeof(float)});
    }
  } else {
    // Small values: gathered key by key straight into the buffer (no list of pieces).
    value_hole.fill = [=](char* dst) {
      float* out = reinterpret_cast<float*>(dst);
      for (size_t j = 0; j < num_indices; ++j) {
        const size_t i = indices[j];
        const float* from = values + at.Off(i);
        const uint32_t len = at.Len(i);
        if (len == 1) {
          *out = *from;
        } else if (len > 0) {
          std::memcpy(out, from, len * sizeof(float));
        }
        out += len;
      }
      return Status::Ok();
    };
  }
  const size_t estimate = 128 + num_indices * (sizeof(uint64_t) + sizeof(uint32_t)) + num_values * sizeof(float);
  flatbuffers::FlatBufferBuilder fbb(estimate);
  std::vector<Hole> holes;
  float* unused = nullptr;
  auto values_off = fbb.CreateUninitializedVector<float>(num_values, &unused);
  if (num_values > 0) {
    value_hole.offset_from_end = values_off.o - sizeof(flatbuffers::uoffset_t);
    value_hole.bytes = num_values * sizeof(float);
    holes.push_back(std::move(value_hole));
  }
  const bool stretch = num_indices > 0 && consecutive;
  const uint64_t* const keys_from = stretch ? keys + indices[0] : keys;
  const size_t first = holes.size();
  // FinishKvPairs reserves a hole for the keys and one for the lens, each naming where it
  // would copy from. The keys' hole names keys_from: their one stretch (copied as it is)
  // or `keys` (written below, key by key through indices). The lens' hole names lens_from:
  // a stretch of Listed's lens, or null, and then it is written below (rows: the one length).
  // Rows of a length above 0 carry row_len in place of lens.
  const uint32_t* lens_from = nullptr;
  uint32_t row_len = 0;
  if constexpr (kRows) {
    row_len = at.row_len;
  } else {
    lens_from = stretch ? at.lens + indices[0] : nullptr;
  }
  FinishKvPairs(&fbb, keys_from, lens_from, num_indices, values_off, op, &holes, Keys::kWritten, row_len);
  for (size_t h = first; h < holes.size(); ++h) {
    Hole& hole = holes[h];
    if (hole.segments.front().source == keys_from) {
      if (stretch) continue;  // copied as one stretch
      hole.segments.clear();
      hole.fill = [=](char* dst) {
        uint64_t* out = reinterpret_cast<uint64_t*>(dst);
        for (size_t j = 0; j < num_indices; ++j) out[j] = keys[indices[j]];
        return Status::Ok();
      };
    } else if (lens_from == nullptr) {  // written straight into the buffer
      hole.segments.clear();
      hole.fill = [=](char* dst) {
        uint32_t* out = reinterpret_cast<uint32_t*>(dst);
        for (size_t j = 0; j < num_indices; ++j) out[j] = at.Len(indices[j]);
        return Status::Ok();
      };
    }
  }
  return *Assemble(fbb, std::move(holes));
}

}  // namespace

BufferPtr EncodeKvPairsGather(const uint64_t* keys, const uint32_t* lens, const float* values,
                              const uint64_t* value_offsets, const size_t* indices,
                              size_t num_indices, uint8_t op) {
  return Gather(keys, Listed{lens, value_offsets}, values, indices, num_indices, op);
}

BufferPtr EncodeKvPairsGatherRows(const uint64_t* keys, uint32_t row_len, const float* values, const size_t* indices,
                                  size_t num_indices) {
  return Gather(keys, Rows{row_len}, values, indices, num_indices, 0);
}

Result<BufferPtr> EncodeKvPairsFilled(const uint64_t* keys, size_t num_keys, const uint32_t* lens,
                                      size_t num_values, const std::function<Status(float*)>& fill, Keys written) {
  return EncodeFilled(keys, num_keys, lens, 0, num_values, fill, written);
}

Result<BufferPtr> EncodeKvPairsUniform(const uint64_t* keys, size_t num_keys, uint32_t len,
                                       const std::function<Status(float*)>& fill, Keys written) {
  return EncodeFilled(keys, num_keys, nullptr, len, uint64_t{len} * num_keys, fill, written);
}

BufferPtr EncodePullRequest(const uint64_t* keys, size_t num_keys) {
  if (keys == nullptr) num_keys = 0;
  flatbuffers::FlatBufferBuilder fbb(128 + num_keys * sizeof(uint64_t));
  std::vector<Hole> holes;
  FinishPullRequest(&fbb, Reserve(&fbb, keys, num_keys, &holes));
  return *Assemble(fbb, std::move(holes));
}

BufferPtr EncodePullRequestFilled(size_t num_keys, const std::function<void(uint64_t*)>& fill) {
  flatbuffers::FlatBufferBuilder fbb(128 + num_keys * sizeof(uint64_t));
  std::vector<Hole> holes;
  uint64_t* unused = nullptr;
  auto keys_off = fbb.CreateUninitializedVector<uint64_t>(num_keys, &unused);
  AddFilledHole(keys_off, num_keys,
                [&fill](char* dst) {
                  fill(reinterpret_cast<uint64_t*>(dst));
                  return Status::Ok();
                },
                &holes);
  FinishPullRequest(&fbb, keys_off);
  return *Assemble(fbb, std::move(holes));
}

Payload EncodePullRequestShared(const uint64_t* keys, size_t num_keys, std::shared_ptr<const void> owner) {
  if (keys == nullptr || num_keys == 0 || num_keys > FLATBUFFERS_MAX_BUFFER_SIZE / sizeof(uint64_t)) {
    return EncodePullRequest(keys, num_keys);
  }
  flatbuffers::FlatBufferBuilder fbb(128);
  uint64_t* unused = nullptr;
  // The first vector built ends the buffer (flatbuffers builds back to front): the keys
  // are the tail, laid out by a stand-in of one key (HeadBeforeTail; of none, the builder
  // would not align the buffer for keys at all).
  auto keys_off = fbb.CreateUninitializedVector<uint64_t>(1, &unused);
  const size_t from_end = keys_off.o - sizeof(flatbuffers::uoffset_t);
  FinishPullRequest(&fbb, keys_off);
  Result<BufferPtr> head = HeadBeforeTail<uint64_t>(fbb, {}, 1, from_end, num_keys);
  if (!head.ok()) return EncodePullRequest(keys, num_keys);
  Payload out(std::move(*head));
  out.tail.push_back(Slice{std::move(owner), reinterpret_cast<const char*>(keys), num_keys * sizeof(uint64_t)});
  return out;
}

namespace {

// EncodeKvPairsFilled, or with lens null every key's length `uniform_len`, written
// straight into the buffer.
Result<BufferPtr> EncodeFilled(const uint64_t* keys, size_t num_keys, const uint32_t* lens, uint32_t uniform_len,
                               size_t num_values, const std::function<Status(float*)>& fill, Keys written) {
  // flatbuffers keeps its size in 32 bits (and checks the 2 GiB limit only in debug
  // builds): past it the offsets would wrap and the fill write past the buffer.
  if (num_keys > FLATBUFFERS_MAX_BUFFER_SIZE || num_values > FLATBUFFERS_MAX_BUFFER_SIZE ||
      128 + num_keys * (sizeof(uint64_t) + sizeof(uint32_t)) + num_values * sizeof(float) > FLATBUFFERS_MAX_BUFFER_SIZE) {
    return Status(Code::kResourceExhausted, "KvPairs: " + std::to_string(num_keys) + " keys with " +
                                                std::to_string(num_values) + " values exceed the flatbuffers limit");
  }
  const size_t estimate = 128 + num_keys * (sizeof(uint64_t) + sizeof(uint32_t)) + num_values * sizeof(float);
  flatbuffers::FlatBufferBuilder fbb(estimate);
  std::vector<Hole> holes;
  float* unused = nullptr;
  auto values_off = fbb.CreateUninitializedVector<float>(num_values, &unused);
  AddFilledHole(values_off, num_values, [&fill](char* dst) { return fill(reinterpret_cast<float*>(dst)); }, &holes);
  const size_t first = holes.size();
  // Uniform: the lens hole is filled, not copied (its source only sizes it).
  // Rows of one length without keys: row_len says it once (len(values) / row_len keys).
  const uint32_t row_len = lens == nullptr && written == Keys::kLeftOut ? uniform_len : 0;
  FinishKvPairs(&fbb, keys, lens != nullptr ? lens : &uniform_len, num_keys, values_off, /*op=*/0, &holes, written,
                row_len);
  if (lens == nullptr) FillLensWith(&holes, first, keys, num_keys, uniform_len);
  return Assemble(fbb, std::move(holes));
}

}  // namespace

Result<Payload> EncodeKvPairsShared(const uint64_t* keys, size_t num_keys, const uint32_t* lens,
                                    std::vector<Slice> values, uint32_t row_len) {
  size_t value_bytes = 0;
  for (const Slice& s : values) value_bytes += s.size;
  if (value_bytes % sizeof(float) != 0) {
    return Status(Code::kInvalidArgument, "KvPairs: " + std::to_string(value_bytes) + " value bytes are not whole floats");
  }
  const size_t num_values = value_bytes / sizeof(float);
  if (num_values > FLATBUFFERS_MAX_BUFFER_SIZE / sizeof(float)) {
    return Status(Code::kInvalidArgument, "KvPairs: " + std::to_string(num_values) + " values exceed the flatbuffers limit");
  }
  if (lens == nullptr && num_keys > 0 && (row_len == 0 || uint64_t{row_len} * num_keys != num_values)) {
    return Status(Code::kInvalidArgument, "KvPairs: " + std::to_string(num_values) + " values are not " +
                                              std::to_string(num_keys) + " rows of " + std::to_string(row_len));
  }
  if (lens != nullptr) row_len = 0;
  flatbuffers::FlatBufferBuilder fbb(128 + num_keys * (sizeof(uint64_t) + sizeof(uint32_t)));
  std::vector<Hole> holes;
  float* unused = nullptr;
  // The first vector built ends the buffer (flatbuffers builds back to front and floats
  // need no padding after them): the values are the tail, laid out by a stand-in of
  // num_values % 2 floats, the same size modulo 8 (HeadBeforeTail).
  const size_t stand_in = num_values % 2;
  auto values_off = fbb.CreateUninitializedVector<float>(stand_in, &unused);
  const size_t values_from_end = values_off.o - sizeof(flatbuffers::uoffset_t);
  FinishKvPairs(&fbb, keys, lens, num_keys, values_off, /*op=*/0, &holes, Keys::kWritten, row_len);
  Result<BufferPtr> head = HeadBeforeTail<float>(fbb, std::move(holes), stand_in, values_from_end, num_values);
  if (!head.ok()) return head.status();
  Payload out(std::move(*head));
  out.tail = std::move(values);
  return out;
}

Payload SplitValuesTail(BufferPtr encoded, size_t value_bytes) {
  if (!encoded || value_bytes == 0 || value_bytes >= encoded->size()) return Payload(std::move(encoded));
  char* at = encoded->data() + (encoded->size() - value_bytes);
  Payload out(Buffer::View(encoded, encoded->data(), encoded->size() - value_bytes));
  out.tail.push_back(Slice{std::move(encoded), at, value_bytes});
  return out;
}

namespace {

Status Inconsistent(const std::string& what) { return Status(Code::kProtocol, "KvPairs: " + what); }

// Checks the decoded vectors against each other; see DecodeKvPairs.
Status CheckConsistency(const KvView& v, bool has_values, bool expect_values) {
  if (v.lens != nullptr && v.num_lens != v.num_keys) {
    return Inconsistent(std::to_string(v.num_lens) + " lens for " + std::to_string(v.num_keys) +
                        " keys");
  }
  if (!expect_values) {
    if (v.num_values != 0) {
      return Inconsistent("pull request carries " + std::to_string(v.num_values) + " values");
    }
    return Status::Ok();
  }
  if (v.lens == nullptr && v.row_len == 0) {
    return Inconsistent("lens absent for " + std::to_string(v.num_keys) + " keys with values");
  }
  uint64_t sum = uint64_t{v.row_len} * v.num_keys;  // rows of one length (no lens then)
  for (size_t i = 0; i < v.num_lens; ++i) {
    if (sum > UINT64_MAX - v.lens[i]) return Inconsistent("sum of lens overflows");
    sum += v.lens[i];
  }
  // Keys that all hold no floats need no values vector (an encoder leaves an empty one out).
  if (!has_values && sum > 0) return Inconsistent("values absent for a sum of lens " + std::to_string(sum));
  if (sum != v.num_values) {
    return Inconsistent("sum of lens " + std::to_string(sum) + " != " +
                        std::to_string(v.num_values) + " values");
  }
  return Status::Ok();
}

}  // namespace

Result<KvView> DecodeKvPairs(const char* data, size_t size, bool expect_values, bool answer) {
  if (data == nullptr || size == 0) return Status(Code::kInvalidArgument, "KvPairs: empty buffer");
  if (reinterpret_cast<uintptr_t>(data) % alignof(uint64_t) != 0) {
    return Status(Code::kInvalidArgument, "KvPairs: buffer not 8-byte aligned");
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(data);
  flatbuffers::Verifier verifier(bytes, size);
  if (!fb::VerifyKvPairsBuffer(verifier)) {
    return Status(Code::kInvalidArgument,
                  "KvPairs: " + std::to_string(size) + " bytes fail flatbuffers verification");
  }
  const fb::KvPairs* kv = fb::GetKvPairs(bytes);
  KvView v;
  if (kv->keys() != nullptr) {
    v.keys = kv->keys()->data();
    v.num_keys = kv->keys()->size();
  } else if (!answer) {
    return Inconsistent("keys absent");
  } else if (kv->lens() != nullptr) {
    v.num_keys = kv->lens()->size();  // an answer without keys: one len per key asked
  } else if (kv->row_len() > 0 && kv->values() != nullptr && kv->values()->size() % kv->row_len() == 0) {
    v.row_len = kv->row_len();  // ... or rows of one length
    v.num_keys = kv->values()->size() / v.row_len;
  } else {
    return Inconsistent("keys and lens absent, and no row_len that divides " +
                        std::to_string(kv->values() ? kv->values()->size() : 0) + " values");
  }
  // The verifier only aligns a vector's length field to 4; uint64 keys need 8. An empty
  // vector reads nothing (and flatbuffers does not pad one), so only keys are checked.
  if (v.keys != nullptr && v.num_keys > 0 && reinterpret_cast<uintptr_t>(v.keys) % alignof(uint64_t) != 0) {
    return Inconsistent("keys not 8-byte aligned");
  }
  if (kv->lens() != nullptr) {
    v.lens = kv->lens()->data();
    v.num_lens = kv->lens()->size();
  } else if (kv->keys() != nullptr) {
    v.row_len = kv->row_len();  // a push of rows of one length (0: lens absent)
  }
  if (kv->values() != nullptr) {
    v.values = kv->values()->data();
    v.num_values = kv->values()->size();
  }
  v.op = kv->op();
  v.keyless_answer = kv->keyless_answer();
  PSCORE_RETURN_IF_ERROR(CheckConsistency(v, kv->values() != nullptr, expect_values));
  return v;
}

Result<KvView> DecodeKvPairsHead(char* head, size_t size, uint64_t tail_bytes, bool answer) {
  if (head == nullptr || size < sizeof(uint32_t)) return Status(Code::kInvalidArgument, "KvPairs head: too short");
  if (tail_bytes % sizeof(float) != 0 || tail_bytes / sizeof(float) > UINT32_MAX) {
    return Inconsistent("head followed by " + std::to_string(tail_bytes) + " bytes, not a float count");
  }
  // The head ends with the values' length field; zeroed, the head is a whole KvPairs with
  // empty values, which the verifier checks without reading past it.
  char* count_field = head + size - sizeof(uint32_t);
  const uint64_t count = GetLe(count_field, sizeof(uint32_t));
  if (count * sizeof(float) != tail_bytes) {
    return Inconsistent("values' count " + std::to_string(count) + " in the head, " + std::to_string(tail_bytes) +
                        " bytes after it");
  }
  PutLe(0, sizeof(uint32_t), count_field);
  Result<KvView> v = DecodeKvPairs(head, size, /*expect_values=*/false, answer);
  PutLe(count, sizeof(uint32_t), count_field);
  if (!v.ok()) return v.status();
  if (v->values != reinterpret_cast<const float*>(head + size)) {
    return Inconsistent("values do not end the head");
  }
  if (v->lens == nullptr && v->row_len == 0 && v->num_keys > 0) {
    return Inconsistent("lens absent for keys with values");
  }
  uint64_t sum = uint64_t{v->row_len} * (v->lens == nullptr ? v->num_keys : 0);
  for (size_t i = 0; i < v->num_lens; ++i) sum += v->lens[i];
  if (sum != count) {
    return Inconsistent("lens sum to " + std::to_string(sum) + ", the tail holds " + std::to_string(count) +
                        " values");
  }
  v->values = nullptr;
  v->num_values = count;
  return v;
}

}  // namespace core
}  // namespace pscore
