// Parameter journal codec (pscore/core/param_journal.h): records round-trip and replay to the
// same store as the changes applied directly; a torn tail is cut; damage is reported with
// its offset; every truncation parses to a prefix of the records.
#include <cstring>
#include <string>
#include <vector>

#include "pscore/core/kv_codec.h"
#include "pscore/core/param_journal.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::core {
namespace {

std::string KvBody(const std::vector<uint64_t>& keys, const std::vector<uint32_t>& lens,
                   const std::vector<float>& values) {
  BufferPtr b = EncodeKvPairs(keys.data(), keys.size(), lens.data(), values.data(), values.size());
  return std::string(b->data(), b->size());
}

void Add(std::string* file, JournalOp op, const std::string& body) {
  *file += JournalRecordHeader(op, body);
  *file += body;
}

std::vector<float> Get(const ParamStore& s, uint64_t key) {
  std::vector<uint32_t> lens;
  std::vector<float> values;
  if (!s.Pull(&key, 1, &lens, &values).ok()) return {};
  return values;
}

// A journal of pushes, a migration insert, a refused push (wrong length) and a drop.
std::string SampleJournal() {
  std::string f = JournalFileHeader();
  Add(&f, JournalOp::kPush, KvBody({1, 2}, {2, 1}, {1, 1, 5}));
  Add(&f, JournalOp::kPush, KvBody({1}, {2}, {2, 3}));
  Add(&f, JournalOp::kInsert, KvBody({7, 8}, {1, 1}, {70, 80}));
  Add(&f, JournalOp::kPush, KvBody({2, 7}, {3, 1}, {9, 9, 9, 1}));  // key 2 has length 1: skipped
  Add(&f, JournalOp::kDrop, EncodeJournalDrop(0, 1));  // one server: rank 0 owns everything
  return f;
}

}  // namespace

TEST_CASE("journal: replay gives the store the changes gave when applied directly", "[core][journal]") {
  std::string f = SampleJournal();
  Result<ParsedJournal> parsed = ParseJournal(f);
  REQUIRE(parsed.ok());
  CHECK(parsed->records.size() == 5);
  CHECK(parsed->valid_bytes == f.size());
  ParamStore store({UpdateRule::kSum, 0.1f});
  REQUIRE(ReplayJournal(parsed->records, &store).ok());
  CHECK(Get(store, 1) == std::vector<float>{3, 4});
  CHECK(Get(store, 2) == std::vector<float>{5});
  CHECK(Get(store, 7) == std::vector<float>{71});
  CHECK(Get(store, 8) == std::vector<float>{80});
  CHECK(store.num_keys() == 4);
}

TEST_CASE("journal: pushes and inserts of rows of one length (row_len, no lens) replay as those with lens",
          "[core][journal]") {
  auto rows = [](const std::vector<uint64_t>& keys, uint32_t row_len, const std::vector<float>& values) {
    BufferPtr b = EncodeKvPairsRows(keys.data(), keys.size(), row_len, values.data());
    return std::string(b->data(), b->size());
  };
  std::string f = JournalFileHeader();
  Add(&f, JournalOp::kPush, rows({1, 2, 3}, 2, {1, 2, 3, 4, 5, 6}));
  Add(&f, JournalOp::kPush, rows({3, 1}, 2, {10, 10, 20, 20}));
  Add(&f, JournalOp::kInsert, rows({9}, 3, {7, 8, 9}));
  Add(&f, JournalOp::kPush, rows({2, 9}, 3, {0, 0, 0, 1, 1, 1}));  // key 2 has length 2: skipped
  Result<ParsedJournal> parsed = ParseJournal(f);
  REQUIRE(parsed.ok());
  REQUIRE(parsed->records.size() == 4);
  ParamStore store({UpdateRule::kSum, 0.1f});
  REQUIRE(ReplayJournal(parsed->records, &store).ok());
  CHECK(Get(store, 1) == std::vector<float>{21, 22});
  CHECK(Get(store, 2) == std::vector<float>{3, 4});
  CHECK(Get(store, 3) == std::vector<float>{15, 16});
  CHECK(Get(store, 9) == std::vector<float>{8, 9, 10});
  CHECK(store.num_keys() == 4);
}

