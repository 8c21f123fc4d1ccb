// RequestTracker is pure bookkeeping: driven here by hand-made time points.
#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include <string>
#include <vector>

#include "pscore/comm/request_tracker.h"

namespace pscore::comm {

TEST_CASE("tracker: ids are fresh - each callback runs exactly once", "[comm][tracker]") {
  FakeClock clock;
  RequestTracker t;
  std::vector<std::pair<uint64_t, Code>> log;
  auto cb = [&](uint64_t tag) {
    return [&log, tag](Result<Frame> r) { log.emplace_back(tag, r.status().code()); };
  };
  TimePoint now = clock.Now();
  uint64_t a = t.Add(1, now + std::chrono::seconds(1), 1, cb(1));
  uint64_t b = t.Add(1, now + std::chrono::seconds(3), 2, cb(2));
  uint64_t c = t.Add(2, now + std::chrono::seconds(2), 3, cb(3));
  CHECK(a != 0);
  CHECK(a != b);
  CHECK(b != c);
  CHECK(t.pending() == 3);

  Frame answer;
  answer.meta.set_request_id(b);
  CHECK(t.Complete(b, std::move(answer)));
  CHECK_FALSE(t.Complete(b, Status(Code::kInternal, "duplicate")));  // second answer ignored
  CHECK(t.pending() == 2);

  clock.Advance(std::chrono::milliseconds(1500));
  CHECK(t.Expire(clock.Now()) == 1);  // only "a" is past its deadline
  CHECK(t.pending() == 1);

  CHECK(t.FailConnection(1, Status(Code::kUnavailable, "lost")) == 0);  // nothing left on 1
  CHECK(t.FailConnection(2, Status(Code::kUnavailable, "lost")) == 1);
  CHECK(t.pending() == 0);
  CHECK(t.Expire(clock.Now() + std::chrono::hours(1)) == 0);

  REQUIRE(log.size() == 3);
  CHECK(log[0] == std::make_pair(uint64_t{2}, Code::kOk));
  CHECK(log[1] == std::make_pair(uint64_t{1}, Code::kTimeout));
  CHECK(log[2] == std::make_pair(uint64_t{3}, Code::kUnavailable));
}

TEST_CASE("tracker: a lost connection fails its requests in issue order, with context",
          "[comm][tracker]") {
  FakeClock clock;
  // The describer names requests only when they fail.
  RequestTracker t([](ConnId conn, int cmd) {
    return conn == 8 ? std::string("other") : "req" + std::to_string(cmd);
  });
  std::vector<std::string> msgs;
  for (int i = 0; i < 5; ++i) {
    t.Add(7, clock.Now() + std::chrono::seconds(10 - i), i,
          [&msgs](Result<Frame> r) { msgs.push_back(r.status().message()); });
  }
  t.Add(8, clock.Now() + std::chrono::seconds(10), 0, [&msgs](Result<Frame> r) {
    msgs.push_back("other:" + std::string(r.ok() ? "ok" : r.status().message()));
  });
  CHECK(t.FailConnection(7, Status(Code::kUnavailable, "peer gone")) == 5);
  REQUIRE(msgs.size() == 5);
  for (int i = 0; i < 5; ++i) CHECK(msgs[i] == "req" + std::to_string(i) + ": peer gone");
  t.FailAll(Status(Code::kCancelled, "shutdown"));
  REQUIRE(msgs.size() == 6);
  CHECK(msgs[5] == "other:other: shutdown");
  CHECK(t.pending() == 0);
}

TEST_CASE("tracker: a callback may add a new request while being completed", "[comm][tracker]") {
  FakeClock clock;
  RequestTracker t;
  int second_ran = 0;
  t.Add(1, clock.Now(), 1, [&](Result<Frame>) {
    t.Add(1, clock.Now() + std::chrono::seconds(5), 2, [&](Result<Frame> r) {
      second_ran += r.status().code() == Code::kTimeout ? 1 : 100;
    });
  });
  CHECK(t.Expire(clock.Now()) == 1);
  CHECK(t.pending() == 1);
  clock.Advance(std::chrono::seconds(5));
  CHECK(t.Expire(clock.Now()) == 1);
  CHECK(second_ran == 1);
}

TEST_CASE("tracker: a sink is handed out once - to its own connection and length - and released before the callback",
          "[comm][tracker]") {
  FakeClock clock;
  RequestTracker t;
  std::vector<std::string> log;
  t.set_on_sink_release([&](ConnId conn, uint64_t id) { log.push_back("release " + std::to_string(conn) + "/" + std::to_string(id)); });
  char mem[64];
  auto cb = [&](const char* name) { return [&log, name](Result<Frame>) { log.push_back(name); }; };
  const TimePoint later = clock.Now() + std::chrono::seconds(1);
  uint64_t a = t.Add(1, later, 0, cb("a"), AnswerSink{mem, 64});
  uint64_t b = t.Add(1, later, 0, cb("b"));
  uint64_t c = t.Add(2, later, 0, cb("c"), AnswerSink{mem, 64});
  CHECK(t.TakeSink(a, 2, 64) == nullptr);   // another connection
  CHECK(t.TakeSink(a, 1, 63) == nullptr);   // another length
  CHECK(t.TakeSink(b, 1, 64) == nullptr);   // no sink
  CHECK(t.TakeSink(999, 1, 64) == nullptr); // unknown
  CHECK(t.TakeSink(a, 1, 64) == mem);
  CHECK(t.TakeSink(a, 1, 64) == nullptr);   // only once
  CHECK(t.Complete(b, Frame()));            // no sink taken: no release
  CHECK(t.Complete(a, Frame()));            // released, then its callback
  CHECK(t.TakeSink(c, 2, 64) == mem);
  clock.Advance(std::chrono::seconds(2));
  CHECK(t.Expire(clock.Now()) == 1);        // a deadline releases it too
  CHECK(log == std::vector<std::string>{"b", "release 1/" + std::to_string(a), "a", "release 2/" + std::to_string(c), "c"});
}

TEST_CASE("tracker: an answer is taken only from the connection its request went out on", "[comm][tracker]") {
  FakeClock clock;
  RequestTracker t;
  std::vector<std::string> log;
  auto cb = [&](const char* name) { return [&log, name](Result<Frame> r) { log.push_back(name + std::string(r.ok() ? " ok" : " failed")); }; };
  const TimePoint later = clock.Now() + std::chrono::seconds(1);
  uint64_t a = t.Add(1, later, 0, cb("a"));
  uint64_t b = t.Add(2, later, 0, cb("b"));
  CHECK_FALSE(t.CompleteFrom(2, a, Frame()));  // another connection: ignored, a still waits
  CHECK_FALSE(t.CompleteFrom(1, 999, Frame()));  // unknown
  CHECK(t.pending() == 2);
  CHECK(t.CompleteFrom(1, a, Frame()));
  CHECK_FALSE(t.CompleteFrom(1, a, Frame()));  // only once
  CHECK(t.CompleteFrom(2, b, Status(Code::kNotFound, "no")));
  CHECK(log == std::vector<std::string>{"a ok", "b failed"});
  CHECK(t.pending() == 0);
}

}  // namespace pscore::comm

