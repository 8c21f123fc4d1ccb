// ServerJournal on its own (no nodes): compactions written in the background from pinned
// values while appends go on into the next segment, what a reopened directory replays
// (stale segments and a half-written compaction left by a kill included), and a compaction
// that fails. The kill-and-restart cases with real processes: multiproc/server_journal_mp_test.cc.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "pscore/core/kv_codec.h"
#include "pscore/core/param_journal.h"
#include "pscore/core/param_store.h"
#include "pscore/node/server/server_journal.h"
#include "multiproc/process.h"
#include "node/full_disk.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

constexpr size_t kKeys = 8;
constexpr uint32_t kLen = 16 * 1024;  // 64 KiB a key: a push of all keys is 512 KiB

core::ParamStore::Options SumStore() {
  core::ParamStore::Options o;
  o.rule = core::UpdateRule::kSum;
  return o;
}

std::vector<uint64_t> Keys() {
  std::vector<uint64_t> k(kKeys);
  for (size_t i = 0; i < kKeys; ++i) k[i] = i * 1000 + 3;
  return k;
}

BufferPtr PushBody(int round) {
  const std::vector<uint64_t> keys = Keys();
  const std::vector<uint32_t> lens(kKeys, kLen);
  std::vector<float> values(kKeys * kLen);
  for (size_t i = 0; i < kKeys; ++i) std::fill_n(values.begin() + i * kLen, kLen, static_cast<float>(round + i));
  return core::EncodeKvPairs(keys.data(), kKeys, lens.data(), values.data(), values.size());
}

// Journals a push of `round` + key index to every key, then applies it, as a server does
// (the caller is the only thread: it stands for the owner's lock).
void JournaledPush(ServerJournal& j, core::ParamStore& store, int round, bool may_wait = true) {
  BufferPtr body = PushBody(round);
  REQUIRE(j.Append(core::JournalOp::kPush, body->view()).ok());
  Result<core::KvView> v = core::DecodeKvPairs(body->data(), body->size(), true);
  REQUIRE(v.ok());
  REQUIRE(store.Push(v->keys, v->lens, v->values, v->num_keys).ok());
  j.MaybeCompact(may_wait);
}

// Journals pushes until one of them starts a compaction; returns the next round.
int PushUntilCompacting(ServerJournal& j, core::ParamStore& store) {
  int round = 0;
  while (!j.compacting() && round < 100) JournaledPush(j, store, round++);
  REQUIRE(j.compacting());
  return round;
}

std::vector<float> Values(const core::ParamStore& store) {
  const std::vector<uint64_t> keys = Keys();
  std::vector<float> out(kKeys * kLen, -1.0f);
  const std::vector<uint32_t> lens(kKeys, kLen);
  REQUIRE(store.CopyValues(keys.data(), kKeys, lens.data(), out.data()).ok());
  return out;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The segment files in the directory.
int Segments(const testing::TempDir& dir) {
  int n = 0;
  for (int i = 1; i < 1000; ++i) n += Exists(dir.File("params.journal." + std::to_string(i)));
  return n;
}

std::vector<float> Reopened(const testing::TempDir& dir) {
  core::ParamStore store(SumStore());
  ServerJournal j(dir.path());
  REQUIRE(j.Open(&store).ok());
  CHECK(j.restored_keys() == kKeys);
  return Values(store);
}

}  // namespace

