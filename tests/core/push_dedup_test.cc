// Push-id window (pscore/core/push_dedup.h) and its journal records (pscore/core/param_journal.h): a
// push id is applied at most once, the window is bounded and refuses what fell out of it,
// and a replayed journal rebuilds the window with the store.
#include <string>
#include <vector>

#include "pscore/core/kv_codec.h"
#include "pscore/core/param_journal.h"
#include "pscore/core/push_dedup.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::core {
namespace {

using Verdict = PushDedup::Verdict;

PushId Id(uint64_t seq, uint64_t incarnation = 7, const std::string& writer = "worker-a") {
  return PushId{writer, incarnation, seq};
}

TEST_CASE("a push id is claimed once - a repeat is applied, in flight, or new again after a failed apply",
          "[core][dedup]") {
  PushDedup d;
  REQUIRE(d.Begin(Id(1)) == Verdict::kApply);
  CHECK(d.Begin(Id(1)) == Verdict::kInFlight);
  d.End(Id(1), /*applied=*/true);
  CHECK(d.Begin(Id(1)) == Verdict::kApplied);
  REQUIRE(d.Begin(Id(2)) == Verdict::kApply);
  d.End(Id(2), /*applied=*/false);
  CHECK(d.Begin(Id(2)) == Verdict::kApply);  // not applied: may come again
  d.End(Id(2), true);
  // Another writer, and another incarnation of the same writer, have windows of their own.
  CHECK(d.Begin(Id(1, 7, "worker-b")) == Verdict::kApply);
  CHECK(d.Begin(Id(1, 8)) == Verdict::kApply);
  CHECK(d.writers() == 2);
}

TEST_CASE("the push window keeps the newest applied seqs per writer - older ones are refused, never applied",
          "[core][dedup]") {
  PushDedup d;
  const uint64_t n = PushDedup::kWindow + 10;
  for (uint64_t s = 1; s <= n; ++s) {
    REQUIRE(d.Begin(Id(s)) == Verdict::kApply);
    d.End(Id(s), true);
  }
  CHECK(d.Begin(Id(n)) == Verdict::kApplied);
  CHECK(d.Begin(Id(n - PushDedup::kWindow + 1)) == Verdict::kApplied);  // the oldest kept
  CHECK(d.Begin(Id(n - PushDedup::kWindow)) == Verdict::kTooOld);       // fell out
  CHECK(d.Begin(Id(1)) == Verdict::kTooOld);
  CHECK(d.Begin(Id(n + 1)) == Verdict::kApply);
}

TEST_CASE("the push window is bounded in writers - a new writer past the bound is refused", "[core][dedup]") {
  PushDedup d;
  for (size_t w = 0; w < PushDedup::kMaxWriters; ++w) d.MarkApplied(Id(1, 1, "w" + std::to_string(w)));
  CHECK(d.Begin(Id(1, 1, "one-too-many")) == Verdict::kFull);
  CHECK(d.Begin(Id(1, 1, "w0")) == Verdict::kApplied);
}

TEST_CASE("a push window snapshot decodes to the same window - damaged snapshots are refused", "[core][dedup]") {
  PushDedup d;
  for (uint64_t s : {1, 2, 5}) d.MarkApplied(Id(s));
  d.MarkApplied(Id(3, 9, "worker-b"));
  const std::string snap = d.Encode();
  PushDedup e;
  REQUIRE(e.Decode(snap).ok());
  CHECK(e.Begin(Id(5)) == Verdict::kApplied);
  CHECK(e.Begin(Id(3, 9, "worker-b")) == Verdict::kApplied);
  CHECK(e.Begin(Id(4)) == Verdict::kApply);
  for (size_t cut = 0; cut < snap.size(); ++cut) {
    PushDedup f;
    CHECK_FALSE(f.Decode(snap.substr(0, cut)).ok());
  }
  CHECK_FALSE(e.Decode(snap + "x").ok());
}

TEST_CASE("a merged push window snapshot adds its ids - same incarnation unites, a newer one replaces",
          "[core][dedup][resync]") {
  PushDedup source;
  for (uint64_t s : {1, 2, 3}) source.MarkApplied(Id(s));
  source.MarkApplied(Id(4, 9, "worker-b"));
  source.MarkApplied(Id(2, 5, "worker-c"));
  PushDedup d;
  d.MarkApplied(Id(10));                    // same incarnation: kept with the snapshot's
  d.MarkApplied(Id(1, 8, "worker-b"));      // older incarnation: the snapshot's replaces it
  d.MarkApplied(Id(7, 6, "worker-c"));      // newer incarnation: the snapshot's adds nothing
  REQUIRE(d.Merge(source.Encode()).ok());
  for (uint64_t s : {1, 2, 3, 10}) CHECK(d.Applied(Id(s)));
  CHECK(d.Applied(Id(4, 9, "worker-b")));
  CHECK_FALSE(d.Applied(Id(1, 8, "worker-b")));
  CHECK(d.Applied(Id(7, 6, "worker-c")));
  CHECK_FALSE(d.Applied(Id(2, 5, "worker-c")));
  CHECK(d.Begin(Id(4)) == Verdict::kApply);
  // Still bounded: a union past kWindow keeps the newest seqs and raises the floor.
  PushDedup big;
  PushDedup other;
  for (uint64_t s = 1; s <= PushDedup::kWindow; ++s) big.MarkApplied(Id(2 * s));
  for (uint64_t s = 1; s <= PushDedup::kWindow; ++s) other.MarkApplied(Id(2 * s - 1));
  REQUIRE(big.Merge(other.Encode()).ok());
  CHECK(big.Applied(Id(2 * PushDedup::kWindow)));
  CHECK(big.Begin(Id(1)) == Verdict::kTooOld);
  // A damaged snapshot changes nothing.
  const std::string snap = source.Encode();
  PushDedup e;
  e.MarkApplied(Id(10));
  CHECK_FALSE(e.Merge(snap.substr(0, snap.size() - 1)).ok());
  CHECK_FALSE(e.Applied(Id(1)));
  CHECK(e.Applied(Id(10)));
}

std::string KvBody(const std::vector<uint64_t>& keys, const std::vector<float>& values) {
  std::vector<uint32_t> lens(keys.size(), static_cast<uint32_t>(values.size() / keys.size()));
  BufferPtr b = EncodeKvPairs(keys.data(), keys.size(), lens.data(), values.data(), values.size());
  return std::string(b->data(), b->size());
}

TEST_CASE("a journal of pushes with ids replays the store and the push window - a window record replaces it",
          "[core][dedup][journal]") {
  std::string file = JournalFileHeader();
  const std::string kv = KvBody({1}, {2.5f});
  file += JournalPushIdHead(Id(1), kv) + kv;
  file += JournalPushIdHead(Id(2), kv) + kv;
  Result<ParsedJournal> parsed = ParseJournal(file);
  REQUIRE(parsed.ok());
  REQUIRE(parsed->records.size() == 2);
  ParamStore store(ParamStore::Options{});
  PushDedup window;
  REQUIRE(ReplayJournal(parsed->records, &store, &window).ok());
  std::vector<uint32_t> lens;
  std::vector<float> values;
  const uint64_t key = 1;
  REQUIRE(store.Pull(&key, 1, &lens, &values).ok());
  CHECK(values == std::vector<float>{5.0f});
  CHECK(window.Begin(Id(2)) == Verdict::kApplied);
  CHECK(window.Begin(Id(3)) == Verdict::kApply);

  // A compacted file's window record: the window as it was then.
  PushDedup earlier;
  earlier.MarkApplied(Id(9));
  const std::string snap = earlier.Encode();
  std::string compacted = JournalFileHeader() + JournalRecordHeader(JournalOp::kDedup, snap) + snap;
  Result<ParsedJournal> p2 = ParseJournal(compacted);
  REQUIRE(p2.ok());
  ParamStore store2(ParamStore::Options{});
  PushDedup w2;
  REQUIRE(ReplayJournal(p2->records, &store2, &w2).ok());
  CHECK(w2.Begin(Id(9)) == Verdict::kApplied);
  CHECK(store2.num_keys() == 0);

  // A flipped byte of the id is caught by the record's checksum.
  std::string bad = file;
  bad[kJournalFileHeaderBytes + kJournalRecordHeaderBytes + 3] ^= 1;
  CHECK_FALSE(ParseJournal(bad).ok());
}

}  // namespace
}  // namespace pscore::core