namespace pscore::comm {

TEST_CASE("tracker: closing many connections fails exactly each one's pending requests, in issue order, and forgets them",
          "[comm][tracker]") {
  FakeClock clock;
  RequestTracker t;
  constexpr ConnId kConns = 300;
  std::vector<std::vector<uint64_t>> pending(kConns + 1), failed(kConns + 1);
  // Per connection: 200 requests, of which every third stays pending (the others are
  // answered, so the per-connection lists are compacted on the way).
  for (ConnId c = 1; c <= kConns; ++c) {
    for (int i = 0; i < 200; ++i) {
      uint64_t id = t.Add(c, clock.Now() + std::chrono::seconds(60), 1, [&failed, c](Result<Frame> r) {
        if (!r.ok()) failed[c].push_back(0);
      });
      if (i % 3 == 0) {
        pending[c].push_back(id);
      } else {
        CHECK(t.Complete(id, Frame{}));
      }
    }
  }
  CHECK(t.connections_indexed() == kConns);
  CHECK(t.pending() == kConns * 67);
  for (ConnId c = 1; c <= kConns; ++c) {
    CHECK(t.FailConnection(c, Status(Code::kUnavailable, "lost")) == pending[c].size());
    CHECK(failed[c].size() == pending[c].size());
  }
  CHECK(t.pending() == 0);
  CHECK(t.connections_indexed() == 0);
}

TEST_CASE("tracker: a request issued by a failure callback on the closed connection is not failed with it",
          "[comm][tracker]") {
  FakeClock clock;
  RequestTracker t;
  std::vector<std::string> log;
  uint64_t again = 0;
  t.Add(4, clock.Now() + std::chrono::seconds(5), 1, [&](Result<Frame> r) {
    log.push_back("first:" + std::to_string(static_cast<int>(r.status().code())));
    again = t.Add(4, clock.Now() + std::chrono::seconds(5), 2, [&log](Result<Frame> r2) {
      log.push_back("again:" + std::to_string(static_cast<int>(r2.status().code())));
    });
  });
  t.Add(4, clock.Now() + std::chrono::seconds(5), 3, [&log](Result<Frame>) { log.push_back("second"); });
  CHECK(t.FailConnection(4, Status(Code::kUnavailable, "lost")) == 2);
  REQUIRE(log.size() == 2);
  CHECK(log[0].rfind("first:", 0) == 0);
  CHECK(log[1] == "second");
  CHECK(t.pending() == 1);  // `again` waits for its own end
  CHECK(t.FailConnection(4, Status(Code::kUnavailable, "lost")) == 1);
  REQUIRE(log.size() == 3);
  CHECK(log[2].rfind("again:", 0) == 0);
  CHECK(again != 0);
  CHECK(t.connections_indexed() == 0);
}

}  // namespace pscore::comm
