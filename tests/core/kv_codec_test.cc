#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "pscore/core/kv_codec.h"
#include "pscore/proto/kv_generated.h"

// Catch2 last: glog (via pscore/core/status.h) also defines CHECK, and the last
// definition wins. We want Catch's.
#include <catch2/catch.hpp>

namespace pscore {
namespace core {
namespace {

// A builder-made KvPairs with arbitrary (possibly inconsistent) vectors, so
// the decoder's consistency checks can be exercised.
BufferPtr RawKvPairs(const std::vector<uint64_t>* keys, const std::vector<uint32_t>* lens,
                     const std::vector<float>* values) {
  flatbuffers::FlatBufferBuilder fbb;
  auto k = keys ? fbb.CreateVector(*keys) : 0;
  auto l = lens ? fbb.CreateVector(*lens) : 0;
  auto v = values ? fbb.CreateVector(*values) : 0;
  fb::FinishKvPairsBuffer(fbb, fb::CreateKvPairs(fbb, k, l, v, 0));
  return Buffer::Copy(fbb.GetBufferPointer(), fbb.GetSize());
}

TEST_CASE("kv pairs round trip in place", "[core][kvcodec]") {
  const std::vector<uint64_t> keys = {0, 42, UINT64_MAX};
  const std::vector<uint32_t> lens = {2, 0, 3};
  const std::vector<float> values = {1.5f, -2.0f, 3.0f, 4.0f, 5.25f};
  BufferPtr buf = EncodeKvPairs(keys.data(), keys.size(), lens.data(), values.data(),
                                values.size(), /*op=*/7);
  Result<KvView> r = DecodeKvPairs(buf->data(), buf->size(), /*expect_values=*/true);
  REQUIRE(r.ok());
  const KvView& v = *r;
  CHECK(std::vector<uint64_t>(v.keys, v.keys + v.num_keys) == keys);
  CHECK(std::vector<uint32_t>(v.lens, v.lens + v.num_lens) == lens);
  CHECK(std::vector<float>(v.values, v.values + v.num_values) == values);
  CHECK(v.op == 7);
  // In place: the view points into the buffer, not into a copy.
  CHECK(reinterpret_cast<const char*>(v.values) >= buf->data());
  CHECK(reinterpret_cast<const char*>(v.values + v.num_values) <= buf->data() + buf->size());
}

TEST_CASE("pull request has keys only - large batches round trip", "[core][kvcodec]") {
  std::vector<uint64_t> keys(1000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 977;
  BufferPtr pull = EncodeKvPairs(keys.data(), keys.size(), nullptr, nullptr, 0);
  Result<KvView> r = DecodeKvPairs(pull->data(), pull->size(), /*expect_values=*/false);
  REQUIRE(r.ok());
  CHECK(std::vector<uint64_t>(r->keys, r->keys + r->num_keys) == keys);
  CHECK(r->lens == nullptr);
  CHECK(r->values == nullptr);
  CHECK(r->op == 0);
  // A pull request is not a push.
  CHECK(DecodeKvPairs(pull->data(), pull->size(), true).status().code() == Code::kProtocol);

  std::vector<uint32_t> lens(keys.size(), 64);
  std::vector<float> values(keys.size() * 64);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  BufferPtr push = EncodeKvPairs(keys.data(), keys.size(), lens.data(), values.data(),
                                 values.size());
  Result<KvView> p = DecodeKvPairs(push->data(), push->size(), true);
  REQUIRE(p.ok());
  CHECK(std::vector<float>(p->values, p->values + p->num_values) == values);
  CHECK(std::vector<uint64_t>(p->keys, p->keys + p->num_keys) == keys);

  BufferPtr empty = EncodeKvPairs(nullptr, 0, nullptr, nullptr, 0);
  Result<KvView> e = DecodeKvPairs(empty->data(), empty->size(), false);
  REQUIRE(e.ok());
  CHECK(e->num_keys == 0);
}

TEST_CASE("lens that do not match keys are refused", "[core][kvcodec]") {
  const std::vector<uint64_t> keys = {1, 2, 3};
  const std::vector<uint32_t> lens = {1, 1};
  const std::vector<float> values = {1, 2};
  BufferPtr buf = RawKvPairs(&keys, &lens, &values);
  Result<KvView> r = DecodeKvPairs(buf->data(), buf->size(), true);
  CHECK(r.status().code() == Code::kProtocol);
  CHECK_THAT(r.status().message(), Catch::Contains("2 lens for 3 keys"));
  CHECK(DecodeKvPairs(buf->data(), buf->size(), false).status().code() == Code::kProtocol);
}

TEST_CASE("sum of lens must equal the value count", "[core][kvcodec]") {
  const std::vector<uint64_t> keys = {1, 2};
  const std::vector<uint32_t> lens = {2, 2};
  const std::vector<float> values = {1, 2, 3};
  BufferPtr buf = EncodeKvPairs(keys.data(), keys.size(), lens.data(), values.data(),
                                values.size());
  Result<KvView> r = DecodeKvPairs(buf->data(), buf->size(), true);
  CHECK(r.status().code() == Code::kProtocol);
  CHECK_THAT(r.status().message(), Catch::Contains("sum of lens 4 != 3 values"));

  const std::vector<uint32_t> huge = {UINT32_MAX, UINT32_MAX};  // No wrap to a small sum.
  BufferPtr big = EncodeKvPairs(keys.data(), keys.size(), huge.data(), values.data(), 3);
  CHECK(DecodeKvPairs(big->data(), big->size(), true).status().code() == Code::kProtocol);

  // Values absent: keys that hold no floats decode, keys that hold some do not.
  const std::vector<uint32_t> zeros = {0, 0};
  BufferPtr empty_rows = RawKvPairs(&keys, &zeros, nullptr);
  Result<KvView> er = DecodeKvPairs(empty_rows->data(), empty_rows->size(), true);
  REQUIRE(er.ok());
  CHECK(er->num_keys == 2);
  CHECK(er->num_values == 0);
  BufferPtr absent = RawKvPairs(&keys, &lens, nullptr);
  Result<KvView> ab = DecodeKvPairs(absent->data(), absent->size(), true);
  CHECK(ab.status().code() == Code::kProtocol);
  CHECK_THAT(ab.status().message(), Catch::Contains("values absent for a sum of lens 4"));

  BufferPtr no_keys = RawKvPairs(nullptr, &lens, &values);
  Result<KvView> nk = DecodeKvPairs(no_keys->data(), no_keys->size(), true);
  CHECK_THAT(nk.status().message(), Catch::Contains("keys absent"));
}

TEST_CASE("every truncation of a valid buffer is refused without crashing", "[core][kvcodec]") {
  const std::vector<uint64_t> keys = {5, 6};
  const std::vector<uint32_t> lens = {1, 2};
  const std::vector<float> values = {1, 2, 3};
  BufferPtr buf = EncodeKvPairs(keys.data(), keys.size(), lens.data(), values.data(), 3);
  REQUIRE(DecodeKvPairs(buf->data(), buf->size(), true).ok());
  for (size_t len = 0; len < buf->size(); ++len) {
    INFO("truncated to " << len << " of " << buf->size());
    BufferPtr cut = Buffer::Copy(buf->data(), len);  // Own aligned allocation.
    CHECK_FALSE(DecodeKvPairs(cut->data(), cut->size(), true).ok());
  }
}

TEST_CASE("random bytes are refused", "[core][kvcodec]") {
  std::mt19937 rng(7);
  int accepted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    BufferPtr junk = Buffer::Allocate(1 + rng() % 200);
    for (size_t i = 0; i < junk->size(); ++i) junk->data()[i] = static_cast<char>(rng());
    Result<KvView> r = DecodeKvPairs(junk->data(), junk->size(), true);
    if (r.ok()) {
      ++accepted;
      continue;
    }
    CHECK((r.status().code() == Code::kInvalidArgument || r.status().code() == Code::kProtocol));
  }
  CHECK(accepted == 0);

  BufferPtr ok = EncodeKvPairs(nullptr, 0, nullptr, nullptr, 0);
  BufferPtr shifted = Buffer::Allocate(ok->size() + 1);
  std::memcpy(shifted->data() + 1, ok->data(), ok->size());
  CHECK(DecodeKvPairs(shifted->data() + 1, ok->size(), false).status().code() ==
        Code::kInvalidArgument);
  CHECK(DecodeKvPairs(nullptr, 0, false).status().code() == Code::kInvalidArgument);
}

}  // namespace
}  // namespace core
}  // namespace pscore