TEST_CASE("journal compactions are written in the background while appends go on - a reopened journal replays the same store",
          "[node][journal]") {
  testing::TempDir dir;
  REQUIRE(dir.ok());
  ServerJournal::Options options;
  options.compact_floor = 2 << 20;  // compact every few pushes of 512 KiB
  std::vector<float> want;
  {
    core::ParamStore store(SumStore());
    ServerJournal j(dir.path(), options);
    REQUIRE(j.Open(&store).ok());
    CHECK(j.compactions() == 1);  // Open's
    uint64_t peak = 0;
    uint64_t background = 0;  // pushes appended while a compaction was being written
    for (int round = 0; round < 60; ++round) {
      background += j.compacting();
      JournaledPush(j, store, round);
      peak = std::max(peak, j.bytes());
    }
    REQUIRE(j.FinishCompaction().ok());
    INFO(j.compactions() << " compactions, " << background << " pushes during one, largest segment " << peak);
    CHECK(j.compactions() >= 4);
    CHECK(background > 0);
    CHECK(peak < 4 * options.compact_floor);  // at most twice the bound, and one push
    CHECK_FALSE(Exists(j.path() + ".tmp"));
    CHECK(Segments(dir) == 1);  // the covered ones were removed: only the current one is left
    want = Values(store);
  }
  // sum over rounds of (round + i) = 1770 + 60 i for key i
  for (size_t i = 0; i < kKeys; ++i) CHECK(want[i * kLen] == static_cast<float>(1770 + 60 * i));
  CHECK(Reopened(dir) == want);
}

TEST_CASE("a journal dropped while a compaction is written replays the same store - and leaves no temporary file",
          "[node][journal]") {
  testing::TempDir dir;
  REQUIRE(dir.ok());
  ServerJournal::Options options;
  options.compact_floor = 1 << 20;
  std::vector<float> want;
  {
    core::ParamStore store(SumStore());
    ServerJournal j(dir.path(), options);
    REQUIRE(j.Open(&store).ok());
    int round = PushUntilCompacting(j, store);
    JournaledPush(j, store, round++);  // into the new segment, the compaction maybe still running
    want = Values(store);
  }
  CHECK_FALSE(Exists(dir.File("params.journal.tmp")));
  CHECK(Reopened(dir) == want);
}

TEST_CASE("an appender that must not wait - a loop thread - goes on past twice the bound while a compaction is written",
          "[node][journal]") {
  testing::TempDir dir;
  REQUIRE(dir.ok());
  ServerJournal::Options options;
  options.compact_floor = 1 << 20;
  // The compaction is held open until the pushes below are done; if one of them waits for
  // it, the releaser lets it go after 20 s and says so.
  std::promise<void> pushes_done, release;
  std::shared_future<void> released = release.get_future().share();
  options.before_compaction_write = [released] { released.wait(); };
  bool waited = false;
  std::thread releaser([&waited, &release, done = pushes_done.get_future()] {
    waited = done.wait_for(std::chrono::seconds(20)) == std::future_status::timeout;
    release.set_value();
  });
  struct JoinOnExit {  // a failed REQUIRE below must not leave the thread joinable
    std::thread& t;
    ~JoinOnExit() {
      if (t.joinable()) t.join();
    }
  } join_releaser{releaser};
  std::vector<float> want;
  {
    core::ParamStore store(SumStore());
    ServerJournal j(dir.path(), options);
    REQUIRE(j.Open(&store).ok());
    int round = PushUntilCompacting(j, store);
    for (int i = 0; i < 6; ++i) JournaledPush(j, store, round++, /*may_wait=*/false);
    const bool still_compacting = j.compacting();
    const uint64_t segment = j.bytes();
    pushes_done.set_value();
    releaser.join();
    CHECK_FALSE(waited);
    CHECK(still_compacting);
    CHECK(segment > 2 * options.compact_floor);  // past the bound where a waiting appender stops
    REQUIRE(j.FinishCompaction().ok());
    CHECK(j.compactions() == 2);
    want = Values(store);
  }
  CHECK(Reopened(dir) == want);
}

