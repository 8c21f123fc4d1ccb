// The worker's key-value request types without sockets: how a pull ends when its caller's
// memory may still be written, where answers may be read in place, and the learned sizes.
#include <atomic>
#include <memory>
#include <numeric>
#include <vector>

#include "core/pool_limit_guard.h"
#include "pscore/node/worker/learned_lens.h"
#include "pscore/node/worker/pull_request.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

KvCounters Counters() {
  return KvCounters{std::make_shared<std::atomic<int>>(0), std::make_shared<std::atomic<uint64_t>>(0)};
}

TEST_CASE("a part's keys are a run of two numbers or a list, and either says whether it is consecutive",
          "[node][worker]") {
  KeyIndices run = KeyIndices::Run(7, 3);
  CHECK(run.size() == 3);
  CHECK(run.front() == 7);
  CHECK(run[1] == 8);
  CHECK(run.back() == 9);
  CHECK(run.consecutive());
  CHECK(run.Release().empty());  // nothing listed to reuse
  CHECK(run.empty());
  CHECK_FALSE(run.consecutive());

  KeyIndices gaps = KeyIndices::Listed({2, 3, 5});
  CHECK(gaps.size() == 3);
  CHECK(gaps[2] == 5);
  CHECK_FALSE(gaps.consecutive());
  CHECK(KeyIndices::Listed({4, 5, 6}).consecutive());
  CHECK(KeyIndices::Listed({4}).consecutive());
  CHECK_FALSE(KeyIndices::Listed({}).consecutive());
  std::vector<size_t> back = gaps.Release();
  CHECK(back == std::vector<size_t>{2, 3, 5});
  CHECK(gaps.empty());
}