namespace pscore::core {

namespace {

// Rows of one length decode to the keys, lengths and values the encoding with a lens array
// gives: with row_len in place of the lens (4 bytes a key less), or, for rows of no floats,
// as the same bytes.
void CheckRowsLike(const BufferPtr& rows, const BufferPtr& want, uint32_t row) {
  Result<KvView> got = DecodeKvPairs(rows->data(), rows->size(), /*expect_values=*/true);
  Result<KvView> ref = DecodeKvPairs(want->data(), want->size(), /*expect_values=*/true);
  REQUIRE(got.ok());
  REQUIRE(ref.ok());
  REQUIRE(got->num_keys == ref->num_keys);
  CHECK(std::equal(got->keys, got->keys + got->num_keys, ref->keys));
  for (size_t i = 0; i < got->num_keys; ++i) REQUIRE(got->Len(i) == row);
  REQUIRE(got->num_values == ref->num_values);
  CHECK(std::equal(got->values, got->values + got->num_values, ref->values));
  if (row == 0) {
    CHECK(rows->view() == want->view());
  } else {
    CHECK(got->lens == nullptr);
    CHECK(got->row_len == row);
    CHECK(rows->size() <= want->size() - 4 * got->num_keys + 8);  // at most a pad apart
  }
}

// A push of `keys` with row_len set and, optionally, lens and values, built by hand.
BufferPtr HandMadePush(const std::vector<uint64_t>& keys, uint32_t row_len, const std::vector<uint32_t>* lens,
                       const std::vector<float>& values) {
  flatbuffers::FlatBufferBuilder fbb;
  auto values_off = fbb.CreateVector(values);
  flatbuffers::Offset<flatbuffers::Vector<uint32_t>> lens_off;
  if (lens != nullptr) lens_off = fbb.CreateVector(*lens);
  auto keys_off = fbb.CreateVector(keys);
  fb::KvPairsBuilder kv(fbb);
  kv.add_keys(keys_off);
  if (lens != nullptr) kv.add_lens(lens_off);
  kv.add_values(values_off);
  kv.add_row_len(row_len);
  fb::FinishKvPairsBuffer(fbb, kv.Finish());
  return Buffer::Copy(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}

}  // namespace

TEST_CASE("a push's row_len must make up its values exactly, and lens win over it", "[core][kvcodec]") {
  const std::vector<uint64_t> keys = {4, 9, 16};
  const std::vector<float> six = {1, 2, 3, 4, 5, 6};
  BufferPtr ok = HandMadePush(keys, 2, nullptr, six);
  Result<KvView> v = DecodeKvPairs(ok->data(), ok->size(), /*expect_values=*/true);
  REQUIRE(v.ok());
  CHECK(v->lens == nullptr);
  CHECK(v->row_len == 2);
  CHECK(v->Len(2) == 2);
  CHECK(v->Lengths().uniform());
  // Too few and too many values for three rows of two.
  const std::vector<float> five = {1, 2, 3, 4, 5};
  const std::vector<float> seven = {1, 2, 3, 4, 5, 6, 7};
  for (const std::vector<float>* values : {&five, &seven}) {
    BufferPtr bad = HandMadePush(keys, 2, nullptr, *values);
    CHECK(DecodeKvPairs(bad->data(), bad->size(), true).status().code() == Code::kProtocol);
  }
  // A row_len of 0 is lens absent: refused for a push.
  BufferPtr none = HandMadePush(keys, 0, nullptr, six);
  CHECK(DecodeKvPairs(none->data(), none->size(), true).status().code() == Code::kProtocol);
  // Lens present: they say each key's length, row_len is not read.
  const std::vector<uint32_t> lens = {1, 2, 3};
  BufferPtr both = HandMadePush(keys, 5, &lens, six);
  Result<KvView> b = DecodeKvPairs(both->data(), both->size(), true);
  REQUIRE(b.ok());
  CHECK(b->row_len == 0);
  CHECK(b->Len(2) == 3);
  // The same bytes as a pull request: values must be absent or empty.
  CHECK(DecodeKvPairs(ok->data(), ok->size(), /*expect_values=*/false).status().code() == Code::kProtocol);
}

TEST_CASE("a push of rows of one length carries row_len in place of lens", "[core][kvcodec]") {
  for (size_t nkeys : {0, 1, 2, 3, 7, 100001}) {
    for (uint32_t row : {0u, 1u, 3u, 64u}) {
      INFO(nkeys << " keys of " << row << " floats");
      std::vector<uint64_t> keys(nkeys);
      for (size_t i = 0; i < nkeys; ++i) keys[i] = i * 7919 + 1;
      std::vector<float> values(nkeys * row);
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1001) * 0.5f;
      const std::vector<uint32_t> lens(nkeys, row);
      const float none = 0;  // present but empty, as a caller's empty vector may give
      const float* v = values.empty() ? &none : values.data();
      BufferPtr rows = EncodeKvPairsRows(keys.data(), nkeys, row, v);
      const uint32_t no_len = 0;  // no keys: lens.data() may be null, which leaves lens out
      BufferPtr want = EncodeKvPairs(keys.data(), nkeys, nkeys > 0 ? lens.data() : &no_len, v, values.size());
      CheckRowsLike(rows, want, row);
      Result<KvView> d = DecodeKvPairs(rows->data(), rows->size(), /*expect_values=*/true);
      REQUIRE(d.ok());
      CHECK(d->num_keys == nkeys);
      CHECK(std::vector<float>(d->values, d->values + d->num_values) == values);
    }
  }
}

TEST_CASE("a gather of rows of one length decodes as the gather with lens and offsets arrays", "[core][kvcodec]") {
  // Indices consecutive (one stretch), scattered, and rows small (gathered key by key) or
  // large (a piece per key: 1,024 floats is kGatherPieceBytes).
  const size_t nkeys = 3000;
  std::vector<uint64_t> keys(nkeys);
  for (size_t i = 0; i < nkeys; ++i) keys[i] = i * 7919 + 1;
  for (uint32_t row : {0u, 1u, 3u, 1024u}) {
    std::vector<float> values(nkeys * row);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1001) * 0.5f;
    const float none = 0;
    const float* v = values.empty() ? &none : values.data();
    const std::vector<uint32_t> lens(nkeys, row);
    std::vector<uint64_t> offsets(nkeys);
    for (size_t i = 0; i < nkeys; ++i) offsets[i] = uint64_t{i} * row;
    std::vector<size_t> stretch(500);
    std::iota(stretch.begin(), stretch.end(), size_t{1200});
    std::vector<size_t> scattered;
    for (size_t i = 0; i < nkeys; i += 7) scattered.push_back((i * 13) % nkeys);
    for (const std::vector<size_t>* pick : {&stretch, &scattered}) {
      INFO(pick->size() << " keys of " << row << " floats");
      BufferPtr got = EncodeKvPairsGatherRows(keys.data(), row, v, pick->data(), pick->size());
      BufferPtr want =
          EncodeKvPairsGather(keys.data(), lens.data(), v, offsets.data(), pick->data(), pick->size());
      CheckRowsLike(got, want, row);
      Result<KvView> d = DecodeKvPairs(got->data(), got->size(), /*expect_values=*/true);
      REQUIRE(d.ok());
      REQUIRE(d->num_keys == pick->size());
      for (size_t j = 0; j < pick->size(); ++j) {
        REQUIRE(d->keys[j] == keys[(*pick)[j]]);
        REQUIRE(d->Len(j) == row);
        for (uint32_t f = 0; f < row; ++f) REQUIRE(d->values[j * row + f] == values[(*pick)[j] * row + f]);
      }
    }
  }
}