TEST_CASE("what a kill leaves - a half-written compaction and segments compacted already or cut short - reopens to the same store",
          "[node][journal]") {
  testing::TempDir dir;
  REQUIRE(dir.ok());
  std::vector<float> want;
  uint64_t current = 0;
  {
    core::ParamStore store(SumStore());
    ServerJournal j(dir.path());
    REQUIRE(j.Open(&store).ok());
    for (int round = 0; round < 5; ++round) JournaledPush(j, store, round);
    want = Values(store);
    current = std::stoull(j.segment_path().substr(j.segment_path().rfind('.') + 1));
  }
  // Reopened once: everything is compacted into params.journal, covering `current`.
  REQUIRE(Reopened(dir) == want);
  // A kill after that rename but before the covered segments were removed leaves one: it
  // holds changes already in the compacted file and must not be applied twice.
  {
    BufferPtr body = PushBody(1000);
    std::ofstream stale(dir.File("params.journal." + std::to_string(current)), std::ios::binary);
    stale << core::JournalFileHeader() << core::JournalRecordHeader(core::JournalOp::kPush, body->view())
          << body->view();
  }
  // A kill while a compaction was written leaves its temporary file, cut short; one right
  // after a segment was created leaves it without (all of) its header.
  {
    std::ofstream tmp(dir.File("params.journal.tmp"), std::ios::binary);
    tmp << core::JournalFileHeader() << "half a record";
    std::ofstream empty(dir.File("params.journal." + std::to_string(current + 7)), std::ios::binary);
    std::ofstream cut(dir.File("params.journal." + std::to_string(current + 8)), std::ios::binary);
    cut << core::JournalFileHeader().substr(0, 5);
  }
  CHECK(Reopened(dir) == want);
  CHECK_FALSE(Exists(dir.File("params.journal." + std::to_string(current))));  // removed
  CHECK_FALSE(Exists(dir.File("params.journal.tmp")));
  CHECK_FALSE(Exists(dir.File("params.journal." + std::to_string(current + 8))));
  CHECK(Reopened(dir) == want);
  // A segment that is not a journal at all is damage, named.
  {
    std::ofstream bad(dir.File("params.journal.900"), std::ios::binary);
    bad << "garbage!";
  }
  core::ParamStore store(SumStore());
  ServerJournal j(dir.path());
  Status st = j.Open(&store);
  CHECK_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("params.journal.900"));
}

TEST_CASE("a compaction that cannot be written leaves the journal whole - appends go on",
          "[node][journal]") {
  testing::TempDir dir;
  REQUIRE(dir.ok());
  ServerJournal::Options options;
  options.compact_floor = 1 << 20;
  std::vector<float> want;
  {
    core::ParamStore store(SumStore());
    ServerJournal j(dir.path(), options);
    REQUIRE(j.Open(&store).ok());
    // A directory where the temporary file would go: the compaction cannot be written.
    REQUIRE(::mkdir(dir.File("params.journal.tmp").c_str(), 0755) == 0);
    int round = PushUntilCompacting(j, store);
    Status st = j.FinishCompaction();
    CHECK_FALSE(st.ok());
    CHECK_THAT(st.message(), Catch::Contains("params.journal.tmp"));
    CHECK(j.compactions() == 1);
    CHECK(Segments(dir) == 2);  // the one it would have covered stays, and the current one
    JournaledPush(j, store, round++);  // not tried again at once: only after another floor's worth
    CHECK_FALSE(j.compacting());
    want = Values(store);
  }
  REQUIRE(::rmdir(dir.File("params.journal.tmp").c_str()) == 0);
  CHECK(Reopened(dir) == want);
}

TEST_CASE("an append the disk refuses leaves nothing of its record - the appends before and after it replay",
          "[node][journal]") {
  testing::TempDir dir;
  REQUIRE(dir.ok());
  std::vector<float> want;
  {
    core::ParamStore store(SumStore());
    ServerJournal j(dir.path());
    REQUIRE(j.Open(&store).ok());
    JournaledPush(j, store, 1);
    const uint64_t before = j.bytes();
    REQUIRE(testing::NewestSegmentBytes(dir.path()) == before);
    {
      testing::FileSizeLimit full(before + 1024);  // room for the start of the next record only
      REQUIRE(full.ok());
      BufferPtr body = PushBody(2);
      Status st = j.Append(core::JournalOp::kPush, body->view());
      REQUIRE_FALSE(st.ok());
      INFO(st);
      CHECK_THAT(st.message(), Catch::Contains("params.journal."));
      CHECK_THAT(st.message(), Catch::Contains("File too large"));
    }
    CHECK(j.bytes() == before);
    CHECK(testing::NewestSegmentBytes(dir.path()) == before);  // the part that was written is cut
    JournaledPush(j, store, 3);  // the disk takes writes again
    want = Values(store);
  }
  for (size_t i = 0; i < kKeys; ++i) CHECK(want[i * kLen] == static_cast<float>(4 + 2 * i));  // rounds 1 and 3
  CHECK(Reopened(dir) == want);
}

