// A server restarted from its data_dir that joins a scale-out as a new member drops the
// entries it restored and no migration sent again (ParamService::DropUnconfirmedRestored).
// When the disk refuses the drop's journal record: the entries are not served, the failure
// is reported as any refused change is (a server whose ranges all have other replicas steps
// down on it), and the drop reaches the journal before the next change it takes.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "pscore/comm/event_loop.h"
#include "pscore/core/kv_codec.h"
#include "pscore/node/server/param_service.h"

#include "multiproc/process.h"  // TempDir
#include "node/full_disk.h"
#include "node/no_links.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

// One server's parameter service over `data_dir`, opened (the journal restored).
struct Params {
  explicit Params(const std::string& data_dir)
      : params(ParamService::Options{"s0", data_dir, 0, 0}, core::ParamStore::Options{}, &loop, &ownership, &links,
               std::make_shared<std::atomic<uint64_t>>(0)) {
    params.set_on_journal_error([this](const Status&) { reported.fetch_add(1); });
    REQUIRE(loop.Start().ok());
    REQUIRE(params.Open().ok());
  }
  ~Params() {
    params.Stop();
    loop.Stop().IgnoreError();
  }
  // Entries of `keys`, one float each (the key's value), as a migration brings them.
  Status Insert(const std::vector<uint64_t>& keys) {
    std::vector<uint32_t> lens(keys.size(), 1);
    std::vector<float> values(keys.begin(), keys.end());
    BufferPtr body = core::EncodeKvPairs(keys.data(), keys.size(), lens.data(), values.data(), values.size());
    Result<core::KvView> view = core::DecodeKvPairs(body->data(), body->size(), /*expect_values=*/true);
    REQUIRE(view.ok());
    return params.InsertEntries(std::string_view(body->data(), body->size()), *view);
  }
  bool Has(uint64_t key) const {
    uint32_t len = 0;
    return params.store().Lens(&key, 1, &len).ok();
  }

  comm::EventLoop loop{"restored-drop-test"};
  KeyOwnership ownership{"s0"};
  testing::NoLinks links;
  ParamService params;
  std::atomic<int> reported{0};
};

TEST_CASE("a drop of stale restored entries the disk refuses - not served, reported, journaled before the next change",
          "[node][journal]") {
  testing::TempDir dir;
  const std::string data_dir = dir.File("s0");
  {
    Params earlier(data_dir);  // the membership before: keys 1, 2, 3
    REQUIRE(earlier.Insert({1, 2, 3}).ok());
  }
  Params joining(data_dir);
  for (uint64_t key : {1, 2, 3}) REQUIRE(joining.Has(key));
  REQUIRE(joining.Insert({2}).ok());  // key 2 is this server's in the new view: sent again

  testing::FileSizeLimit full(testing::NewestSegmentBytes(data_dir));
  REQUIRE(full.ok());
  CHECK(joining.params.DropUnconfirmedRestored() == 2);
  CHECK_FALSE(joining.Has(1));
  CHECK(joining.Has(2));
  CHECK_FALSE(joining.Has(3));
  CHECK(joining.params.journal_errors() == 1);
  CHECK(joining.reported.load() == 1);
  CHECK(joining.Insert({4}).code() == Code::kUnavailable);  // the disk is still full
  CHECK(joining.reported.load() == 2);

  full.Lift();
  REQUIRE(joining.Insert({1, 4}).ok());  // key 1 sent again after the drop: it must survive it
  joining.params.Stop();
  Params restarted(data_dir);
  CHECK(restarted.Has(1));
  CHECK(restarted.Has(2));
  CHECK_FALSE(restarted.Has(3));
  CHECK(restarted.Has(4));
}

TEST_CASE("a drop of stale restored entries the disk takes is journaled at once", "[node][journal]") {
  testing::TempDir dir;
  const std::string data_dir = dir.File("s0");
  {
    Params earlier(data_dir);
    REQUIRE(earlier.Insert({1, 2, 3}).ok());
  }
  {
    Params joining(data_dir);
    REQUIRE(joining.Insert({2}).ok());
    CHECK(joining.params.DropUnconfirmedRestored() == 2);
    CHECK(joining.params.journal_errors() == 0);
    CHECK(joining.reported.load() == 0);
  }
  Params restarted(data_dir);
  CHECK_FALSE(restarted.Has(1));
  CHECK(restarted.Has(2));
  CHECK_FALSE(restarted.Has(3));
}

}  // namespace
}  // namespace pscore::node