TEST_CASE("gather encoding of a subset equals encoding the gathered arrays", "[core][kvcodec]") {
  std::vector<uint64_t> keys = {10, 11, 12, 13};
  std::vector<uint32_t> lens = {1, 3, 0, 2};
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  std::vector<uint64_t> offsets = {0, 1, 4, 4};
  std::vector<size_t> pick = {3, 1, 2};
  BufferPtr got = EncodeKvPairsGather(keys.data(), lens.data(), values.data(), offsets.data(), pick.data(),
                                      pick.size(), 2);
  Result<KvView> v = DecodeKvPairs(got->data(), got->size(), true);
  REQUIRE(v.ok());
  REQUIRE(v->num_keys == 3);
  CHECK(v->keys[0] == 13);
  CHECK(v->keys[1] == 11);
  CHECK(v->keys[2] == 12);
  CHECK(v->lens[0] == 2);
  CHECK(v->lens[1] == 3);
  CHECK(v->lens[2] == 0);
  REQUIRE(v->num_values == 5);
  std::vector<float> flat(v->values, v->values + v->num_values);
  CHECK((flat == std::vector<float>{5, 6, 2, 3, 4}));
  CHECK(v->op == 2);
}

TEST_CASE("gather encoding of many small keys, consecutive or not, equals encoding the gathered arrays",
          "[core][kvcodec]") {
  std::vector<uint64_t> keys;
  std::vector<uint32_t> lens;
  std::vector<uint64_t> offsets;
  std::vector<float> values;
  for (uint64_t i = 0; i < 5000; ++i) {
    keys.push_back(i * 7919);
    lens.push_back(static_cast<uint32_t>(i % 3 == 0 ? 1 : i % 5));
    offsets.push_back(values.size());
    for (uint32_t j = 0; j < lens.back(); ++j) values.push_back(static_cast<float>(values.size()));
  }
  std::vector<size_t> consecutive, every_third;
  for (size_t i = 100; i < 4100; ++i) consecutive.push_back(i);
  for (size_t i = 2; i < keys.size(); i += 3) every_third.push_back(i);
  for (const std::vector<size_t>* pick : {&consecutive, &every_third}) {
    BufferPtr got = EncodeKvPairsGather(keys.data(), lens.data(), values.data(), offsets.data(), pick->data(),
                                        pick->size(), 0);
    Result<KvView> v = DecodeKvPairs(got->data(), got->size(), true);
    REQUIRE(v.ok());
    REQUIRE(v->num_keys == pick->size());
    std::vector<float> want;
    for (size_t j = 0; j < pick->size(); ++j) {
      const size_t i = (*pick)[j];
      CHECK(v->keys[j] == keys[i]);
      CHECK(v->lens[j] == lens[i]);
      for (uint32_t f = 0; f < lens[i]; ++f) want.push_back(values[offsets[i] + f]);
    }
    CHECK(std::vector<float>(v->values, v->values + v->num_values) == want);
  }
}