TEST_CASE("a failed PullInto is answered only once no request sent can write into dest", "[node][worker]") {
  KvCounters c = Counters();
  LearnedLens learned;
  auto op = std::make_shared<PullIntoRequest>(c);
  std::future<Status> done = op->future();
  std::vector<float> dest(4);
  op->Begin({1, 2}, std::make_shared<ScratchArrays>());
  REQUIRE(op->SetDest(dest.data(), dest.size(), nullptr, &learned).ok());
  CHECK(c.in_flight->load() == 1);
  op->parts_sent = 2;
  op->Fail(Status(Code::kUnavailable, "lost"));
  CHECK(done.wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
  CHECK_FALSE(op->PartEnded());
  CHECK(done.wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
  CHECK_FALSE(op->PartEnded());
  REQUIRE(done.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
  CHECK(done.get().code() == Code::kUnavailable);
  CHECK(c.in_flight->load() == 0);
}

TEST_CASE("a pull's large arrays are kept when it ends and the next pull writes into them", "[node][worker]") {
  PoolLimitGuard guard;
  Buffer::SetPoolLimit(size_t{64} << 20);  // on in every build here (off by default under ASan)
  auto scratch = std::make_shared<ScratchArrays>();
  std::vector<uint64_t> keys(400000);  // 3.2 MB of keys, 3.2 MB of pointers
  std::iota(keys.begin(), keys.end(), 5);
  const uint64_t* keys_at = nullptr;
  const float* const* src_at = nullptr;
  {
    auto first = std::make_shared<PullCopyRequest>(Counters());
    first->Begin(keys, scratch);
    keys_at = first->keys.data();
    src_at = first->src.data();
    CHECK(scratch->kept_bytes() == 0);
  }
  CHECK(scratch->kept_bytes() >= keys.size() * (sizeof(uint64_t) + sizeof(const float*)));
  std::vector<uint64_t> others(keys.rbegin(), keys.rend());
  auto second = std::make_shared<PullCopyRequest>(Counters());
  second->Begin(others, scratch);
  CHECK(second->keys.data() == keys_at);
  CHECK(second->src.data() == src_at);
  CHECK(second->keys == others);
  CHECK(second->src.empty());  // sized when an answer writes it, in place
  second->NeedSrc();
  CHECK(second->src.size() == others.size());
  CHECK(second->src.data() == src_at);
  CHECK(scratch->kept_bytes() == 0);
  second.reset();

  // A kept array serves a request of at least half its size only; small arrays are not kept.
  std::vector<uint64_t> quarter(keys.begin(), keys.begin() + 150000);  // 1.2 MB: large, under half
  auto small = std::make_shared<PullCopyRequest>(Counters());
  small->Begin(quarter, scratch);
  CHECK(small->keys.data() != keys_at);
  small.reset();
  const size_t kept = scratch->kept_bytes();
  std::vector<uint64_t> few = {1, 2, 3};
  auto tiny = std::make_shared<PullCopyRequest>(Counters());
  tiny->Begin(few, scratch);
  tiny.reset();
  CHECK(scratch->kept_bytes() == kept);

  // With the pool off nothing is kept.
  Buffer::SetPoolLimit(0);
  auto off = std::make_shared<PullCopyRequest>(Counters());
  off->Begin(keys, std::make_shared<ScratchArrays>());
  std::shared_ptr<ScratchArrays> arrays = off->scratch;
  off.reset();
  CHECK(arrays->kept_bytes() == 0);
}

TEST_CASE("a PullInto with a null destination for some floats fails at once", "[node][worker]") {
  LearnedLens learned;
  auto op = std::make_shared<PullIntoRequest>(Counters());
  op->Begin({1}, std::make_shared<ScratchArrays>());
  CHECK(op->SetDest(nullptr, 3, nullptr, &learned).code() == Code::kInvalidArgument);
}

TEST_CASE("a pull's answers are read in place only where the layout puts them", "[node][worker]") {
  LearnedLens learned;
  auto op = std::make_shared<PullIntoRequest>(Counters());
  std::vector<float> dest(10);
  std::vector<uint32_t> lens = {2, 3, 5};
  op->Begin({7, 8, 9}, std::make_shared<ScratchArrays>());
  REQUIRE(op->SetDest(dest.data(), dest.size(), &lens, &learned).ok());
  uint64_t off = 0;
  uint64_t floats = 0;
  REQUIRE(op->SinkRegion(KeyIndices::Run(0, 3), &off, &floats));  // all the keys: the whole of dest
  CHECK((off == 0 && floats == 10));
  REQUIRE(op->SinkRegion(KeyIndices::Listed({1, 2}), &off, &floats));  // consecutive keys: their span
  CHECK((off == 2 && floats == 8));
  CHECK_FALSE(op->SinkRegion(KeyIndices::Listed({0, 2}), &off, &floats));  // not consecutive
}

TEST_CASE("learned sizes give a layout, and a size found wrong is forgotten", "[node][worker]") {
  LearnedLens learned;
  std::vector<uint64_t> keys = {5, 6};
  const uint32_t big[] = {1 << 15, 1 << 16};  // 128 KiB and 256 KiB of floats: learned
  learned.Learn(keys, KeyIndices::Run(0, 2), big);
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  REQUIRE(learned.Layout(keys, &offsets, &total));
  CHECK(offsets == std::vector<uint64_t>{0, 1 << 15});
  CHECK(total == (1 << 15) + (1 << 16));
  learned.Forget(keys, offsets, total, {1 << 15, 7});
  CHECK_FALSE(learned.Layout(keys, &offsets, &total));
  CHECK(learned.Layout({5}, &offsets, &total));
  const uint32_t small[] = {4};  // under 64 KiB per key: not learned
  learned.Learn({9}, KeyIndices::Run(0, 1), small);
  CHECK_FALSE(learned.Layout({9}, &offsets, &total));
}

TEST_CASE("a layout asked for keys never learned allocates nothing of their size", "[node][worker]") {
  LearnedLens learned;
  std::vector<uint64_t> many(1 << 20);
  std::iota(many.begin(), many.end(), 100);
  std::vector<uint64_t> offsets;
  uint64_t total = 1;
  CHECK_FALSE(learned.Layout(many, &offsets, &total));  // nothing learned yet
  CHECK(offsets.capacity() == 0);
  CHECK(total == 0);
  const uint32_t big[] = {1 << 15};
  learned.Learn({5}, KeyIndices::Listed({0}), big);
  CHECK_FALSE(learned.Layout(many, &offsets, &total));  // the first key is not known
  CHECK(offsets.capacity() == 0);
  many.front() = 5;
  CHECK_FALSE(learned.Layout(many, &offsets, &total));  // the second is not
  many.resize(1);
  REQUIRE(learned.Layout(many, &offsets, &total));
  CHECK(offsets == std::vector<uint64_t>{0});
  CHECK(total == (1 << 15));
}

}  // namespace
}  // namespace pscore::node