// What a server restarted with its --data_dir on a disk that is still full meets: Open
// compacts what it replays into a new file, which the disk refuses. It fails naming the
// file and leaves the journal as it was, so a start once the disk has room restores all.
TEST_CASE("a journal opened on a disk that refuses writes fails naming the file - and opens whole once it has room",
          "[node][journal]") {
  testing::TempDir dir;
  REQUIRE(dir.ok());
  std::vector<float> want;
  {
    core::ParamStore store(SumStore());
    ServerJournal j(dir.path());
    REQUIRE(j.Open(&store).ok());
    for (int round = 1; round <= 3; ++round) JournaledPush(j, store, round);
    want = Values(store);
  }
  {
    testing::FileSizeLimit full(16);
    REQUIRE(full.ok());
    core::ParamStore store(SumStore());
    ServerJournal j(dir.path());
    Status st = j.Open(&store);
    REQUIRE_FALSE(st.ok());
    INFO(st);
    CHECK_THAT(st.message(), Catch::Contains(dir.path()));
    CHECK_THAT(st.message(), Catch::Contains("File too large"));
  }
  CHECK(Reopened(dir) == want);
}

}  // namespace pscore::node

namespace pscore::node {
namespace {

// Journals a push with id (writer "w", incarnation 1, seq) and applies it, as a server does.
void JournaledPushWithId(ServerJournal& j, core::ParamStore& store, core::PushDedup& window, uint64_t seq) {
  BufferPtr body = PushBody(static_cast<int>(seq));
  const core::PushId id{"w", 1, seq};
  REQUIRE(window.Begin(id) == core::PushDedup::Verdict::kApply);
  REQUIRE(j.AppendRecord(core::JournalPushIdHead(id, body->view()), body->view()).ok());
  Result<core::KvView> v = core::DecodeKvPairs(body->data(), body->size(), true);
  REQUIRE(v.ok());
  REQUIRE(store.Push(v->keys, v->lens, v->values, v->num_keys).ok());
  window.End(id, true);
  j.MaybeCompact();
}

TEST_CASE("the push window is kept through background compactions - a reopened journal knows every applied id",
          "[node][journal][dedup]") {
  testing::TempDir dir;
  REQUIRE(dir.ok());
  ServerJournal::Options options;
  options.compact_floor = 2 << 20;
  uint64_t seq = 0;
  {
    core::ParamStore store(SumStore());
    core::PushDedup window;
    ServerJournal j(dir.path(), options);
    REQUIRE(j.Open(&store, &window).ok());
    while (j.compactions() < 3 && seq < 100) JournaledPushWithId(j, store, window, ++seq);
    REQUIRE(j.FinishCompaction().ok());
    REQUIRE(j.compactions() >= 3);
    JournaledPushWithId(j, store, window, ++seq);  // one in the segment after them
  }
  for (int reopen = 0; reopen < 2; ++reopen) {  // the second reads Open's compaction of the first
    core::ParamStore store(SumStore());
    core::PushDedup window;
    ServerJournal j(dir.path(), options);
    REQUIRE(j.Open(&store, &window).ok());
    for (uint64_t s = 1; s <= seq; ++s) {
      INFO("reopen " << reopen << ", seq " << s);
      CHECK(window.Begin(core::PushId{"w", 1, s}) == core::PushDedup::Verdict::kApplied);
    }
    CHECK(window.Begin(core::PushId{"w", 1, seq + 1}) == core::PushDedup::Verdict::kApply);
  }
}

}  // namespace
}  // namespace pscore::node
