// A KV SET that must not overwrite, re-issued after its first send's answer was lost: the
// first send may have stored the value, so the re-issue is refused "already exists"; the
// member then reads the key, and a value equal to its own is its own success, any other
// value the conflict it is (Node::KvSetAsync).
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "pscore/node/common/wire.h"
#include "pscore/node/worker/worker_node.h"
#include "node/test_options.h"

#include "node/raw_link.h"  // last: pulls in Catch

namespace pscore::node {
namespace {

using namespace std::chrono_literals;

// A scheduler stand-in with a KV store whose first SET of a key is applied and then its
// link closed instead of answered (the answer lost). `other_value`, if set, is what that
// first SET stores instead: another member's set that got there first.
class AnswerLosingScheduler {
 public:
  explicit AnswerLosingScheduler(std::string other_value = "") : other_value_(std::move(other_value)) {}
  int port() const { return listener_.port(); }
  // SETs received, TRY_GETs received.
  int sets() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sets_;
  }
  int reads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reads_;
  }
  std::string value_of(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = store_.find(key);
    return it == store_.end() ? "" : it->second;
  }

 private:
  void OnRequest(comm::ConnId conn, const comm::Frame& frame) {
    if (frame.meta.cmd() == pb::REGISTER) {
      pb::RegisterRespMessage resp;
      resp.set_rank_id(0);
      resp.set_session_id(1);
      listener_.messenger().Reply(conn, frame.meta, resp).IgnoreError();
      return;
    }
    if (frame.meta.cmd() != pb::KV_REQUEST) {
      listener_.messenger().Reply(conn, frame.meta, Status::Ok()).IgnoreError();
      return;
    }
    pb::KvRequest req;
    Status parsed = ParsePayload(frame, &req);
    if (!parsed.ok() || (req.op() != pb::KvRequest::TRY_GET && req.op() != pb::KvRequest::SET)) {
      // The cases below fail on this answer (no Catch macros off the test's thread).
      listener_.messenger().Reply(conn, frame.meta, Status(Code::kInvalidArgument, "not a SET or TRY_GET")).IgnoreError();
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (req.op() == pb::KvRequest::TRY_GET) {
      ++reads_;
      auto it = store_.find(req.key());
      if (it == store_.end()) {
        listener_.messenger().Reply(conn, frame.meta, Status(Code::kNotFound, "no " + req.key())).IgnoreError();
        return;
      }
      pb::KvResponse resp;
      resp.set_value(it->second);
      listener_.messenger().Reply(conn, frame.meta, resp).IgnoreError();
      return;
    }
    ++sets_;
    if (sets_ == 1) {
      store_[req.key()] = other_value_.empty() ? req.value() : other_value_;
      listener_.messenger().transport().Close(conn, Status(Code::kUnavailable, "answer lost"));
      return;
    }
    auto [it, added] = store_.emplace(req.key(), req.value());
    if (!added && !req.overwrite()) {
      listener_.messenger().Reply(conn, frame.meta, Status(Code::kAlreadyExists, "kv key " + req.key() + " already exists"))
          .IgnoreError();
      return;
    }
    it->second = req.value();
    listener_.messenger().Reply(conn, frame.meta, Status::Ok()).IgnoreError();
  }

  const std::string other_value_;
  mutable std::mutex mu_;
  std::map<std::string, std::string> store_;
  int sets_ = 0;
  int reads_ = 0;
  testing::RawListener listener_{[this](comm::ConnId conn, comm::Frame&& frame) { OnRequest(conn, frame); }};
};

NodeOptions WorkerOpts(int port) {
  NodeOptions o = testing::TestWorkerOptions(port, "w0");
  o.heartbeat_interval = 30s;  // only the calls below reach the stand-in
  o.recovery_timeout = 30s;
  return o;
}

TEST_CASE("a re-issued KV set that must not overwrite and finds its own value succeeds", "[node][net][coord]") {
  AnswerLosingScheduler sched;
  WorkerNode w(WorkerOpts(sched.port()));
  REQUIRE(w.Start().ok());
  CHECK(w.KvSet("k", "mine", /*overwrite=*/false).ok());
  CHECK(sched.sets() == 2);   // the first send, then its re-issue
  CHECK(sched.reads() == 1);  // the re-issue's refusal checked once
  CHECK(sched.value_of("k") == "mine");
  w.Stop();
}

TEST_CASE("a re-issued KV set that must not overwrite and finds another value is refused already exists",
          "[node][net][coord]") {
  AnswerLosingScheduler sched("theirs");
  WorkerNode w(WorkerOpts(sched.port()));
  REQUIRE(w.Start().ok());
  Status st = w.KvSet("k", "mine", /*overwrite=*/false);
  CHECK(st.code() == Code::kAlreadyExists);
  CHECK_THAT(st.message(), Catch::Contains("kv key k already exists"));
  CHECK(sched.value_of("k") == "theirs");
  w.Stop();
}

TEST_CASE("a re-issued KV set that may overwrite is not checked", "[node][net][coord]") {
  AnswerLosingScheduler sched("theirs");
  WorkerNode w(WorkerOpts(sched.port()));
  REQUIRE(w.Start().ok());
  CHECK(w.KvSet("k", "mine", /*overwrite=*/true).ok());
  CHECK(sched.sets() == 2);
  CHECK(sched.reads() == 0);
  CHECK(sched.value_of("k") == "mine");
  w.Stop();
}

}  // namespace
}  // namespace pscore::node