TEST_CASE("gather encoding of large values copies every float exactly - whatever the lengths and offsets",
          "[core][kvcodec]") {
  // Over kStreamingCopyBytes (256 KiB) of values: filled with non-temporal stores, in 64-byte
  // blocks after a lead that aligns the destination. Lengths of 0, 1, 3, 15, 16, 17 floats
  // and large odd ones, at odd offsets, put every lead and remainder in play.
  const std::vector<uint32_t> lens = {1, 0, 3, 15, 16, 17, 70001, 5, 65536, 31, 1};
  std::vector<uint64_t> keys, offsets;
  uint64_t total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    keys.push_back(100 + i);
    offsets.push_back(total + 1);  // values start one float in: sources are not 16-byte aligned
    total += lens[i] + 1;
  }
  std::vector<float> values(total + 1);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  std::vector<size_t> pick = {6, 0, 3, 4, 8, 5, 9, 2, 10, 7, 1};  // not in position order
  BufferPtr got = EncodeKvPairsGather(keys.data(), lens.data(), values.data(), offsets.data(), pick.data(),
                                      pick.size(), 1);
  Result<KvView> v = DecodeKvPairs(got->data(), got->size(), true);
  REQUIRE(v.ok());
  REQUIRE(v->num_keys == pick.size());
  std::vector<float> want;
  for (size_t i : pick) {
    for (uint32_t j = 0; j < lens[i]; ++j) want.push_back(values[offsets[i] + j]);
  }
  REQUIRE(v->num_values * sizeof(float) >= (256u << 10));
  std::vector<float> flat(v->values, v->values + v->num_values);
  CHECK(flat == want);
  for (size_t j = 0; j < pick.size(); ++j) {
    CHECK(v->keys[j] == keys[pick[j]]);
    CHECK(v->lens[j] == lens[pick[j]]);
  }
}

}  // namespace pscore::core