TEST_CASE("journal: a drop record removes the entries another server owns", "[core][journal]") {
  std::string f = JournalFileHeader();
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 64; ++k) keys.push_back(k);
  Add(&f, JournalOp::kInsert, KvBody(keys, std::vector<uint32_t>(64, 1), std::vector<float>(64, 1.0f)));
  Add(&f, JournalOp::kDrop, EncodeJournalDrop(1, 2));
  Result<ParsedJournal> parsed = ParseJournal(f);
  REQUIRE(parsed.ok());
  ParamStore replayed({UpdateRule::kSum, 0.1f});
  REQUIRE(ReplayJournal(parsed->records, &replayed).ok());
  ParamStore direct({UpdateRule::kSum, 0.1f});
  for (uint64_t k : keys) direct.Insert(k, {1.0f});
  direct.ExtractNotOwned(1, 2, true);
  CHECK(replayed.num_keys() == direct.num_keys());
  CHECK(replayed.num_keys() > 0);
  CHECK(replayed.num_keys() < 64);
  for (uint64_t k : keys) CHECK(Get(replayed, k) == Get(direct, k));
}

TEST_CASE("journal: a key-drop record removes exactly its keys, missing ones too", "[core][journal]") {
  std::string f = JournalFileHeader();
  Add(&f, JournalOp::kInsert, KvBody({1, 2, 3}, {1, 1, 1}, {10, 20, 30}));
  Add(&f, JournalOp::kDropKeys, EncodeJournalDropKeys({1, 3, 99}));
  Add(&f, JournalOp::kInsert, KvBody({3}, {1}, {31}));
  Result<ParsedJournal> parsed = ParseJournal(f);
  REQUIRE(parsed.ok());
  REQUIRE(parsed->records.size() == 3);
  ParamStore store({UpdateRule::kSum, 0.1f});
  REQUIRE(ReplayJournal(parsed->records, &store).ok());
  CHECK(Get(store, 1).empty());
  CHECK(Get(store, 2) == std::vector<float>{20});
  CHECK(Get(store, 3) == std::vector<float>{31});
  CHECK(store.num_keys() == 2);

  std::string bad = JournalFileHeader();
  Add(&bad, JournalOp::kDropKeys, std::string(12, '\0'));
  Result<ParsedJournal> p = ParseJournal(bad);
  REQUIRE(p.ok());
  Status st = ReplayJournal(p->records, &store);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("key-drop body of 12 bytes"));
}

TEST_CASE("journal: every truncation parses to a prefix of the records, the torn rest cut", "[core][journal]") {
  const std::string f = SampleJournal();
  Result<ParsedJournal> whole = ParseJournal(f);
  REQUIRE(whole.ok());
  std::vector<size_t> ends;  // offset after each record
  size_t at = kJournalFileHeaderBytes;
  for (const JournalRecord& r : whole->records) {
    at += kJournalRecordHeaderBytes + r.body.size();
    ends.push_back(at);
  }
  for (size_t len = kJournalFileHeaderBytes; len <= f.size(); ++len) {
    Result<ParsedJournal> p = ParseJournal(std::string_view(f).substr(0, len));
    INFO("length " << len);
    REQUIRE(p.ok());
    size_t whole_records = 0;
    while (whole_records < ends.size() && ends[whole_records] <= len) ++whole_records;
    CHECK(p->records.size() == whole_records);
    CHECK(p->valid_bytes == (whole_records == 0 ? kJournalFileHeaderBytes : ends[whole_records - 1]));
  }
}