namespace pscore::core {

TEST_CASE("shared encoding puts the values after the head and decodes as an ordinary buffer", "[core][kvcodec]") {
  const std::vector<uint64_t> keys = {4, 8, 15};
  const std::vector<uint32_t> lens = {3, 0, 2};
  const std::vector<float> a = {1, 2, 3};
  const std::vector<float> b = {4, 5};
  std::vector<Slice> slices = {Slice{nullptr, reinterpret_cast<const char*>(a.data()), 12},
                               Slice{nullptr, nullptr, 0},
                               Slice{nullptr, reinterpret_cast<const char*>(b.data()), 8}};
  Result<Payload> p = EncodeKvPairsShared(keys.data(), keys.size(), lens.data(), slices);
  REQUIRE(p.ok());
  REQUIRE(p->tail.size() == 3);
  CHECK(p->tail[0].data == slices[0].data);  // not copied
  BufferPtr flat = p->Flatten();
  CHECK(flat->size() == p->head->size() + 20);
  // Equal to the copying encoder's bytes.
  const std::vector<float> all = {1, 2, 3, 4, 5};
  BufferPtr copied = EncodeKvPairs(keys.data(), keys.size(), lens.data(), all.data(), all.size());
  CHECK(flat->view() == copied->view());
  Result<KvView> v = DecodeKvPairs(flat->data(), flat->size(), /*expect_values=*/true);
  REQUIRE(v.ok());
  CHECK(std::vector<float>(v->values, v->values + v->num_values) == all);
  CHECK(std::vector<uint32_t>(v->lens, v->lens + v->num_lens) == lens);
  // No keys at all still makes a valid buffer; bytes that are not whole floats do not.
  Result<Payload> empty = EncodeKvPairsShared(nullptr, 0, nullptr, {});
  REQUIRE(empty.ok());
  CHECK(DecodeKvPairs(empty->head->data(), empty->head->size(), true).ok());
  Result<Payload> odd = EncodeKvPairsShared(keys.data(), 1, lens.data(), {Slice{nullptr, "abc", 3}});
  CHECK(odd.status().code() == Code::kInvalidArgument);
  // Byte for byte the copying encoder's buffer for even and odd counts of values and keys
  // (the head is laid out without the values, then given their length).
  for (size_t nkeys : {1, 2, 3, 5}) {
    for (uint32_t per_key : {0u, 1u, 2u, 3u, 7u, 1000u, 16385u}) {
      std::vector<uint64_t> ks(nkeys);
      std::vector<uint32_t> ls(nkeys, per_key);
      std::vector<float> vs(nkeys * per_key);
      for (size_t i = 0; i < ks.size(); ++i) ks[i] = i * 977 + 1;
      for (size_t i = 0; i < vs.size(); ++i) vs[i] = static_cast<float>(i) * 0.5f;
      std::vector<Slice> tail;
      for (size_t i = 0; i < nkeys; ++i) {
        tail.push_back(Slice{nullptr, reinterpret_cast<const char*>(vs.data() + i * per_key), per_key * sizeof(float)});
      }
      Result<Payload> shared = EncodeKvPairsShared(ks.data(), nkeys, ls.data(), tail);
      REQUIRE(shared.ok());
      CHECK(shared->head->size() < 128 + nkeys * 16);  // the values never went into the head
      const float none = 0;  // values present but empty (a null pointer would leave them out)
      BufferPtr want = EncodeKvPairs(ks.data(), nkeys, ls.data(), vs.empty() ? &none : vs.data(), vs.size());
      INFO(nkeys << " keys of " << per_key << " floats");
      CHECK(shared->Flatten()->view() == want->view());
    }
  }
}

TEST_CASE("shared encoding of rows of one length has the rows encoder's bytes - and refuses values that are not the rows",
          "[core][kvcodec]") {
  for (size_t nkeys : {1, 2, 3, 5, 1000}) {
    for (uint32_t row_len : {1u, 2u, 3u, 64u}) {
      std::vector<uint64_t> ks(nkeys);
      std::vector<float> vs(nkeys * row_len);
      for (size_t i = 0; i < ks.size(); ++i) ks[i] = i * 977 + 1;
      for (size_t i = 0; i < vs.size(); ++i) vs[i] = static_cast<float>(i) * 0.25f;
      // One slice for all the rows, as a ZPush to one server sends them.
      Result<Payload> shared = EncodeKvPairsShared(
          ks.data(), nkeys, nullptr, {Slice{nullptr, reinterpret_cast<const char*>(vs.data()), vs.size() * sizeof(float)}},
          row_len);
      REQUIRE(shared.ok());
      REQUIRE(shared->tail.size() == 1);
      CHECK(shared->tail[0].data == reinterpret_cast<const char*>(vs.data()));  // not copied
      CHECK(shared->head->size() < 128 + nkeys * sizeof(uint64_t));  // keys, but no lens and no values
      INFO(nkeys << " keys of " << row_len << " floats");
      CHECK(shared->Flatten()->view() == EncodeKvPairsRows(ks.data(), nkeys, row_len, vs.data())->view());
      Result<KvView> v = DecodeKvPairsHead(shared->head->data(), shared->head->size(), vs.size() * sizeof(float));
      REQUIRE(v.ok());
      CHECK(v->lens == nullptr);
      CHECK(v->row_len == row_len);
      CHECK(v->num_keys == nkeys);
    }
  }
  const std::vector<uint64_t> keys = {1, 2, 3};
  const std::vector<float> five(5, 1.0f);
  const Slice slice{nullptr, reinterpret_cast<const char*>(five.data()), five.size() * sizeof(float)};
  // Five floats are not three rows of 2, nor of anything when row_len is 0 and lens null.
  CHECK(EncodeKvPairsShared(keys.data(), keys.size(), nullptr, {slice}, 2).status().code() == Code::kInvalidArgument);
  CHECK(EncodeKvPairsShared(keys.data(), keys.size(), nullptr, {slice}, 0).status().code() == Code::kInvalidArgument);
  // Lens given: row_len is not used.
  const std::vector<uint32_t> lens = {2, 0, 3};
  Result<Payload> with_lens = EncodeKvPairsShared(keys.data(), keys.size(), lens.data(), {slice}, 7);
  REQUIRE(with_lens.ok());
  CHECK(with_lens->Flatten()->view() ==
        EncodeKvPairs(keys.data(), keys.size(), lens.data(), five.data(), five.size())->view());
}

TEST_CASE("a head's size bounds its key count from below - for lens and rows, shared and split encodings",
          "[core][kvcodec]") {
  for (size_t nkeys : {0, 1, 2, 3, 5, 8, 100, 1001, 100000}) {
    for (uint32_t per_key : {1u, 3u, 16384u}) {
      if (uint64_t{nkeys} * per_key > (uint64_t{1} << 24)) continue;  // 64 MB of values at most
      std::vector<uint64_t> ks(nkeys, 7);
      std::vector<uint32_t> ls(nkeys, per_key);
      std::vector<float> vs(nkeys * per_key + 1, 1.0f);
      const Slice all{nullptr, reinterpret_cast<const char*>(vs.data()), nkeys * per_key * sizeof(float)};
      Result<Payload> with_lens = EncodeKvPairsShared(ks.data(), nkeys, ls.data(), {all});
      Result<Payload> rows = EncodeKvPairsShared(ks.data(), nkeys, nullptr, {all}, per_key);
      REQUIRE(with_lens.ok());
      REQUIRE(rows.ok());
      Payload split = SplitValuesTail(EncodeKvPairs(ks.data(), nkeys, ls.data(), vs.data(), nkeys * per_key),
                                      nkeys * per_key * sizeof(float));
      INFO(nkeys << " keys of " << per_key << " floats");
      for (const BufferPtr& head : {with_lens->head, rows->head, split.head}) {
        CHECK(FewestKeysInHead(head->size()) <= nkeys);
        // Tight enough to tell many small keys from a few large ones by the head alone.
        CHECK(FewestKeysInHead(head->size()) >= (nkeys > 32 ? nkeys / 2 : 0));
      }
    }
  }
}

TEST_CASE("a pull request written from the caller's keys, or gathered into place, has the copying encoder's bytes",
          "[core][kvcodec]") {
  for (size_t nkeys : {1, 2, 3, 8, 9, 8192, 100001}) {
    INFO(nkeys << " keys");
    auto keys = std::make_shared<std::vector<uint64_t>>(nkeys);
    for (size_t i = 0; i < nkeys; ++i) (*keys)[i] = i * 0x9E3779B97F4A7C15ULL + 3;
    Payload shared = EncodePullRequestShared(keys->data(), nkeys, std::shared_ptr<const void>(keys, keys->data()));
    REQUIRE(shared.tail.size() == 1);
    CHECK(shared.tail[0].data == reinterpret_cast<const char*>(keys->data()));  // not copied
    CHECK(shared.tail[0].size == nkeys * sizeof(uint64_t));
    CHECK(shared.head->size() < 64);
    BufferPtr want = EncodePullRequest(keys->data(), nkeys);
    BufferPtr flat = shared.Flatten();
    CHECK(flat->view() == want->view());
    // Every other key of a twice larger array, gathered by the fill.
    std::vector<uint64_t> larger(2 * nkeys);
    for (size_t i = 0; i < nkeys; ++i) larger[2 * i + 1] = (*keys)[i];
    BufferPtr gathered = EncodePullRequestFilled(nkeys, [&](uint64_t* dst) {
      CHECK(reinterpret_cast<uintptr_t>(dst) % alignof(uint64_t) == 0);
      for (size_t i = 0; i < nkeys; ++i) dst[i] = larger[2 * i + 1];
    });
    CHECK(gathered->view() == want->view());
    Result<KvView> v = DecodeKvPairs(flat->data(), flat->size(), /*expect_values=*/false);
    REQUIRE(v.ok());
    CHECK(v->keyless_answer);
    CHECK(std::vector<uint64_t>(v->keys, v->keys + v->num_keys) == *keys);
    // The slice holds the keys alive.
    std::weak_ptr<std::vector<uint64_t>> gone = keys;
    keys.reset();
    CHECK_FALSE(gone.expired());
    shared = Payload();
    CHECK(gone.expired());
  }
  // No keys: the copying encoder's request, without a tail.
  Payload none = EncodePullRequestShared(nullptr, 0, nullptr);
  CHECK(none.tail.empty());
  CHECK(none.head->view() == EncodePullRequest(nullptr, 0)->view());
  CHECK(EncodePullRequestFilled(0, [](uint64_t*) { FAIL("no keys to fill"); })->view() == none.head->view());
}

TEST_CASE("a copied encoding split before its values has the head of the shared encoding - without a copy",
          "[core][kvcodec]") {
  for (size_t nkeys : {1, 2, 3, 5}) {
    for (uint32_t per_key : {1u, 2u, 3u, 7u, 16385u}) {
      INFO(nkeys << " keys of " << per_key << " floats");
      std::vector<uint64_t> ks(nkeys);
      std::vector<uint32_t> ls(nkeys, per_key);
      std::vector<float> vs(nkeys * per_key);
      for (size_t i = 0; i < nkeys; ++i) ks[i] = i * 131 + 7;
      for (size_t i = 0; i < vs.size(); ++i) vs[i] = static_cast<float>(i) + 0.25f;
      const uint64_t value_bytes = vs.size() * sizeof(float);
      BufferPtr encoded = EncodeKvPairs(ks.data(), nkeys, ls.data(), vs.data(), vs.size());
      const std::string whole(encoded->view());
      Payload split = SplitValuesTail(encoded, value_bytes);
      REQUIRE(split.head != nullptr);
      REQUIRE(split.tail.size() == 1);
      CHECK(split.head->data() == encoded->data());  // views of the encoded bytes
      CHECK(split.tail[0].data == encoded->data() + whole.size() - value_bytes);
      CHECK(split.tail[0].size == value_bytes);
      CHECK(split.Flatten()->view() == whole);
      // The head is the one EncodeKvPairsShared makes, and decodes apart from the values.
      Result<Payload> shared = EncodeKvPairsShared(
          ks.data(), nkeys, ls.data(), {Slice{nullptr, reinterpret_cast<const char*>(vs.data()), value_bytes}});
      REQUIRE(shared.ok());
      CHECK(split.head->view() == shared->head->view());
      BufferPtr head = Buffer::Copy(split.head->data(), split.head->size());
      Result<KvView> v = DecodeKvPairsHead(head->data(), head->size(), value_bytes);
      REQUIRE(v.ok());
      CHECK(std::vector<uint64_t>(v->keys, v->keys + v->num_keys) == ks);
      CHECK(v->num_values == vs.size());
      // The split keeps the encoded buffer alive.
      encoded.reset();
      CHECK(std::string(split.tail[0].data, 4) == whole.substr(whole.size() - value_bytes, 4));
    }
  }
  // Nothing to split: the buffer as it is.
  BufferPtr keys_only = EncodeKvPairs(nullptr, 0, nullptr, nullptr, 0);
  Payload same = SplitValuesTail(keys_only, 0);
  CHECK(same.head == keys_only);
  CHECK(same.tail.empty());
  CHECK(SplitValuesTail(keys_only, keys_only->size()).head == keys_only);
  CHECK(SplitValuesTail(nullptr, 8).head == nullptr);
}

TEST_CASE("a head received apart from its values decodes as the whole buffer does - and nothing else does",
          "[core][kvcodec]") {
  for (size_t nkeys : {1, 2, 3, 5}) {
    for (uint32_t per_key : {1u, 2u, 3u, 1000u}) {
      INFO(nkeys << " keys of " << per_key << " floats");
      std::vector<uint64_t> ks(nkeys);
      std::vector<uint32_t> ls(nkeys, per_key);
      std::vector<float> vs(nkeys * per_key, 1.5f);
      for (size_t i = 0; i < nkeys; ++i) ks[i] = i * 31 + 5;
      Result<Payload> shared =
          EncodeKvPairsShared(ks.data(), nkeys, ls.data(),
                              {Slice{nullptr, reinterpret_cast<const char*>(vs.data()), vs.size() * sizeof(float)}});
      REQUIRE(shared.ok());
      BufferPtr head = Buffer::Copy(shared->head->data(), shared->head->size());
      const std::string before(head->view());
      const uint64_t tail = vs.size() * sizeof(float);
      Result<KvView> v = DecodeKvPairsHead(head->data(), head->size(), tail);
      REQUIRE(v.ok());
      CHECK(head->view() == before);  // the count field was put back
      CHECK(std::vector<uint64_t>(v->keys, v->keys + v->num_keys) == ks);
      CHECK(std::vector<uint32_t>(v->lens, v->lens + v->num_lens) == ls);
      CHECK(v->values == nullptr);
      CHECK(v->num_values == vs.size());
      // A tail of another size, or not whole floats, is refused.
      CHECK(DecodeKvPairsHead(head->data(), head->size(), tail + 4).status().code() == Code::kProtocol);
      CHECK(DecodeKvPairsHead(head->data(), head->size(), tail - 2).status().code() == Code::kProtocol);
      CHECK(head->view() == before);
      // Every shorter head is refused (the values no longer end it, or it does not verify).
      for (size_t cut = 0; cut < head->size(); ++cut) {
        BufferPtr part = Buffer::Copy(head->data(), cut);
        CHECK_FALSE(DecodeKvPairsHead(part->data(), cut, tail).ok());
      }
    }
  }
  // A whole buffer split anywhere but right after the values' count is refused as a head.
  std::vector<uint64_t> ks = {1, 2};
  std::vector<uint32_t> ls = {1, 1};
  std::vector<float> vs = {1, 2};
  BufferPtr whole = EncodeKvPairs(ks.data(), 2, ls.data(), vs.data(), 2);
  std::vector<size_t> decoded_at;
  for (size_t cut = 4; cut <= whole->size(); ++cut) {
    BufferPtr part = Buffer::Copy(whole->data(), cut);
    if (DecodeKvPairsHead(part->data(), cut, whole->size() - cut).ok()) decoded_at.push_back(cut);
  }
  CHECK(decoded_at == std::vector<size_t>{whole->size() - 2 * sizeof(float)});
}

TEST_CASE("filled encoding writes values in place and passes fill errors on", "[core][kvcodec]") {
  std::vector<uint64_t> keys = {1, 2};
  std::vector<uint32_t> lens = {2, 1};
  Result<BufferPtr> b = EncodeKvPairsFilled(keys.data(), keys.size(), lens.data(), 3, [](float* dst) {
    dst[0] = 1.5f;
    dst[1] = 2.5f;
    dst[2] = 3.5f;
    return Status::Ok();
  });
  REQUIRE(b.ok());
  Result<KvView> v = DecodeKvPairs((*b)->data(), (*b)->size(), true);
  REQUIRE(v.ok());
  REQUIRE(v->num_values == 3);
  CHECK(v->values[0] == 1.5f);
  CHECK(v->values[2] == 3.5f);
  Result<BufferPtr> bad = EncodeKvPairsFilled(keys.data(), keys.size(), lens.data(), 3,
                                              [](float*) { return Status(Code::kNotFound, "gone"); });
  CHECK(bad.status().code() == Code::kNotFound);
}

TEST_CASE("uniform filled encoding writes every key's length and the values in place", "[core][kvcodec]") {
  std::vector<uint64_t> keys(1000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919;
  Result<BufferPtr> b = EncodeKvPairsUniform(keys.data(), keys.size(), 3, [](float* dst) {
    for (size_t i = 0; i < 3000; ++i) dst[i] = static_cast<float>(i) + 0.5f;
    return Status::Ok();
  });
  REQUIRE(b.ok());
  Result<KvView> v = DecodeKvPairs((*b)->data(), (*b)->size(), true);
  REQUIRE(v.ok());
  CHECK(std::vector<uint64_t>(v->keys, v->keys + v->num_keys) == keys);
  CHECK(std::vector<uint32_t>(v->lens, v->lens + v->num_lens) == std::vector<uint32_t>(1000, 3));
  REQUIRE(v->num_values == 3000);
  CHECK(v->values[0] == 0.5f);
  CHECK(v->values[2999] == 2999.5f);
  // Zero floats a key: lens present, no values; a fill error is passed on.
  Result<BufferPtr> empty = EncodeKvPairsUniform(keys.data(), 2, 0, [](float*) { return Status::Ok(); });
  REQUIRE(empty.ok());
  Result<KvView> e = DecodeKvPairs((*empty)->data(), (*empty)->size(), true);
  REQUIRE(e.ok());
  CHECK(e->num_lens == 2);
  CHECK(e->lens[1] == 0);
  CHECK(e->num_values == 0);
  Result<BufferPtr> bad =
      EncodeKvPairsUniform(keys.data(), keys.size(), 1, [](float*) { return Status(Code::kNotFound, "gone"); });
  CHECK(bad.status().code() == Code::kNotFound);
}

TEST_CASE("a pull request may ask for answers without keys - only an answer may leave them out",
          "[core][kvcodec]") {
  const std::vector<uint64_t> keys = {5, 9, 1ull << 40};
  BufferPtr asks = EncodePullRequest(keys.data(), keys.size());
  Result<KvView> req = DecodeKvPairs(asks->data(), asks->size(), /*expect_values=*/false);
  REQUIRE(req.ok());
  CHECK(req->keyless_answer);
  CHECK(std::vector<uint64_t>(req->keys, req->keys + req->num_keys) == keys);
  BufferPtr plain = EncodeKvPairs(keys.data(), keys.size(), nullptr, nullptr, 0);
  Result<KvView> old = DecodeKvPairs(plain->data(), plain->size(), false);
  REQUIRE(old.ok());
  CHECK_FALSE(old->keyless_answer);

  // Copied answers of both kinds, keys left out: the lens count the keys.
  const std::vector<uint32_t> lens = {2, 0, 1};
  auto fill3 = [](float* dst) {
    dst[0] = 1.5f;
    dst[1] = 2.5f;
    dst[2] = 3.5f;
    return Status::Ok();
  };
  Result<BufferPtr> filled = EncodeKvPairsFilled(keys.data(), keys.size(), lens.data(), 3, fill3, Keys::kLeftOut);
  Result<BufferPtr> uniform = EncodeKvPairsUniform(keys.data(), keys.size(), 1, fill3, Keys::kLeftOut);
  Result<BufferPtr> with_keys = EncodeKvPairsFilled(keys.data(), keys.size(), lens.data(), 3, fill3);
  REQUIRE(filled.ok());
  REQUIRE(uniform.ok());
  REQUIRE(with_keys.ok());
  CHECK((*filled)->size() + keys.size() * sizeof(uint64_t) <= (*with_keys)->size());
  for (const BufferPtr& b : {*filled, *uniform}) {
    Result<KvView> v = DecodeKvPairs(b->data(), b->size(), /*expect_values=*/true, /*answer=*/true);
    REQUIRE(v.ok());
    CHECK(v->keys == nullptr);
    CHECK(v->num_keys == 3);
    CHECK(std::vector<float>(v->values, v->values + v->num_values) == std::vector<float>{1.5f, 2.5f, 3.5f});
    // Anything but an answer needs its keys: a push without keys is refused.
    Result<KvView> as_push = DecodeKvPairs(b->data(), b->size(), true);
    CHECK(as_push.status().code() == Code::kProtocol);
    CHECK(as_push.status().message().find("keys absent") != std::string::npos);
  }
  Result<KvView> f = DecodeKvPairs((*filled)->data(), (*filled)->size(), true, true);
  REQUIRE(f.ok());
  CHECK(std::vector<uint32_t>(f->lens, f->lens + f->num_lens) == lens);
  CHECK(f->row_len == 0);
  // Rows of one length leave the lens out too: row_len says it once.
  Result<KvView> u = DecodeKvPairs((*uniform)->data(), (*uniform)->size(), true, true);
  REQUIRE(u.ok());
  CHECK(u->lens == nullptr);
  CHECK(u->row_len == 1);
  CHECK((u->Len(0) == 1 && u->Len(2) == 1));
  Result<BufferPtr> rows = EncodeKvPairsUniform(keys.data(), 2, 4, [](float* dst) {
    for (int i = 0; i < 8; ++i) dst[i] = static_cast<float>(i);
    return Status::Ok();
  }, Keys::kLeftOut);
  REQUIRE(rows.ok());
  CHECK((*rows)->size() < 8 * sizeof(float) + 64);  // values, a few fields, no arrays of keys or lens
  Result<KvView> r = DecodeKvPairs((*rows)->data(), (*rows)->size(), true, true);
  REQUIRE(r.ok());
  CHECK((r->num_keys == 2 && r->row_len == 4 && r->num_values == 8));
  // Rows of no floats cannot be counted from the values: their lens are written.
  Result<BufferPtr> zero = EncodeKvPairsUniform(keys.data(), 2, 0, [](float*) { return Status::Ok(); }, Keys::kLeftOut);
  REQUIRE(zero.ok());
  Result<KvView> z = DecodeKvPairs((*zero)->data(), (*zero)->size(), true, true);
  REQUIRE(z.ok());
  CHECK((z->num_keys == 2 && z->num_lens == 2 && z->lens[0] == 0 && z->num_values == 0));
  // A row_len that does not divide the values, or none, is refused; beside keys it must
  // make up the values exactly (a push of rows of one length).
  auto with_row_len = [](const std::vector<uint64_t>* k, uint32_t row_len, const std::vector<float>& vals) {
    flatbuffers::FlatBufferBuilder fbb;
    auto ko = k ? fbb.CreateVector(*k) : 0;
    auto vo = fbb.CreateVector(vals);
    fb::FinishKvPairsBuffer(fbb, fb::CreateKvPairs(fbb, ko, 0, vo, 0, false, row_len));
    return Buffer::Copy(fbb.GetBufferPointer(), fbb.GetSize());
  };
  const std::vector<float> three = {1, 2, 3};
  for (uint32_t row_len : {0u, 2u}) {
    BufferPtr b = with_row_len(nullptr, row_len, three);
    CHECK(DecodeKvPairs(b->data(), b->size(), true, true).status().code() == Code::kProtocol);
  }
  const std::vector<uint64_t> one_key = {7};
  BufferPtr keyed = with_row_len(&one_key, 3, three);
  for (bool answer : {false, true}) {
    Result<KvView> one = DecodeKvPairs(keyed->data(), keyed->size(), true, answer);
    REQUIRE(one.ok());
    CHECK((one->num_keys == 1 && one->lens == nullptr && one->row_len == 3 && one->num_values == 3));
  }
  BufferPtr short_row = with_row_len(&one_key, 2, three);
  CHECK(DecodeKvPairs(short_row->data(), short_row->size(), true, true).status().code() == Code::kProtocol);
  CHECK(DecodeKvPairs(short_row->data(), short_row->size(), true).status().code() == Code::kProtocol);
  // An answer that keeps its keys decodes as an answer too (a server that predates the flag).
  Result<KvView> k = DecodeKvPairs((*with_keys)->data(), (*with_keys)->size(), true, true);
  REQUIRE(k.ok());
  CHECK(std::vector<uint64_t>(k->keys, k->keys + k->num_keys) == keys);
  // Without keys and lens there is nothing to count the keys by.
  const std::vector<float> values = {1.0f};
  BufferPtr bare = RawKvPairs(nullptr, nullptr, &values);
  Result<KvView> none = DecodeKvPairs(bare->data(), bare->size(), true, true);
  CHECK(none.status().code() == Code::kProtocol);
  CHECK(none.status().message().find("keys and lens absent") != std::string::npos);
  // Lens that do not sum to the values are refused as with keys.
  const std::vector<uint32_t> two = {1, 1};
  BufferPtr short_values = RawKvPairs(nullptr, &two, &values);
  CHECK(DecodeKvPairs(short_values->data(), short_values->size(), true, true).status().code() == Code::kProtocol);
}

TEST_CASE("filled encoding refuses what one flatbuffer cannot hold - before allocating or filling",
          "[core][kvcodec]") {
  std::vector<uint64_t> keys = {1};
  std::vector<uint32_t> lens = {0};  // not read: the sizes are refused first
  bool filled = false;
  auto fill = [&filled](float*) {
    filled = true;
    return Status::Ok();
  };
  // 4 GiB of values (past 32 bits: the builder's offsets would wrap), and 2 GiB.
  for (size_t values : {size_t{1} << 30, size_t{1} << 29}) {
    Result<BufferPtr> b = EncodeKvPairsFilled(keys.data(), keys.size(), lens.data(), values, fill);
    CHECK(b.status().code() == Code::kResourceExhausted);
  }
  // Keys alone: 2^28 of them need 3 GiB of keys and lens.
  Result<BufferPtr> many = EncodeKvPairsFilled(keys.data(), size_t{1} << 28, lens.data(), 0, fill);
  CHECK(many.status().code() == Code::kResourceExhausted);
  CHECK_FALSE(filled);
}

}  // namespace pscore::core