TEST_CASE("journal: a covers record names its segment and changes nothing - a record header over pieces equals the whole",
          "[core][journal]") {
  std::string f = JournalFileHeader();
  Add(&f, JournalOp::kCovers, EncodeJournalCovers(41));
  Add(&f, JournalOp::kInsert, KvBody({7, 8}, {1, 2}, {70, 80, 81}));
  Result<ParsedJournal> p = ParseJournal(f);
  REQUIRE(p.ok());
  REQUIRE(p->records.size() == 2);
  CHECK(p->records[0].op == JournalOp::kCovers);
  Result<uint64_t> covers = DecodeJournalCovers(p->records[0].body);
  REQUIRE(covers.ok());
  CHECK(*covers == 41);
  ParamStore store({UpdateRule::kSum, 0.1f});
  REQUIRE(ReplayJournal(p->records, &store).ok());
  CHECK(store.num_keys() == 2);
  CHECK(Get(store, 8) == std::vector<float>{80, 81});
  // A covers body of another size is damage.
  std::string bad = JournalFileHeader();
  Add(&bad, JournalOp::kCovers, std::string(7, '\0'));
  Result<ParsedJournal> q = ParseJournal(bad);
  REQUIRE(q.ok());
  CHECK_THAT(ReplayJournal(q->records, &store).message(), Catch::Contains("journal record 0: covers record of 7 bytes"));
  // The header of a body given as a head and tail slices is the header of the same bytes whole.
  const std::string body = KvBody({1, 2, 3}, {2, 0, 3}, {1, 2, 3, 4, 5});
  for (size_t cut : {size_t{0}, size_t{1}, size_t{8}, body.size() - 1, body.size()}) {
    Payload pieces(Buffer::Copy(body.data(), cut));
    const size_t mid = cut + (body.size() - cut) / 2;
    pieces.tail.push_back(Slice{nullptr, body.data() + cut, mid - cut});
    pieces.tail.push_back(Slice{nullptr, body.data() + mid, body.size() - mid});
    CHECK(JournalRecordHeader(JournalOp::kInsert, pieces) == JournalRecordHeader(JournalOp::kInsert, body));
  }
}

TEST_CASE("journal: damage is refused naming what and where", "[core][journal]") {
  const std::string f = SampleJournal();
  SECTION("a flipped bit in a body fails the checksum") {
    std::string bad = f;
    bad[kJournalFileHeaderBytes + kJournalRecordHeaderBytes + 3] ^= 0x10;
    Result<ParsedJournal> p = ParseJournal(bad);
    REQUIRE_FALSE(p.ok());
    CHECK_THAT(p.status().message(), Catch::Contains("offset 8 fails its checksum"));
  }
  SECTION("an unknown op") {
    std::string bad = f;
    bad[kJournalFileHeaderBytes] = 9;
    Result<ParsedJournal> p = ParseJournal(bad);
    REQUIRE_FALSE(p.ok());
    CHECK_THAT(p.status().message(), Catch::Contains("damaged journal record at offset 8 (op 9"));
  }
  SECTION("bad magic, a newer version, a short file") {
    std::string bad = f;
    bad[0] = 'X';
    CHECK_THAT(ParseJournal(bad).status().message(), Catch::Contains("bad magic"));
    bad = f;
    bad[4] = 2;
    CHECK_THAT(ParseJournal(bad).status().message(), Catch::Contains("version 2"));
    CHECK_FALSE(ParseJournal(f.substr(0, 5)).ok());
  }
  SECTION("a record whose body is not a kv-pairs buffer fails the replay, naming the record") {
    std::string bad = JournalFileHeader();
    Add(&bad, JournalOp::kPush, std::string(24, 'z'));
    Result<ParsedJournal> p = ParseJournal(bad);
    REQUIRE(p.ok());
    ParamStore store({UpdateRule::kSum, 0.1f});
    Status st = ReplayJournal(p->records, &store);
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK_THAT(st.message(), Catch::Contains("journal record 0"));
  }
}

}  // namespace pscore::core
