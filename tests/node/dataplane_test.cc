// Data plane tests: worker -> server messaging (by user_cmd and by name), failures that
// must reach the caller (lost server, handler error, malformed push payloads), Push/Pull
// through the built-in parameter store, and large tensors with heartbeats on time.
// Every node runs in this process on its own loop, on 127.0.0.1 with ephemeral ports.
#include <algorithm>
#include <numeric>
#include <atomic>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "comm/test_util.h"  // RawSocket, EncodeFrame; before Catch (its CHECK note)
#include "pscore/core/key_range.h"
#include "pscore/core/kv_codec.h"
#include "pscore/node/common/wire.h"
#include "pscore/node/scheduler/scheduler_node.h"
#include "pscore/node/server/server_journal.h"
#include "pscore/node/server/server_node.h"
#include "multiproc/process.h"  // TempDir
#include "pscore/node/worker/push_parts.h"
#include "pscore/node/worker/worker_node.h"
#include "node/node_probe.h"

#include <catch2/catch.hpp>  // last: its CHECK must win over glog's

namespace pscore::node {
namespace {

using namespace std::chrono_literals;
constexpr auto kDeadline = std::chrono::seconds(30);

// Waits for a future with a deadline; a missed deadline fails the test instead of hanging.
template <typename T>
T Await(std::future<T>& f, Duration timeout = kDeadline) {
  if (f.wait_for(timeout) != std::future_status::ready) FAIL("no answer within the deadline");
  return f.get();
}
template <typename T>
T Await(std::future<T>&& f, Duration timeout = kDeadline) {
  return Await(f, timeout);
}

// Scheduler + S servers + W workers in one process. `setup` runs on each server before
// Start (register handlers there). Everything is stopped by the destructor, also when a
// REQUIRE fails half-way.
class TestCluster {
 public:
  struct Config {
    int workers = 1;
    int servers = 1;
    core::ParamStore::Options store;
    uint64_t max_message_bytes = 256ull << 20;
    Duration request_timeout = std::chrono::seconds(60);
    Duration heartbeat_timeout = std::chrono::milliseconds(3000);
    Duration connect_timeout = std::chrono::seconds(10);
    std::function<void(ServerNode&)> setup;
    std::string data_dir;  // when set, server i journals in data_dir/s<i>
    uint64_t journal_compact_bytes = 64ull << 20;
    size_t push_slice_keys = NodeOptions{}.push_slice_keys;
    Duration worker_poll_spin{0};
  };

  explicit TestCluster(Config c) : config_(std::move(c)) {
    SchedulerOptions so;
    so.worker_num = config_.workers;
    so.server_num = config_.servers;
    so.heartbeat_interval = 50ms;
    so.heartbeat_timeout = config_.heartbeat_timeout;
    so.max_message_bytes = config_.max_message_bytes;
    sched_ = std::make_unique<SchedulerNode>(so);
  }
  ~TestCluster() {
    for (auto& w : workers_) w->Stop();
    for (auto& s : servers_) s->Stop();
    if (sched_) sched_->Stop();
  }

  NodeOptions Opts(const std::string& id) const {
    NodeOptions o;
    o.scheduler_port = sched_->port();
    o.node_id = id;
    o.heartbeat_interval = 50ms;
    o.connect_timeout = config_.connect_timeout;
    o.request_timeout = config_.request_timeout;
    o.max_message_bytes = config_.max_message_bytes;
    o.push_slice_keys = config_.push_slice_keys;
    return o;
  }

  // Starts everything and waits for READY; counts NODE_TIMED_OUT events seen by any node.
  void Start() {
    REQUIRE(sched_->Start().ok());
    Node::Callbacks cb;
    cb.on_cluster_event = [this](const pb::ClusterEventMessage& ev) {
      if (ev.kind() == pb::ClusterEventMessage::NODE_TIMED_OUT) ++timeouts_;
    };
    for (int i = 0; i < config_.servers; ++i) {
      NodeOptions o = Opts("s" + std::to_string(i));
      if (!config_.data_dir.empty()) o.data_dir = config_.data_dir + "/s" + std::to_string(i);
      o.journal_compact_bytes = config_.journal_compact_bytes;
      servers_.push_back(std::make_unique<ServerNode>(o, config_.store));
      if (config_.setup) config_.setup(*servers_.back());
      servers_.back()->SetCallbacks(cb);
      REQUIRE(servers_.back()->Start().ok());
    }
    for (int i = 0; i < config_.workers; ++i) {
      NodeOptions o = Opts("w" + std::to_string(i));
      o.poll_spin = config_.worker_poll_spin;
      workers_.push_back(std::make_unique<WorkerNode>(o));
      workers_.back()->SetCallbacks(cb);
      REQUIRE(workers_.back()->Start().ok());
    }
    for (auto& s : servers_) REQUIRE(s->WaitForReady(kDeadline).ok());
    for (auto& w : workers_) REQUIRE(w->WaitForReady(kDeadline).ok());
  }

  WorkerNode& worker(int i) { return *workers_[i]; }
  ServerNode& server(int i) { return *servers_[i]; }
  // The server object holding `rank` (ranks are given in arrival order).
  ServerNode& server_of_rank(int rank) {
    for (auto& s : servers_) {
      if (s->rank() == rank) return *s;
    }
    FAIL("no server has rank " << rank);
    return *servers_[0];
  }
  int timeouts() const { return timeouts_.load(); }

 private:
  Config config_;
  std::unique_ptr<SchedulerNode> sched_;
  std::vector<std::unique_ptr<ServerNode>> servers_;
  std::vector<std::unique_ptr<WorkerNode>> workers_;
  std::atomic<int> timeouts_{0};
};

// A cluster of `workers` and `servers` with the default configuration.
TestCluster::Config Nodes(int workers, int servers) {
  TestCluster::Config c;
  c.workers = workers;
  c.servers = servers;
  return c;
}

// The same whose servers store what is pushed as it is (the `assign` rule).
TestCluster::Config AssignNodes(int workers, int servers) {
  TestCluster::Config c = Nodes(workers, servers);
  c.store.rule = core::UpdateRule::kAssign;
  return c;
}

std::string Str(const BufferPtr& b) { return b ? std::string(b->view()) : std::string(); }

// The echo-with-transform handlers: by user_cmd 7 the server prefixes its rank; by name
// "reverse" it prefixes its rank and reverses the payload.
void EchoHandlers(ServerNode& s) {
  ServerNode* self = &s;
  s.RegisterHandler(7, [self](const DataRequest& req, Responder r) {
    r.Reply(Buffer::FromString("cmd7/r" + std::to_string(self->rank()) + "/w" + std::to_string(req.from_rank) +
                               "/" + Str(req.payload)));
  });
  s.RegisterHandler("reverse", [self](const DataRequest& req, Responder r) {
    std::string p = Str(req.payload);
    std::reverse(p.begin(), p.end());
    r.Reply(Buffer::FromString("rev/r" + std::to_string(self->rank()) + "/" + p));
  });
}

// A raw link to `port` that says it is worker w0 (a member), to send a push in parts.
void ConnectAsW0(comm::testing::RawSocket& raw, int port) {
  REQUIRE(raw.Connect(port));
  pb::HelloMessage hello;
  hello.set_node_id("w0");
  hello.set_role(pb::WORKER);
  pb::MessageMeta meta = MakeMeta(pb::HELLO, pb::WORKER, 0);
  meta.set_oneway(true);
  REQUIRE(raw.SendAll(comm::testing::EncodeFrame(meta, ToBuffer(hello)->view())));
}

// A push of `values` (lens[i] floats for keys[i], back to back) framed as a ZPush frames
// it: the head, then the floats, with payload_head set, so a server may fold it in as it
// arrives.
std::string StreamablePush(const std::vector<uint64_t>& keys, const std::vector<uint32_t>& lens,
                           const std::vector<float>& values, uint64_t request_id) {
  const char* floats = reinterpret_cast<const char*>(values.data());
  const size_t bytes = values.size() * sizeof(float);
  Result<Payload> push = core::EncodeKvPairsShared(keys.data(), keys.size(), lens.data(), {Slice{nullptr, floats, bytes}});
  REQUIRE(push.ok());
  pb::MessageMeta meta = MakeMeta(pb::SEND_DATA, pb::WORKER, 0);
  meta.set_handler(kPushHandler);
  meta.set_request_id(request_id);
  meta.set_payload_head(push->head->size());
  return comm::testing::EncodeFrame(meta, std::string(push->head->view()) + std::string(floats, bytes));
}

// Waits until `n` keys of the server's store are held by streams.
void WaitHeldByStreams(ServerNode& server, uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (server.store().keys_held_by_streams() < n) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(5ms);
  }
}

}  // namespace

TEST_CASE("10000 interleaved requests from 4 workers to 3 servers are all answered correctly",
          "[node][net][dataplane]") {
  TestCluster::Config config;
  config.workers = 4;
  config.servers = 3;
  config.setup = EchoHandlers;
  TestCluster c(config);
  c.Start();

  constexpr int kPerWorker = 2500;
  std::vector<std::thread> threads;
  std::atomic<int> correct{0};
  std::atomic<int> wrong{0};
  std::mutex first_mu;
  std::string first_wrong;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      WorkerNode& worker = c.worker(w);
      std::vector<std::future<Result<BufferPtr>>> futures;
      std::vector<std::string> expected;
      for (int i = 0; i < kPerWorker; ++i) {
        int rank = (i + w) % 3;
        std::string body = "w" + std::to_string(w) + "-" + std::to_string(i);
        if (i % 2 == 0) {
          futures.push_back(worker.Send(rank, 7, Buffer::FromString(body)));
          expected.push_back("cmd7/r" + std::to_string(rank) + "/w" + std::to_string(worker.rank()) + "/" + body);
        } else {
          futures.push_back(worker.Call(rank, "reverse", Buffer::FromString(body)));
          std::reverse(body.begin(), body.end());
          expected.push_back("rev/r" + std::to_string(rank) + "/" + body);
        }
      }
      for (size_t i = 0; i < futures.size(); ++i) {
        std::string got = "<no answer>";
        if (futures[i].wait_for(kDeadline) == std::future_status::ready) {
          Result<BufferPtr> r = futures[i].get();
          got = r.ok() ? Str(*r) : r.status().ToString();
        }
        if (got == expected[i]) {
          ++correct;
        } else if (wrong++ == 0) {
          std::lock_guard<std::mutex> lock(first_mu);
          first_wrong = "expected '" + expected[i] + "' got '" + got + "'";
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  INFO(first_wrong);
  CHECK(wrong.load() == 0);
  CHECK(correct.load() == 4 * kPerWorker);
}

TEST_CASE("an unknown user_cmd or handler name is answered kNotFound", "[node][net][dataplane]") {
  TestCluster::Config config;
  config.setup = EchoHandlers;
  TestCluster c(config);
  c.Start();
  auto a = c.worker(0).Send(0, 99, Buffer::FromString("x"));
  Result<BufferPtr> ra = Await(a);
  CHECK(ra.status().code() == Code::kNotFound);
  CHECK_THAT(ra.status().message(), Catch::Contains("user_cmd 99"));
  auto b = c.worker(0).Call(0, "no_such_fn", nullptr);
  Result<BufferPtr> rb = Await(b);
  CHECK(rb.status().code() == Code::kNotFound);
  CHECK_THAT(rb.status().message(), Catch::Contains("no_such_fn"));
}

TEST_CASE("a handler error reaches the caller as that error", "[node][net][dataplane]") {
  TestCluster::Config config;
  config.setup = [](ServerNode& s) {
    s.RegisterHandler("apply_adam", [](const DataRequest& req, Responder r) {
      r.Fail(Status(Code::kFailedPrecondition, "apply_adam: shape 3x4 does not match 4x3"));
    });
    // Answers from another thread, after the handler returned.
    s.RegisterHandler(5, [](const DataRequest& req, Responder r) {
      std::thread([r] { r.Fail(Status(Code::kInvalidArgument, "late failure from a user thread")); }).detach();
    });
    s.RegisterHandler("forgets", [](const DataRequest&, Responder) {});
  };
  TestCluster c(config);
  c.Start();

  auto f1 = c.worker(0).Call(0, "apply_adam", Buffer::FromString("g"));
  Result<BufferPtr> r1 = Await(f1);
  CHECK(r1.status().code() == Code::kFailedPrecondition);
  CHECK_THAT(r1.status().message(), Catch::Contains("shape 3x4 does not match 4x3"));

  auto f2 = c.worker(0).Send(0, 5, nullptr);
  Result<BufferPtr> r2 = Await(f2);
  CHECK(r2.status().code() == Code::kInvalidArgument);
  CHECK_THAT(r2.status().message(), Catch::Contains("late failure from a user thread"));

  auto f3 = c.worker(0).Call(0, "forgets", nullptr);
  Result<BufferPtr> r3 = Await(f3);
  CHECK(r3.status().code() == Code::kInternal);
  CHECK_THAT(r3.status().message(), Catch::Contains("did not answer"));
}

TEST_CASE("a stopped server fails the requests pending on it with a clear status, not a hang",
          "[node][net][dataplane]") {
  // Responders parked by the "hold" handler; released before the servers are destroyed.
  struct Parked {
    std::mutex mu;
    std::vector<Responder> held;
  };
  auto parked = std::make_shared<Parked>();
  TestCluster::Config config;
  config.servers = 2;
  config.heartbeat_timeout = 10s;  // the stopped server must not end the test through a timeout
  config.connect_timeout = 2s;     // bounds the redial of the stopped server at the end
  config.setup = [parked](ServerNode& s) {
    s.RegisterHandler("hold", [parked](const DataRequest&, Responder r) {
      std::lock_guard<std::mutex> lock(parked->mu);
      parked->held.push_back(r);
    });
    EchoHandlers(s);
  };
  TestCluster c(config);
  c.Start();

  ServerNode& victim = c.server_of_rank(1);
  std::vector<std::future<Result<BufferPtr>>> pending;
  for (int i = 0; i < 20; ++i) pending.push_back(c.worker(0).Call(1, "hold", Buffer::FromString("x")));
  // Wait until every request reached the handler, so they are really in flight there.
  auto deadline = std::chrono::steady_clock::now() + kDeadline;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(parked->mu);
      if (parked->held.size() == 20) break;
    }
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(5ms);
  }
  victim.Stop();
  for (auto& f : pending) {
    // The request timeout is 60 s: an answer within the deadline means the loss was noticed.
    Result<BufferPtr> r = Await(f, 20s);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kUnavailable);
    CHECK_FALSE(r.status().message().empty());
  }
  {
    std::lock_guard<std::mutex> lock(parked->mu);
    parked->held.clear();
  }
  // The other server still serves.
  auto ok = c.worker(0).Send(0, 7, Buffer::FromString("still"));
  Result<BufferPtr> r = Await(ok);
  REQUIRE(r.ok());
  CHECK_THAT(Str(*r), Catch::EndsWith("/still"));
  // A new request to the stopped server fails too (at once or on connect), never hangs.
  auto late = c.worker(0).Call(1, "hold", nullptr);
  CHECK_FALSE(Await(late).ok());
}

TEST_CASE("a worker stopped with pushes and pulls on the wire answers them kCancelled - not a hang",
          "[node][net][dataplane]") {
  // A handler blocks the worker's lane on the server, so the push and pull sent after it
  // wait there, unanswered, when the worker stops.
  auto gate = std::make_shared<std::promise<void>>();
  std::shared_future<void> open = gate->get_future().share();
  auto entered = std::make_shared<std::promise<void>>();
  TestCluster::Config config;
  config.setup = [open, entered](ServerNode& s) {
    s.RegisterHandler("block", [open, entered](const DataRequest&, Responder r) {
      entered->set_value();
      open.wait_for(20s);
      r.Reply(nullptr);
    });
  };
  TestCluster c(config);
  c.Start();
  WorkerNode& w = c.worker(0);
  auto blocked = w.Call(0, "block", nullptr);
  REQUIRE(entered->get_future().wait_for(kDeadline) == std::future_status::ready);
  std::future<Status> push = w.Push({1, 2}, {1, 1});
  std::future<Result<PullResult>> pull = w.Pull({1, 2});
  CHECK(push.wait_for(200ms) == std::future_status::timeout);  // on the wire, behind the handler
  w.Stop();
  const bool push_ready = push.wait_for(10s) == std::future_status::ready;
  const bool pull_ready = pull.wait_for(10s) == std::future_status::ready;
  const bool call_ready = blocked.wait_for(10s) == std::future_status::ready;
  gate->set_value();
  REQUIRE(push_ready);
  REQUIRE(pull_ready);
  REQUIRE(call_ready);
  Status ps = push.get();
  INFO(ps.ToString());
  CHECK(ps.code() == Code::kCancelled);
  CHECK(pull.get().status().code() == Code::kCancelled);
  CHECK(blocked.get().status().code() == Code::kCancelled);
}

TEST_CASE("a handler may stop its own server - Stop returns, no deadlock with the executor", "[node][net][dataplane]") {
  // A "shutdown" RPC: the handler runs on an executor thread, which Stop's teardown joins.
  auto stopped = std::make_shared<std::promise<void>>();
  TestCluster::Config config;
  config.setup = [stopped](ServerNode& s) {
    ServerNode* server = &s;
    s.RegisterHandler("shutdown", [server, stopped](const DataRequest&, Responder r) {
      r.Reply(nullptr);
      server->Stop();
      stopped->set_value();
    });
  };
  TestCluster c(config);
  c.Start();
  auto f = c.worker(0).Call(0, "shutdown", nullptr);
  REQUIRE(stopped->get_future().wait_for(20s) == std::future_status::ready);  // before: never
  CHECK(f.wait_for(20s) == std::future_status::ready);  // answered, or failed as the link went
}

TEST_CASE("Push/Pull: sums from 8 workers x 1000 pushes are exact", "[node][net][dataplane]") {
  TestCluster::Config config;
  config.workers = 8;
  config.servers = 2;
  config.store.rule = core::UpdateRule::kSum;
  TestCluster c(config);
  c.Start();

  const std::vector<uint64_t> keys = {0, 1, 2, 3, 10, 11, 1000, 123456789};
  constexpr int kLen = 4;
  constexpr int kPushes = 1000;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int w = 0; w < 8; ++w) {
    threads.emplace_back([&, w] {
      // Worker w adds w+1 to every element; integers stay exact in float (< 2^24).
      std::vector<float> values(keys.size() * kLen, static_cast<float>(w + 1));
      std::vector<std::future<Status>> window;
      for (int i = 0; i < kPushes; ++i) {
        window.push_back(c.worker(w).Push(keys, values));
        if (window.size() == 32 || i + 1 == kPushes) {
          for (auto& f : window) {
            if (f.wait_for(kDeadline) != std::future_status::ready || !f.get().ok()) ++failures;
          }
          window.clear();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(failures.load() == 0);
  const float expected = kPushes * (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8);
  for (int w = 0; w < 8; ++w) {
    auto f = c.worker(w).Pull(keys);
    Result<PullResult> r = Await(f);
    REQUIRE(r.ok());
    REQUIRE(r->lens == std::vector<uint32_t>(keys.size(), kLen));
    for (float v : r->values) CHECK(v == expected);
  }
  // Both servers hold part of the keys (the partition spreads them).
  CHECK(c.server(0).store().num_keys() + c.server(1).store().num_keys() == keys.size());
  CHECK(c.server(0).store().num_keys() > 0);
  CHECK(c.server(1).store().num_keys() > 0);
}

TEST_CASE("a worker with poll_spin reads exact sums call by call - its loop polls, one without does not",
          "[node][net][dataplane]") {
  for (Duration spin : {Duration(0), Duration(std::chrono::seconds(60))}) {
    INFO("poll_spin " << ToMillis(spin) << " ms");
    TestCluster::Config cfg;
    cfg.servers = 2;
    cfg.worker_poll_spin = spin;
    TestCluster c(cfg);
    c.Start();
    WorkerNode& w = c.worker(0);
    const std::vector<uint64_t> keys = {3, 1000003, 2000003};  // spread over both servers
    for (int r = 1; r <= 300; ++r) {
      REQUIRE(Await(w.Push(keys, std::vector<float>(keys.size(), static_cast<float>(r)))).ok());
      Result<PullResult> got = Await(w.Pull(keys));
      REQUIRE(got.ok());
      REQUIRE(got->values == std::vector<float>(keys.size(), static_cast<float>(r * (r + 1) / 2)));
    }
    bool spinning = false;
    w.loop()->RunAndWait([&] { spinning = w.loop()->spinning(); });
    CHECK(spinning == (spin.count() > 0));
  }
}

// Regression: requests of one connection run on one executor lane, in order, so a pull
// cannot overtake the push issued just before it.
TEST_CASE("a Pull issued after a Push from the same worker sees that Push", "[node][net][dataplane]") {
  TestCluster c(AssignNodes(1, 2));
  c.Start();
  const std::vector<uint64_t> keys = {1, 2, 3, 4, 5, 6};
  std::vector<std::future<Status>> pushes;
  for (int i = 1; i <= 200; ++i) {
    pushes.push_back(c.worker(0).Push(keys, std::vector<float>(keys.size() * 16, static_cast<float>(i))));
    // Issued before the push was answered: ordering must come from the data plane itself.
    auto pull = c.worker(0).Pull(keys);
    Result<PullResult> r = Await(pull);
    REQUIRE(r.ok());
    REQUIRE(r->values.size() == keys.size() * 16);
    INFO("round " << i);
    CHECK(r->values.front() == static_cast<float>(i));
    CHECK(r->values.back() == static_cast<float>(i));
  }
  for (auto& f : pushes) CHECK(Await(f).ok());
}

TEST_CASE("a Pull issued after a Push sees it even when the server refused that Push once and it was sent again",
          "[node][net][dataplane]") {
  // The server refuses one push kAborted (as when its keys move in a scale, or a stalled
  // stream is revoked): the worker holds it and sends it again 50 ms later. The pull
  // issued right after it was answered in between; it must not be the caller's answer.
  auto refuse = std::make_shared<std::atomic<int>>(0);
  TestCluster::Config config;
  config.store.rule = core::UpdateRule::kSum;
  config.setup = [refuse](ServerNode& s) {
    ServerNode* server = &s;
    s.RegisterHandler(kPushHandler, [server, refuse](const DataRequest& req, Responder r) {
      if (refuse->exchange(0) > 0) return r.Fail(Status(Code::kAborted, "test: these keys moved"));
      Result<core::KvView> v = core::DecodeKvPairs(req.payload->data(), req.payload->size(), true);
      if (!v.ok()) return r.Fail(v.status());
      Status st = server->store().Push(v->keys, v->Lengths(), v->values, v->num_keys);
      if (!st.ok()) return r.Fail(st);
      r.Reply(nullptr);
    });
  };
  TestCluster c(config);
  c.Start();
  WorkerNode& w = c.worker(0);
  REQUIRE(Await(w.Push({7}, std::vector<float>{1.0f})).ok());
  for (int round = 0; round < 5; ++round) {
    INFO("round " << round);
    refuse->store(1);
    auto pushed = w.Push({7}, std::vector<float>{2.0f});
    auto pulled = w.Pull({7});
    REQUIRE(Await(pushed).ok());
    Result<PullResult> r = Await(pulled);
    REQUIRE(r.ok());
    CHECK(r->values == std::vector<float>{3.0f + 2.0f * round});
  }
}

TEST_CASE("a Push without lens gives every key an equal share of the values, which must divide",
          "[node][net][dataplane]") {
  for (int servers : {1, 2}) {
    INFO(servers << " servers");
    TestCluster c(Nodes(1, servers));
    c.Start();
    WorkerNode& w = c.worker(0);
    std::vector<uint64_t> keys(1000);
    std::vector<float> values(keys.size() * 3);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 104729 + 11;
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 997);
    REQUIRE(Await(w.Push(keys, values)).ok());
    Result<PullResult> r = Await(w.Pull(keys));
    REQUIRE(r.ok());
    CHECK(r->lens == std::vector<uint32_t>(keys.size(), 3));
    CHECK(r->values == values);
    // Values that do not divide among the keys, or lens that do not add up to them: refused
    // before anything is sent.
    std::vector<float> short_by_one(values.begin(), values.end() - 1);
    Status uneven = Await(w.Push(keys, short_by_one));
    CHECK(uneven.code() == Code::kInvalidArgument);
    CHECK_THAT(uneven.message(), Catch::Contains("1000 keys, 0 lens and 2999 values do not match"));
    Status wrong = Await(w.Push(keys, values, std::vector<uint32_t>(keys.size(), 2)));
    CHECK(wrong.code() == Code::kInvalidArgument);
    CHECK_THAT(wrong.message(), Catch::Contains("1000 keys, 1000 lens and 3000 values do not match"));
    CHECK(Await(w.Push({}, {1.0f})).code() == Code::kInvalidArgument);  // values for no key
    Result<PullResult> again = Await(w.Pull(keys));
    REQUIRE(again.ok());
    CHECK(again->values == values);  // the refused pushes changed nothing
  }
}

TEST_CASE("a Push of more than push_slice_keys keys goes in slices, one request each, every one applied once - with lens or rows",
          "[node][net][dataplane]") {
  for (int servers : {1, 2}) {
    INFO(servers << " servers");
    TestCluster::Config config = Nodes(1, servers);
    config.store.rule = core::UpdateRule::kSum;
    config.push_slice_keys = 200;
    TestCluster c(config);
    c.Start();
    WorkerNode& w = c.worker(0);
    w.SetPushIds(7, 1);
    // Rows of two floats, keys in no order; then keys of 1 to 3 floats given by lens.
    std::vector<uint64_t> keys(3000);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 104729 + 11;
    std::shuffle(keys.begin(), keys.end(), std::mt19937(5));
    std::vector<float> rows(keys.size() * 2);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 1013);
    std::vector<uint64_t> lens_keys(2000);
    std::vector<uint32_t> lens(lens_keys.size());
    for (size_t i = 0; i < lens_keys.size(); ++i) {
      lens_keys[i] = i * 7919 + 5;
      lens[i] = static_cast<uint32_t>(1 + i % 3);
    }
    std::vector<float> lens_values(std::accumulate(lens.begin(), lens.end(), size_t{0}));
    for (size_t i = 0; i < lens_values.size(); ++i) lens_values[i] = static_cast<float>(i % 101);

    // The requests each push makes: one per owning server of each slice.
    size_t parts = 0;
    auto count_parts = [&](const std::vector<uint64_t>& k, const uint32_t* l, size_t num_values) {
      const std::shared_ptr<const void> none;
      const PushInput in{k.data(), k.size(), l, l ? 0u : static_cast<uint32_t>(num_values / k.size()), nullptr,
                         num_values, none};
      const size_t slice = SliceKeys(in, config.push_slice_keys);
      REQUIRE(slice < k.size() / 8);  // many slices
      for (size_t b = 0; b < k.size(); b += slice) {
        std::set<int> owners;
        for (size_t i = b; i < std::min(k.size(), b + slice); ++i) owners.insert(core::ServerForKey(k[i], servers));
        parts += owners.size();
      }
    };
    REQUIRE(Await(w.Push(keys, rows)).ok());
    REQUIRE(Await(w.Push(keys, rows)).ok());
    REQUIRE(Await(w.Push(lens_keys, lens_values, lens)).ok());
    count_parts(keys, nullptr, rows.size());
    count_parts(keys, nullptr, rows.size());
    count_parts(lens_keys, lens.data(), lens_values.size());

    Result<PullResult> r = Await(w.Pull(keys));
    REQUIRE(r.ok());
    CHECK(r->lens == std::vector<uint32_t>(keys.size(), 2));
    std::vector<float> twice(rows);
    for (float& v : twice) v *= 2;
    CHECK(r->values == twice);
    Result<PullResult> l = Await(w.Pull(lens_keys));
    REQUIRE(l.ok());
    CHECK(l->lens == lens);
    CHECK(l->values == lens_values);
    // Each request of the pushes had an id of its own, and each was applied by one server.
    size_t applied = 0;
    for (uint64_t seq = 1; seq <= parts + 10; ++seq) {
      for (int s = 0; s < servers; ++s) {
        applied += c.server(s).push_window().Applied(core::PushId{"w0", 7, seq}) ? 1 : 0;
      }
    }
    CHECK(applied == parts);
  }
}

TEST_CASE("a worker stopped while the slices of a Push are on the wire ends that Push - kCancelled or done, never a hang",
          "[node][net][dataplane]") {
  TestCluster::Config config = Nodes(1, 1);
  config.push_slice_keys = 4;  // 50,000 requests
  TestCluster c(config);
  c.Start();
  WorkerNode& w = c.worker(0);
  w.SetPushIds(3, 1);
  std::vector<uint64_t> keys(200000);
  std::iota(keys.begin(), keys.end(), uint64_t{1});
  std::future<Status> push = w.Push(keys, std::vector<float>(keys.size(), 1.0f));
  // Stopped once the first slice was applied, with most still to be sent or answered.
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (!c.server(0).push_window().Applied(core::PushId{"w0", 3, 1})) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(1ms);
  }
  w.Stop();
  REQUIRE(push.wait_for(10s) == std::future_status::ready);
  Status st = push.get();
  INFO(st.ToString());
  CHECK((st.ok() || st.code() == Code::kCancelled));
}

TEST_CASE("large Pulls answered from the store's memory see each Push whole and in order",
          "[node][net][dataplane]") {
  // Keys of 128 KiB: the server answers them with the stored memory itself (no copy), so
  // pushes arriving while an answer is still being written must not show through it.
  TestCluster c(Nodes(2, 2));
  c.Start();
  const std::vector<uint64_t> keys = {10, 20, 30, 40};
  const size_t per_key = 32 * 1024;
  const std::vector<float> ones(keys.size() * per_key, 1.0f);
  REQUIRE(Await(c.worker(0).Push(keys, ones)).ok());
  constexpr int kPushes = 300;
  std::atomic<bool> pushes_ok{true};
  std::atomic<bool> pusher_done{false};
  std::thread pusher([&] {
    std::deque<std::future<Status>> window;
    for (int i = 0; i < kPushes; ++i) {
      window.push_back(c.worker(1).Push(keys, ones));
      if (window.size() >= 8) {
        if (window.front().wait_for(kDeadline) != std::future_status::ready || !window.front().get().ok()) {
          pushes_ok = false;
        }
        window.pop_front();
      }
    }
    for (auto& f : window) {
      if (f.wait_for(kDeadline) != std::future_status::ready || !f.get().ok()) pushes_ok = false;
    }
    pusher_done = true;
  });
  // Pull while the pushes run (and at least 100 times), within the deadline.
  int pulls = 0;
  int torn = 0;
  const auto until = std::chrono::steady_clock::now() + kDeadline;
  while ((!pusher_done.load() || pulls < 100) && std::chrono::steady_clock::now() < until) {
    std::vector<std::future<Result<PullResult>>> window;
    for (int i = 0; i < 4; ++i) window.push_back(c.worker(0).Pull(keys));
    for (auto& f : window) {
      Result<PullResult> r = Await(f);
      REQUIRE(r.ok());
      REQUIRE(r->values.size() == ones.size());
      for (size_t k = 0; k < keys.size(); ++k) {
        const float* v = r->values.data() + k * per_key;
        if (std::any_of(v, v + per_key, [&](float x) { return x != v[0]; })) ++torn;
      }
      ++pulls;
    }
  }
  pusher.join();
  CHECK(pusher_done.load());
  CHECK(torn == 0);
  CHECK(pushes_ok);
  Result<PullResult> last = Await(c.worker(0).Pull(keys));
  REQUIRE(last.ok());
  CHECK(last->values == std::vector<float>(ones.size(), 1.0f + kPushes));
  // Issued right after an unanswered Push of the same worker, a large Pull sees it.
  for (int i = 0; i < 50; ++i) {
    auto push = c.worker(0).Push(keys, ones);
    Result<PullResult> r = Await(c.worker(0).Pull(keys));
    REQUIRE(r.ok());
    INFO("round " << i);
    CHECK(r->values.front() == 2.0f + kPushes + i);
    CHECK(r->values.back() == 2.0f + kPushes + i);
    CHECK(Await(push).ok());
  }
}

namespace {

// Waits (bounded) until nobody but the caller holds `values`: the worker let go of them.
bool Released(const std::shared_ptr<const std::vector<float>>& values) {
  const auto until = std::chrono::steady_clock::now() + kDeadline;
  while (values.use_count() != 1 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  return values.use_count() == 1;
}

}  // namespace

TEST_CASE("ZPush sends shared values without a copy and the sums are exact", "[node][net][dataplane]") {
  TestCluster c(Nodes(1, 3));
  c.Start();
  // Five keys of 128 KiB and a small one: on average far over core::kZeroCopyBytes per key,
  // so the values go out as tail slices of the caller's vector.
  const std::vector<uint64_t> keys = {1, 2, 3, 4, 5, 6};
  const uint32_t big = 32 * 1024;
  const std::vector<uint32_t> lens = {big, big, big, big, big, 3};
  auto values = std::make_shared<std::vector<float>>(5 * big + 3);
  for (size_t i = 0; i < values->size(); ++i) (*values)[i] = static_cast<float>(i % 7);
  std::shared_ptr<const std::vector<float>> shared = std::move(values);  // the test's one reference
  constexpr int kRounds = 20;
  std::deque<std::future<Status>> window;
  for (int i = 0; i < kRounds; ++i) {
    window.push_back(c.worker(0).ZPush(keys, shared, lens));
    if (window.size() >= 4) {
      CHECK(Await(window.front()).ok());
      window.pop_front();
    }
  }
  for (auto& f : window) CHECK(Await(f).ok());
  CHECK(Released(shared));
  Result<PullResult> r = Await(c.worker(0).Pull(keys));
  REQUIRE(r.ok());
  CHECK(r->lens == lens);
  std::vector<float> want(shared->size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = kRounds * static_cast<float>(i % 7);
  CHECK(r->values == want);

  // Small values take the copying way; the worker lets go of them all the same.
  auto small = std::make_shared<const std::vector<float>>(std::vector<float>{1, 2, 3, 4});
  CHECK(Await(c.worker(0).ZPush({100, 101}, small)).ok());
  CHECK(Released(small));
  r = Await(c.worker(0).Pull({100, 101}));
  REQUIRE(r.ok());
  CHECK(r->values == std::vector<float>{1, 2, 3, 4});
  // Mismatched lengths and missing values are refused as Push refuses them.
  CHECK(Await(c.worker(0).ZPush({1, 2}, small, {1, 1})).code() == Code::kInvalidArgument);
  CHECK(Await(c.worker(0).ZPush({1}, nullptr)).code() == Code::kInvalidArgument);
}

TEST_CASE("large ZPushes from two workers to the same keys are folded in as they arrive - exact sums - no half push seen",
          "[node][net][dataplane][stream]") {
  TestCluster c(Nodes(2, 2));
  c.Start();
  const std::vector<uint64_t> keys = {11, 12, 13, 14};
  const uint32_t len = 64 * 1024;  // 256 KiB a key: over core::kZeroCopyBytes, written as tail slices
  const std::vector<uint32_t> lens(keys.size(), len);
  REQUIRE(Await(c.worker(0).Push(keys, std::vector<float>(keys.size() * len, 1.0f), lens)).ok());
  auto ones = std::make_shared<const std::vector<float>>(keys.size() * len, 1.0f);
  constexpr int kRounds = 30;
  std::atomic<int> failed{0};
  auto pusher = [&](int w) {
    std::deque<std::future<Status>> window;
    for (int i = 0; i < kRounds; ++i) {
      window.push_back(c.worker(w).ZPush(keys, ones, lens));
      if (window.size() >= 4) {
        if (window.front().wait_for(kDeadline) != std::future_status::ready || !window.front().get().ok()) ++failed;
        window.pop_front();
      }
    }
    for (auto& f : window) {
      if (f.wait_for(kDeadline) != std::future_status::ready || !f.get().ok()) ++failed;
    }
  };
  auto streamed = [&] { return c.server(0).streamed_pushes() + c.server(1).streamed_pushes(); };
  // Rounds of both workers pushing while worker 0 pulls, until some pushes were folded in
  // as they arrived (most are; a push finding its key held by the other worker's stream,
  // or behind a push still with the handler threads, is applied whole, and on a slow build
  // a whole round may go so), at most 10 rounds.
  int rounds = 0, pulls = 0, torn = 0;
  for (; rounds < 10 && (rounds == 0 || streamed() == 0); ++rounds) {
    std::atomic<bool> pushing{true};
    std::thread p0(pusher, 0), p1(pusher, 1);
    std::thread stop([&] {
      p0.join();
      p1.join();
      pushing = false;
    });
    // Meanwhile pulls must see every key whole: each push adds 1 to all of a key's floats.
    while (pushing.load()) {
      Result<PullResult> r = Await(c.worker(0).Pull(keys));
      REQUIRE(r.ok());
      for (size_t k = 0; k < keys.size(); ++k) {
        const float* v = r->values.data() + k * len;
        if (std::any_of(v, v + len, [&](float x) { return x != v[0]; })) ++torn;
      }
      ++pulls;
    }
    stop.join();
  }
  CHECK(failed.load() == 0);
  CHECK(torn == 0);
  CHECK(pulls > 0);
  Result<PullResult> r = Await(c.worker(1).Pull(keys));
  REQUIRE(r.ok());
  CHECK(r->values == std::vector<float>(keys.size() * len, 1.0f + 2 * kRounds * rounds));
  INFO("streamed " << streamed() << " of " << 2 * 2 * kRounds * rounds << " per-server pushes");
  CHECK(streamed() > 0);
}

TEST_CASE("a copied Push of 4 MiB a key or more is folded in as it arrives - smaller ones are received whole",
          "[node][net][dataplane][stream]") {
  TestCluster c(Nodes(1, 1));
  c.Start();
  WorkerNode& w = c.worker(0);
  ServerNode& s = c.server(0);
  const uint32_t large = WorkerNode::kStreamedPushBytes / sizeof(float);
  const uint32_t small = large / 2;
  // A key's first two large pushes go whole (the first creates it, the second makes its
  // spare); the ones after are folded in as they arrive, whatever form copied them.
  const std::vector<float> ones(2 * large, 1.0f);
  const std::vector<float> large_ones(ones.begin(), ones.begin() + large);
  for (int i = 0; i < 4; ++i) REQUIRE(Await(w.Push({1}, large_ones)).ok());
  CHECK(s.streamed_pushes() == 2);
  // Two keys of one server in one Push: its message is streamed as a whole.
  for (int i = 0; i < 3; ++i) REQUIRE(Await(w.Push({2, 3}, ones)).ok());
  CHECK(s.streamed_pushes() == 3);
  // Under kStreamedPushBytes a key: received whole, as before.
  const std::vector<float> small_ones(ones.begin(), ones.begin() + small);
  for (int i = 0; i < 4; ++i) REQUIRE(Await(w.Push({4}, small_ones)).ok());
  CHECK(s.streamed_pushes() == 3);
  Result<PullResult> r = Await(w.Pull({1, 2, 3, 4}));
  REQUIRE(r.ok());
  CHECK(r->lens == std::vector<uint32_t>{large, large, large, small});
  std::vector<float> want(3 * large + small, 4.0f);
  std::fill(want.begin() + large, want.begin() + 3 * large, 3.0f);
  CHECK(r->values == want);
}

TEST_CASE("a journaling server's Stop ends the compaction being written - nothing of it touches data_dir after",
          "[node][net][dataplane][journal]") {
  testing::TempDir dir;
  REQUIRE(dir.ok());
  TestCluster::Config config = Nodes(1, 1);
  config.store.rule = core::UpdateRule::kSum;
  config.data_dir = dir.path();
  config.journal_compact_bytes = 1u << 20;
  TestCluster c(config);
  c.Start();
  WorkerNode& w = c.worker(0);
  ServerNode& s = c.server(0);
  // 8 MiB of parameters: each compaction writes and fsyncs them, while pushes go on.
  const std::vector<uint64_t> keys = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> values(keys.size() * (256u << 10), 1.0f);
  int pushes = 0;
  while (!s.journal_compacting() && pushes < 100) {
    REQUIRE(Await(w.Push(keys, values)).ok());
    ++pushes;
  }
  REQUIRE(s.journal_compacting());
  s.Stop();
  CHECK_FALSE(s.journal_compacting());
  // What Stop leaves is what stays: the directory may go, or another server may open it.
  CHECK_FALSE(std::filesystem::exists(dir.File("s0/params.journal.tmp")));
  // ... and holds every push.
  core::ParamStore store(config.store);
  ServerJournal journal(dir.File("s0"));
  REQUIRE(journal.Open(&store).ok());
  std::vector<float> got(values.size());
  std::vector<uint32_t> lens(keys.size());
  REQUIRE(store.Lens(keys.data(), keys.size(), lens.data()).ok());
  REQUIRE(store.CopyValues(keys.data(), keys.size(), lens.data(), got.data()).ok());
  CHECK(got == std::vector<float>(values.size(), static_cast<float>(pushes)));
}

TEST_CASE("a large push cut off half-way changes nothing - a push waiting for its key then goes on",
          "[node][net][dataplane][stream]") {
  TestCluster::Config config;
  config.store.stream_stall = std::chrono::seconds(20);  // only the broken link lets the key go
  config.store.stream_hold = std::chrono::seconds(20);
  TestCluster c(config);
  c.Start();
  ServerNode& server = c.server(0);
  const uint64_t key = 5;
  const uint32_t len = 256 * 1024;  // 1 MiB
  // A key's first two large pushes go whole: the first creates it, and as the server's
  // loop thread allocates no block for a stream, the handler thread applying the second
  // makes the key's spare for the next ones.
  auto ones = std::make_shared<const std::vector<float>>(len, 1.0f);
  REQUIRE(Await(c.worker(0).ZPush({key}, ones)).ok());
  CHECK(server.store().spare_bytes() == 0);
  REQUIRE(Await(c.worker(0).ZPush({key}, ones)).ok());
  CHECK(server.streamed_pushes() == 0);
  CHECK(server.store().spare_bytes() == len * sizeof(float));
  // A link that says it is w0 and sends a push of 2s, all but its last 100 KiB.
  comm::testing::RawSocket raw;
  ConnectAsW0(raw, server.listen_port());
  const std::string frame = StreamablePush({key}, {len}, std::vector<float>(len, 2.0f), 77);
  REQUIRE(raw.SendAll(std::string_view(frame).substr(0, frame.size() - 100 * 1024)));
  WaitHeldByStreams(server, 1);  // the server is folding it in
  // w0's own push of 3s waits for the key (applied whole on a handler thread) ...
  auto threes = std::make_shared<const std::vector<float>>(len, 3.0f);
  std::future<Status> waiting = c.worker(0).ZPush({key}, threes);
  CHECK(waiting.wait_for(200ms) == std::future_status::timeout);
  // ... without keeping the server's loop from its own work meanwhile: new metadata takes
  // the view lock there (the waiting push must not hold it while it waits).
  pb::SendMetadataMessage md = server.metadata();
  md.set_epoch(md.epoch() + 1);
  comm::Frame update{MakeMeta(pb::SEND_METADATA, pb::SCHEDULER, -1), ToBuffer(md)};
  std::future<void> applied =
      std::async(std::launch::async, [&server, &update] { NodeProbe::FromScheduler(server, 0, std::move(update)); });
  CHECK(applied.wait_for(10s) == std::future_status::ready);
  CHECK(waiting.wait_for(0s) == std::future_status::timeout);
  // ... until the link breaks off: the half push is dropped, the waiting one applied.
  raw.Close();
  CHECK(Await(waiting).ok());
  Result<PullResult> r = Await(c.worker(0).Pull({key}));
  REQUIRE(r.ok());
  CHECK(r->values == std::vector<float>(len, 5.0f));
  CHECK(server.streamed_pushes() == 0);
  // The key is free again: the next push is folded in as it arrives.
  CHECK(Await(c.worker(0).ZPush({key}, threes)).ok());
  CHECK(server.streamed_pushes() == 1);
  r = Await(c.worker(0).Pull({key}));
  REQUIRE(r.ok());
  CHECK(r->values == std::vector<float>(len, 8.0f));
}

TEST_CASE("a streamed push that stalls gives its keys to a waiting push - none of it is applied - kAborted",
          "[node][net][dataplane][stream]") {
  TestCluster::Config config;
  config.servers = 1;
  config.store.stream_stall = std::chrono::milliseconds(300);
  TestCluster c(config);
  c.Start();
  ServerNode& server = c.server(0);
  const std::vector<uint64_t> keys = {21, 22};
  const std::vector<uint32_t> lens = {128 * 1024, 128 * 1024};  // 512 KiB each
  auto ones = std::make_shared<const std::vector<float>>(2 * 128 * 1024, 1.0f);
  for (int i = 0; i < 2; ++i) REQUIRE(Await(c.worker(0).ZPush(keys, ones, lens)).ok());  // created, spares made
  // A member link pushes 2s to both keys and stops 100 KiB before the end.
  comm::testing::RawSocket raw;
  ConnectAsW0(raw, server.listen_port());
  const std::string frame = StreamablePush(keys, lens, std::vector<float>(2 * 128 * 1024, 2.0f), 78);
  const size_t cut = frame.size() - 100 * 1024;
  REQUIRE(raw.SendAll(std::string_view(frame).substr(0, cut)));
  WaitHeldByStreams(server, 2);
  // w0 pushes 3s to the first key: it waits out the stall, then takes the key.
  const std::vector<uint32_t> one_len = {lens[0]};
  REQUIRE(Await(c.worker(0).Push({keys[0]}, std::vector<float>(lens[0], 3.0f), one_len)).ok());
  // The link sends the rest: its push is refused whole, the key it still held included.
  REQUIRE(raw.SendAll(std::string_view(frame).substr(cut)));
  pb::MessageMeta answer;
  std::string body;
  REQUIRE(raw.RecvFrame(&answer, &body));
  CHECK(answer.request_id() == 78);
  CHECK(answer.status_code() == static_cast<int32_t>(Code::kAborted));
  CHECK(server.store().keys_held_by_streams() == 0);
  Result<PullResult> r = Await(c.worker(0).Pull(keys));
  REQUIRE(r.ok());
  const std::vector<float>& v = r->values;
  CHECK(std::all_of(v.begin(), v.begin() + lens[0], [](float x) { return x == 5.0f; }));  // 2 ones + 3
  CHECK(std::all_of(v.begin() + lens[0], v.end(), [](float x) { return x == 2.0f; }));   // 2 ones only
}

TEST_CASE("ZPull points into the answers and reads the same values as Pull", "[node][net][dataplane]") {
  TestCluster c(Nodes(1, 3));
  c.Start();
  // Large keys (answered from the stores' memory) and small ones, over three servers.
  const std::vector<uint64_t> keys = {5, 1, 9, 2, 7, 3};
  const std::vector<uint32_t> lens = {40000, 2, 70000, 1, 0, 30000};
  std::vector<float> values;
  for (uint32_t l : lens) {
    for (uint32_t i = 0; i < l; ++i) values.push_back(static_cast<float>(values.size() % 1000) * 0.25f);
  }
  auto push = c.worker(0).Push(keys, values, lens);  // not waited for: the pull comes after it
  // Ask in another order than pushed.
  const std::vector<uint64_t> ask = {3, 9, 1, 7, 5, 2};
  Result<PullView> v = Await(c.worker(0).ZPull(ask));
  REQUIRE(v.ok());
  CHECK(Await(push).ok());
  Result<PullResult> p = Await(c.worker(0).Pull(ask));
  REQUIRE(p.ok());
  REQUIRE(v->lens == p->lens);
  REQUIRE(v->values.size() == ask.size());
  CHECK(v->num_floats() == p->values.size());
  std::vector<float> flat;
  for (size_t i = 0; i < ask.size(); ++i) flat.insert(flat.end(), v->values[i], v->values[i] + v->lens[i]);
  CHECK(flat == p->values);
  // Every value pointer lies inside one of the answers it keeps alive.
  for (size_t i = 0; i < ask.size(); ++i) {
    if (v->lens[i] == 0) continue;
    const char* at = reinterpret_cast<const char*>(v->values[i]);
    CHECK(std::any_of(v->owners.begin(), v->owners.end(), [&](const BufferPtr& b) {
      return at >= b->data() && at + v->lens[i] * sizeof(float) <= b->data() + b->size();
    }));
  }
  CHECK(v->owners.size() <= 3);
  CHECK(Await(c.worker(0).ZPull({4242})).status().code() == Code::kNotFound);
  Result<PullView> none = Await(c.worker(0).ZPull({}));
  REQUIRE(none.ok());
  CHECK(none->num_floats() == 0);
}

TEST_CASE("a ZPush issued before the cluster is ready is split once the servers are known",
          "[node][net][dataplane]") {
  // The worker starts before any server, so its push is held without metadata and split
  // (from its head and the shared values) when the metadata arrives.
  SchedulerOptions so;
  so.worker_num = 1;
  so.server_num = 2;
  so.heartbeat_interval = 50ms;
  SchedulerNode sched(so);
  REQUIRE(sched.Start().ok());
  auto opts = [&](const std::string& id) {
    NodeOptions o;
    o.scheduler_port = sched.port();
    o.node_id = id;
    o.heartbeat_interval = 50ms;
    return o;
  };
  WorkerNode worker(opts("w0"));
  REQUIRE(worker.Start().ok());
  const std::vector<uint64_t> keys = {7, 8, 9, 10};
  auto values = std::make_shared<const std::vector<float>>(4 * 32 * 1024, 2.5f);
  auto push = worker.ZPush(keys, values);
  CHECK(worker.server_count() == 0);
  ServerNode s0(opts("s0")), s1(opts("s1"));
  REQUIRE(s0.Start().ok());
  REQUIRE(s1.Start().ok());
  CHECK(Await(push).ok());
  CHECK(Released(values));
  Result<PullResult> r = Await(worker.Pull(keys));
  REQUIRE(r.ok());
  CHECK(r->values == *values);
  // Both servers got their share.
  CHECK(s0.store().num_keys() + s1.store().num_keys() == keys.size());
  CHECK(s0.store().num_keys() > 0);
  CHECK(s1.store().num_keys() > 0);
  worker.Stop();
  s0.Stop();
  s1.Stop();
  sched.Stop();
}

namespace {

// `rounds` times: a large Push writing i to four big keys and to the small key 5, then at
// once (before the push was answered) `pull_small` of key 5 alone, which must see i.
void PushLargeThenPullSmall(WorkerNode& w, int rounds,
                            const std::function<Result<PullResult>(WorkerNode&)>& pull_small) {
  const std::vector<uint64_t> keys = {1, 2, 3, 4, 5};
  const uint32_t big = 64 * 1024;  // 256 KiB per key: well over the server's small bound
  const std::vector<uint32_t> lens = {big, big, big, big, 1};
  for (int i = 1; i <= rounds; ++i) {
    auto push = w.Push(keys, std::vector<float>(4 * big + 1, static_cast<float>(i)), lens);
    Result<PullResult> r = pull_small(w);
    REQUIRE(r.ok());
    INFO("round " << i);
    CHECK(r->values == std::vector<float>{static_cast<float>(i)});
    CHECK(Await(push).ok());
  }
}

// Payload bytes the worker and the server copied while call() ran (payload_bytes_copied).
struct Copies {
  uint64_t worker, server;
};
template <typename Call>
Copies CopiesDuring(WorkerNode& w, ServerNode& s, Call&& call) {
  const uint64_t w0 = w.payload_bytes_copied(), s0 = s.payload_bytes_copied();
  call();
  return Copies{w.payload_bytes_copied() - w0, s.payload_bytes_copied() - s0};
}

}  // namespace

TEST_CASE("each direction copies a large payload at most once in user space - counted where it happens",
          "[node][net][dataplane][copies]") {
  TestCluster c(Nodes(1, 1));
  c.Start();
  WorkerNode& w = c.worker(0);
  ServerNode& s = c.server(0);
  const uint64_t key = 11;
  const uint32_t len = 256 * 1024;  // 1 MiB
  const uint64_t bytes = len * sizeof(float);
  // What a read buffer may hold of a payload before the rest is read straight into its
  // place (or, streamed, folded in from the buffer where it was read): the bytes of it
  // that arrived with the frame's header. Right after a large frame that read is at most
  // 4 KiB (comm::FrameDecoder), and the worker's buffer never grew past 4 KiB here.
  const uint64_t read_buffer = 8 * 1024;
  auto ones = std::make_shared<const std::vector<float>>(len, 1.0f);
  for (int i = 0; i < 3; ++i) REQUIRE(Await(w.ZPush({key}, ones)).ok());  // created, spare made, streamed
  auto measure = [&](auto&& call) { return CopiesDuring(w, s, call); };
  // Push copies the caller's values into the message once; the server applies them from
  // where they were read.
  Copies push = measure([&] { REQUIRE(Await(w.Push({key}, *ones)).ok()); });
  CHECK(push.worker >= bytes);
  CHECK(push.worker < bytes + 4096);  // + the answer's bytes
  CHECK(push.server < read_buffer);
  // ZPush writes them from the caller's vector; a streamed one is folded in from the read buffer.
  const uint64_t streamed = s.streamed_pushes();
  Copies zpush = measure([&] { REQUIRE(Await(w.ZPush({key}, ones)).ok()); });
  CHECK(s.streamed_pushes() == streamed + 1);
  CHECK(zpush.worker < 4096);
  CHECK(zpush.server < read_buffer);
  // Push of values given away (std::move) is ZPush of them: no copy either.
  Copies moved = measure([&] {
    std::vector<float> given(len, 1.0f);
    REQUIRE(Await(w.Push({key}, std::move(given))).ok());
  });
  CHECK(moved.worker < 4096);
  CHECK(moved.server < read_buffer);
  // Pull: written from the store. The first Pull of the key copies the answer into the
  // result once; it tells the key's size, so the next one allocates its result before
  // sending and the answer is read into it.
  Copies pull = measure([&] { REQUIRE(Await(w.Pull({key})).ok()); });
  CHECK(pull.server < 4096);
  CHECK(pull.worker >= bytes);
  CHECK(pull.worker < bytes + read_buffer);
  const uint64_t in_place = w.in_place_pulls();
  Copies pull_again = measure([&] { REQUIRE(Await(w.Pull({key})).ok()); });
  CHECK(w.in_place_pulls() == in_place + 1);
  CHECK(pull_again.worker < read_buffer);
  CHECK(pull_again.server < 4096);
  // PullInto and ZPull: no copy of the whole on either side.
  std::vector<float> dest(len);
  Copies into = measure([&] { REQUIRE(Await(w.PullInto({key}, dest.data(), dest.size())).ok()); });
  CHECK(into.worker < read_buffer);
  CHECK(into.server < 4096);
  Copies view = measure([&] { REQUIRE(Await(w.ZPull({key})).ok()); });
  CHECK(view.worker < read_buffer);
  CHECK(view.server < 4096);
  CHECK(std::all_of(dest.begin(), dest.end(), [](float x) { return x == 6.0f; }));  // six pushes of ones
}

TEST_CASE("a ZPush of many small rows to one server writes them from the caller's memory - each slice one range - exact sums",
          "[node][net][dataplane][copies]") {
  for (int servers : {1, 2}) {
    INFO(servers << " servers");
    TestCluster::Config config = Nodes(1, servers);
    config.store.rule = core::UpdateRule::kSum;
    config.push_slice_keys = 100000;
    TestCluster c(config);
    c.Start();
    WorkerNode& w = c.worker(0);
    // 300,000 keys of one float (three slices of 400 KB of values, each over
    // core::kZeroCopyBytes in all though 4 bytes a key, and of 800 KB of keys, over what a
    // server's read buffer grows by at once), then keys of 1 to 3 floats by lens.
    std::vector<uint64_t> keys(300000);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 104729 + 3;
    auto rows = std::make_shared<std::vector<float>>(keys.size());
    for (size_t i = 0; i < rows->size(); ++i) (*rows)[i] = static_cast<float>(i % 1013);
    std::shared_ptr<const std::vector<float>> shared_rows = std::move(rows);
    std::vector<uint64_t> lens_keys(120000);
    std::vector<uint32_t> lens(lens_keys.size());
    for (size_t i = 0; i < lens_keys.size(); ++i) {
      lens_keys[i] = (uint64_t{1} << 40) + i * 7919;  // apart from the rows' keys
      lens[i] = static_cast<uint32_t>(1 + i % 3);
    }
    auto lv = std::make_shared<std::vector<float>>(std::accumulate(lens.begin(), lens.end(), size_t{0}));
    for (size_t i = 0; i < lv->size(); ++i) (*lv)[i] = static_cast<float>(i % 101);
    std::shared_ptr<const std::vector<float>> shared_lens = std::move(lv);

    const uint64_t row_bytes = shared_rows->size() * sizeof(float);
    const uint64_t lens_bytes = shared_lens->size() * sizeof(float);
    Copies first = CopiesDuring(w, c.server(0), [&] { REQUIRE(Await(w.ZPush(keys, shared_rows)).ok()); });
    Copies second = CopiesDuring(w, c.server(0), [&] { REQUIRE(Await(w.ZPush(keys, shared_rows)).ok()); });
    Copies with_lens =
        CopiesDuring(w, c.server(0), [&] { REQUIRE(Await(w.ZPush(lens_keys, shared_lens, lens)).ok()); });
    if (servers == 1) {
      // Written from the caller's vectors: no value copied into a request.
      CHECK(first.worker < 4096);
      CHECK(second.worker < 4096);
      CHECK(with_lens.worker < 4096);
    } else {
      // Spread over two servers each key's 4 to 12 bytes lie apart from the next one's of
      // the same server: gathered, a copy (under core::kZeroCopyBytes a key).
      CHECK(first.worker >= row_bytes);
      CHECK(with_lens.worker >= lens_bytes);
    }
    // Either way server 0 applies the values from where they were read.
    CHECK(first.server + second.server + with_lens.server < 64 * 1024);
    CHECK(Released(shared_rows));
    CHECK(Released(shared_lens));

    Result<PullResult> r = Await(w.Pull(keys));
    REQUIRE(r.ok());
    std::vector<float> twice(*shared_rows);
    for (float& v : twice) v *= 2;
    CHECK(r->values == twice);
    Result<PullResult> l = Await(w.Pull(lens_keys));
    REQUIRE(l.ok());
    CHECK(l->lens == lens);
    CHECK(l->values == *shared_lens);
  }
}

TEST_CASE("each direction copies a small payload at most once in user space - counted where it happens",
          "[node][net][dataplane][copies]") {
  // 4 KiB values arrive in the connection's input buffer with other bytes; the sender pads
  // each frame's meta so the payload lies 8-byte aligned there, and the receiver hands it
  // out in place (comm::FrameDecoder). What remains is one copy per direction.
  TestCluster c(Nodes(1, 1));
  c.Start();
  WorkerNode& w = c.worker(0);
  ServerNode& s = c.server(0);
  const uint64_t key = 12;
  const uint32_t len = 1024;  // 4 KiB
  const uint64_t bytes = len * sizeof(float);
  const uint64_t requests = 512;  // a request's keys or an answer's head, copied into the write batch
  auto ones = std::make_shared<const std::vector<float>>(len, 1.0f);
  REQUIRE(Await(w.Push({key}, *ones)).ok());
  auto measure = [&](auto&& call) { return CopiesDuring(w, s, call); };
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    Copies push = measure([&] { REQUIRE(Await(w.Push({key}, *ones)).ok()); });
    CHECK(push.worker + push.server >= bytes);
    CHECK(push.worker + push.server < bytes + requests);
    Copies zpush = measure([&] { REQUIRE(Await(w.ZPush({key}, ones)).ok()); });
    CHECK(zpush.worker + zpush.server < bytes + requests);
    Copies pull = measure([&] {
      Result<PullResult> r = Await(w.Pull({key}));
      REQUIRE(r.ok());
      CHECK(r->values == std::vector<float>(len, static_cast<float>(3 * round + 3)));
    });
    CHECK(pull.worker + pull.server >= bytes);
    CHECK(pull.worker + pull.server < bytes + requests);
    std::vector<float> dest(len);
    Copies into = measure([&] { REQUIRE(Await(w.PullInto({key}, dest.data(), dest.size())).ok()); });
    CHECK(into.worker + into.server < bytes + requests);
    CHECK(dest == std::vector<float>(len, static_cast<float>(3 * round + 3)));
    Copies view = measure([&] {
      Result<PullView> r = Await(w.ZPull({key}));
      REQUIRE(r.ok());
      CHECK(r->num_floats() == len);
    });
    CHECK(view.worker + view.server < bytes + requests);
    Copies moved = measure([&] {
      std::vector<float> given(len, 1.0f);
      REQUIRE(Await(w.Push({key}, std::move(given))).ok());
    });
    CHECK(moved.worker + moved.server < bytes + requests);
    // PullSync over its direct link, which pads its requests as a connection does: the
    // server takes their keys in place and writes the answer from the store, no copy.
    const uint64_t direct_before = w.direct_pulls();
    Copies direct = measure([&] {
      Result<PullResult> r = w.PullSync({key});
      REQUIRE(r.ok());
      CHECK(r->values == std::vector<float>(len, static_cast<float>(3 * round + 4)));
    });
    CHECK(w.direct_pulls() == direct_before + 1);
    CHECK(direct.server == 0);
    CHECK(direct.worker + direct.server < bytes + requests);
  }
}

TEST_CASE("a small Pull issued after a large Push from the same worker sees that Push",
          "[node][net][dataplane]") {
  // The large push goes to the server's handler threads; a pull asking for little could be
  // served at once on the server's loop, but must still come after the push.
  TestCluster c(AssignNodes(1, 1));
  c.Start();
  PushLargeThenPullSmall(c.worker(0), 100, [](WorkerNode& w) { return Await(w.Pull({5})); });
}

TEST_CASE("PullInto writes the values into the caller's memory, refuses a wrong size and leaves it alone",
          "[node][net][dataplane]") {
  TestCluster c(AssignNodes(1, 3));
  c.Start();
  // Keys over all three servers, with different lengths.
  const std::vector<uint64_t> keys = {1, 1ull << 40, 3, 1ull << 62, 5};
  const std::vector<uint32_t> lens = {2, 3, 1, 4, 2};
  std::vector<float> values;
  for (size_t i = 0; i < 12; ++i) values.push_back(static_cast<float>(i) + 0.5f);
  REQUIRE(Await(c.worker(0).Push(keys, values, lens)).ok());

  std::vector<float> dest(12, -1.0f);
  std::vector<uint32_t> got_lens;
  REQUIRE(Await(c.worker(0).PullInto(keys, dest.data(), dest.size(), &got_lens)).ok());
  CHECK(dest == values);
  CHECK(got_lens == lens);
  // The same through Pull, for comparison.
  Result<PullResult> r = Await(c.worker(0).Pull(keys));
  REQUIRE(r.ok());
  CHECK(r->values == dest);

  std::vector<float> small(11, -1.0f);
  Status wrong = Await(c.worker(0).PullInto(keys, small.data(), small.size()));
  CHECK(wrong.code() == Code::kInvalidArgument);
  CHECK_THAT(wrong.message(), Catch::Contains("12 floats"));
  CHECK(small == std::vector<float>(11, -1.0f));
  CHECK(Await(c.worker(0).PullInto({}, nullptr, 0)).ok());
  CHECK(Await(c.worker(0).PullInto({999}, dest.data(), dest.size())).code() == Code::kNotFound);
}

namespace {

// Keys 0.. that the key-range partition gives to server rank `owner` of `servers`.
std::vector<uint64_t> KeysOf(int owner, int servers, size_t count) {
  std::vector<uint64_t> out;
  for (uint64_t k = 0; out.size() < count; ++k) {
    if (core::ServerForKey(k, servers) == owner) out.push_back(k);
  }
  return out;
}

}  // namespace

TEST_CASE("PullInto of large keys on one server reads the values from the socket into the caller's memory",
          "[node][net][dataplane]") {
  TestCluster c(AssignNodes(2, 2));
  c.Start();
  WorkerNode& w = c.worker(0);
  // Three keys of server 0, 64 KiB or more each: answered from the store as head + values.
  const std::vector<uint64_t> keys = KeysOf(0, 2, 3);
  const std::vector<uint32_t> lens = {20000, 30000, 16384};
  std::vector<float> values(20000 + 30000 + 16384);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.25f;
  REQUIRE(Await(w.Push(keys, values, lens)).ok());
  std::vector<float> dest(values.size(), -1.0f);
  std::vector<uint32_t> got_lens;
  REQUIRE(Await(w.PullInto(keys, dest.data(), dest.size(), &got_lens)).ok());
  CHECK(dest == values);
  CHECK(got_lens == lens);
  CHECK(w.in_place_pulls() == 1);
  // A destination of the wrong size is refused and left alone (the values were not read into it).
  std::vector<float> small(values.size() - 1, -1.0f);
  CHECK(Await(w.PullInto(keys, small.data(), small.size())).code() == Code::kInvalidArgument);
  CHECK(small == std::vector<float>(values.size() - 1, -1.0f));
  CHECK(w.in_place_pulls() == 1);
  // Keys on both servers, or small keys: answered as before (copied once), same values.
  std::vector<uint64_t> both = {keys[0], KeysOf(1, 2, 1)[0]};
  std::vector<float> two(2 * 20000);
  for (size_t i = 0; i < two.size(); ++i) two[i] = static_cast<float>(i % 977);
  REQUIRE(Await(w.Push(both, two)).ok());
  std::vector<float> dest2(two.size(), -1.0f);
  REQUIRE(Await(w.PullInto(both, dest2.data(), dest2.size())).ok());
  CHECK(dest2 == two);
  const std::vector<uint64_t> first7 = KeysOf(0, 2, 7);
  const std::vector<uint64_t> small_keys(first7.begin() + 3, first7.end());  // fresh keys
  const std::vector<float> little = {1, 2, 3, 4, 5, 6, 7, 8};
  REQUIRE(Await(w.Push(small_keys, little)).ok());
  std::vector<float> dest3(8, -1.0f);
  REQUIRE(Await(w.PullInto(small_keys, dest3.data(), dest3.size())).ok());
  CHECK(dest3 == little);
  CHECK(w.in_place_pulls() == 1);

  // Read in place while another worker keeps overwriting the keys: every result is one
  // whole push (each push writes a single value everywhere).
  const std::vector<uint64_t> first9 = KeysOf(0, 2, 9);
  const std::vector<uint64_t> big(first9.begin() + 7, first9.end());  // fresh keys
  const size_t per_key = 32 * 1024;
  REQUIRE(Await(w.Push(big, std::vector<float>(2 * per_key, 0.0f))).ok());
  std::atomic<bool> pusher_done{false};
  std::atomic<bool> pushes_ok{true};
  std::thread pusher([&] {
    for (int i = 1; i <= 200; ++i) {
      std::vector<float> v(2 * per_key, static_cast<float>(i));
      if (!Await(c.worker(1).Push(big, v)).ok()) pushes_ok = false;
    }
    pusher_done = true;
  });
  std::vector<std::vector<float>> dests(4, std::vector<float>(2 * per_key));
  int pulls = 0;
  int torn = 0;
  int failed = 0;
  const auto until = std::chrono::steady_clock::now() + kDeadline;
  while ((!pusher_done.load() || pulls < 100) && std::chrono::steady_clock::now() < until) {
    std::vector<std::future<Status>> window;
    for (auto& d : dests) window.push_back(w.PullInto(big, d.data(), d.size()));
    for (size_t i = 0; i < window.size(); ++i) {
      if (!Await(window[i]).ok()) ++failed;
      for (size_t k = 0; k < big.size(); ++k) {
        const float* v = dests[i].data() + k * per_key;
        if (std::any_of(v, v + per_key, [&](float x) { return x != v[0]; })) ++torn;
      }
      ++pulls;
    }
  }
  pusher.join();
  CHECK(pusher_done.load());
  CHECK(pushes_ok);
  CHECK(failed == 0);
  CHECK(torn == 0);
  CHECK(w.in_place_pulls() == 1 + static_cast<uint64_t>(pulls));
}

TEST_CASE("PullInto given the layout reads each server's answer into its place - a wrong layout costs a second pull",
          "[node][net][dataplane]") {
  TestCluster c(AssignNodes(1, 3));
  c.Start();
  WorkerNode& w = c.worker(0);
  // Two large keys per server, in position order (core::SortKeysByPosition): each
  // server's keys are consecutive.
  std::vector<uint64_t> keys;
  for (int s = 0; s < 3; ++s) {
    for (uint64_t k : KeysOf(s, 3, 2)) keys.push_back(k);
  }
  std::vector<uint64_t> by_position = keys;
  core::SortKeysByPosition(&by_position);
  for (size_t i = 1; i < by_position.size(); ++i) {
    REQUIRE(core::ServerForKey(by_position[i - 1], 3) <= core::ServerForKey(by_position[i], 3));
  }
  keys = by_position;
  const std::vector<uint32_t> lens = {20000, 17000, 16500, 30000, 16384, 25000};
  const size_t total = std::accumulate(lens.begin(), lens.end(), size_t{0});
  std::vector<float> values(total);
  for (size_t i = 0; i < total; ++i) values[i] = static_cast<float>(i % 10007) + 0.5f;
  REQUIRE(Await(w.Push(keys, values, lens)).ok());
  std::vector<float> dest(total);
  auto pull_into = [&](const std::vector<uint64_t>& ks, std::vector<uint32_t>* layout) {
    std::fill(dest.begin(), dest.end(), -1.0f);
    return Await(w.PullInto(ks, dest.data(), dest.size(), layout));
  };

  // No layout: three answers, copied once.
  std::vector<uint32_t> got;
  REQUIRE(pull_into(keys, &got).ok());
  CHECK(dest == values);
  CHECK(got == lens);
  CHECK(w.in_place_pulls() == 0);
  // The layout from that call: every answer read into its place.
  REQUIRE(pull_into(keys, &got).ok());
  CHECK(dest == values);
  CHECK(got == lens);
  CHECK(w.in_place_pulls() == 3);
  // A layout off by one float for server 0's first key and server 2's last: server 1's
  // answer still fits its expected span and is read there, one float off; found, and the
  // keys are pulled again and copied.
  std::vector<uint32_t> wrong = lens;
  wrong[0] += 1;
  wrong[5] -= 1;
  REQUIRE(pull_into(keys, &wrong).ok());
  CHECK(dest == values);
  CHECK(wrong == lens);
  CHECK(w.in_place_pulls() == 4);
  // A layout that does not add up to dest is not used; the sizes the answers told before
  // are, so every answer is read into its place.
  std::vector<uint32_t> short_layout = lens;
  short_layout[2] -= 1;
  REQUIRE(pull_into(keys, &short_layout).ok());
  CHECK(dest == values);
  CHECK(short_layout == lens);
  CHECK(w.in_place_pulls() == 7);
  // No layout at all: the same.
  REQUIRE(pull_into(keys, nullptr).ok());
  CHECK(dest == values);
  CHECK(w.in_place_pulls() == 10);
  // Keys not grouped by server: servers 0 and 1 each have their keys apart, so their
  // answers are copied; server 2's is read in place.
  std::vector<uint64_t> mixed = {keys[0], keys[2], keys[1], keys[3], keys[4], keys[5]};
  std::vector<uint32_t> mixed_lens = {lens[0], lens[2], lens[1], lens[3], lens[4], lens[5]};
  std::vector<float> mixed_values;
  size_t at = 0;
  std::vector<size_t> offsets;
  for (uint32_t l : lens) {
    offsets.push_back(at);
    at += l;
  }
  for (size_t i : {0, 2, 1, 3, 4, 5}) {
    mixed_values.insert(mixed_values.end(), values.begin() + offsets[i], values.begin() + offsets[i] + lens[i]);
  }
  REQUIRE(pull_into(mixed, &mixed_lens).ok());
  CHECK(dest == mixed_values);
  CHECK(w.in_place_pulls() == 11);

  // Server 0's first key grows by one float and server 2's last key shrinks by one behind
  // the worker's back (the total stays). With no layout given, the learned sizes still add
  // up to dest: server 1's answer fits its expected span and is read there, one float off;
  // found, the keys are pulled again and copied. The answers taught the new sizes, so the
  // next call reads every answer into its place.
  const std::vector<float> longer(lens[0] + 1, 3.0f);
  const std::vector<float> shorter(lens[5] - 1, 4.0f);
  c.server_of_rank(core::ServerForKey(keys[0], 3)).store().Insert(keys[0], longer);
  c.server_of_rank(core::ServerForKey(keys[5], 3)).store().Insert(keys[5], shorter);
  std::vector<float> changed = longer;
  changed.insert(changed.end(), values.begin() + lens[0], values.end() - lens[5]);
  changed.insert(changed.end(), shorter.begin(), shorter.end());
  std::vector<uint32_t> changed_lens = lens;
  changed_lens[0] += 1;
  changed_lens[5] -= 1;
  std::vector<uint32_t> got2;
  REQUIRE(pull_into(keys, &got2).ok());
  CHECK(dest == changed);
  CHECK(got2 == changed_lens);
  CHECK(w.in_place_pulls() == 12);  // server 1's answer, before the second pull
  REQUIRE(pull_into(keys, nullptr).ok());
  CHECK(dest == changed);
  CHECK(w.in_place_pulls() == 15);
}

TEST_CASE("Pull of keys pulled before reads the answers into its result - sizes that changed are still right",
          "[node][net][dataplane]") {
  TestCluster c(AssignNodes(1, 2));
  c.Start();
  WorkerNode& w = c.worker(0);
  const std::vector<uint64_t> on0 = KeysOf(0, 2, 2);
  const std::vector<uint64_t> keys = {on0[0], on0[1], KeysOf(1, 2, 1)[0]};  // each server's keys together
  const std::vector<uint32_t> lens = {20000, 16384, 30000};
  std::vector<float> values(20000 + 16384 + 30000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 4099) - 7.25f;
  REQUIRE(Await(w.Push(keys, values, lens)).ok());
  auto pull = [&](const std::vector<uint64_t>& ks) {
    Result<PullResult> r = Await(w.Pull(ks));
    REQUIRE(r.ok());
    return *r;
  };

  // The first Pull learns the sizes (the answers are copied), the second reads both
  // servers' answers into its result.
  PullResult first = pull(keys);
  CHECK(first.values == values);
  CHECK(first.lens == lens);
  CHECK(w.in_place_pulls() == 0);
  PullResult second = pull(keys);
  CHECK(second.values == values);
  CHECK(second.lens == lens);
  CHECK(w.in_place_pulls() == 2);

  // Server 0's first key changes size behind the worker's back: server 1's answer still
  // fits the span it was expected in and is read there, server 0's is not; the result is
  // then copied anew from where the values are, and the new size is learned.
  std::vector<float> longer(25000);
  for (size_t i = 0; i < longer.size(); ++i) longer[i] = static_cast<float>(i) * 0.5f;
  c.server_of_rank(0).store().Insert(keys[0], longer);
  std::vector<float> expect = longer;
  expect.insert(expect.end(), values.begin() + 20000, values.end());
  PullResult changed = pull(keys);
  CHECK(changed.values == expect);
  CHECK(changed.lens == std::vector<uint32_t>{25000, 16384, 30000});
  CHECK(w.in_place_pulls() == 3);
  PullResult relearned = pull(keys);
  CHECK(relearned.values == expect);
  CHECK(w.in_place_pulls() == 5);

  // Keys of one server apart from each other: that server's answer is copied into place.
  const std::vector<uint64_t> apart = {keys[0], keys[2], keys[1]};
  std::vector<float> apart_values(longer);
  apart_values.insert(apart_values.end(), values.begin() + 36384, values.end());
  apart_values.insert(apart_values.end(), values.begin() + 20000, values.begin() + 36384);
  PullResult mixed = pull(apart);
  CHECK(mixed.values == apart_values);
  CHECK(mixed.lens == std::vector<uint32_t>{25000, 30000, 16384});
  CHECK(w.in_place_pulls() == 6);  // server 1's answer only

  // A key that shrinks to a few floats: the answer no longer comes from the store's
  // memory, the result is copied, and the key's old size is forgotten.
  c.server_of_rank(1).store().Insert(keys[2], {1.0f, 2.0f, 3.0f});
  for (int i = 0; i < 2; ++i) {
    PullResult shrunk = pull(keys);
    CHECK(shrunk.lens == std::vector<uint32_t>{25000, 16384, 3});
    CHECK(std::equal(longer.begin(), longer.end(), shrunk.values.begin()));
    CHECK(shrunk.values.size() == 25000 + 16384 + 3);
    CHECK(shrunk.values.back() == 3.0f);
  }

  // A key that is gone is kNotFound, as for any Pull.
  REQUIRE(c.server_of_rank(0).store().Erase(&keys[0], 1) == 1);
  Result<PullResult> gone = Await(w.Pull(keys));
  CHECK(gone.status().code() == Code::kNotFound);
}

TEST_CASE("Pull of many rows of one length, with a row of another length or a missing key among them",
          "[node][net][dataplane]") {
  TestCluster c(TestCluster::Config{});
  c.Start();
  WorkerNode& w = c.worker(0);
  // 300 rows of 4 floats (dense and spread keys) and one row of 7.
  std::vector<uint64_t> rows;
  for (uint64_t k = 0; k < 300; ++k) rows.push_back(k < 150 ? 1000 + k : k * 0x9E3779B97F4A7C15ULL);
  std::vector<float> row_values(rows.size() * 4);
  for (size_t i = 0; i < row_values.size(); ++i) row_values[i] = static_cast<float>(i) * 0.25f;
  REQUIRE(Await(w.Push(rows, row_values, std::vector<uint32_t>(rows.size(), 4))).ok());
  const uint64_t odd = 77;
  const std::vector<float> odd_values = {9, 8, 7, 6, 5, 4, 3};
  REQUIRE(Await(w.Push({odd}, odd_values, {7})).ok());
  auto row = [&](size_t i) { return std::vector<float>(row_values.begin() + i * 4, row_values.begin() + i * 4 + 4); };

  Result<PullResult> all = Await(w.Pull(rows));
  REQUIRE(all.ok());
  CHECK(all->values == row_values);
  CHECK(all->lens == std::vector<uint32_t>(rows.size(), 4));

  // The odd row after the first, and first: each key's own length and values.
  for (size_t at : {size_t{1}, size_t{0}, size_t{150}}) {
    INFO("odd row at " << at);
    std::vector<uint64_t> keys(rows.begin(), rows.begin() + 200);
    keys.insert(keys.begin() + static_cast<std::ptrdiff_t>(at), odd);
    Result<PullResult> r = Await(w.Pull(keys));
    REQUIRE(r.ok());
    std::vector<float> expect;
    std::vector<uint32_t> expect_lens;
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::vector<float> v = i == at ? odd_values : row(i < at ? i : i - 1);
      expect.insert(expect.end(), v.begin(), v.end());
      expect_lens.push_back(static_cast<uint32_t>(v.size()));
    }
    CHECK(r->values == expect);
    CHECK(r->lens == expect_lens);
  }

  // Rows of no floats: a first one among rows of 4, two alone, and one with a missing key.
  REQUIRE(Await(w.Push({78, 79, 80}, std::vector<float>{1.0f, 2.0f}, {0, 0, 2})).ok());
  Result<PullResult> empty_first = Await(w.Pull({78, rows[0], 79, rows[1]}));
  REQUIRE(empty_first.ok());
  CHECK(empty_first->lens == std::vector<uint32_t>{0, 4, 0, 4});
  std::vector<float> two_rows = row(0);
  for (float f : row(1)) two_rows.push_back(f);
  CHECK(empty_first->values == two_rows);
  Result<PullResult> empties = Await(w.Pull({78, 79}));
  REQUIRE(empties.ok());
  CHECK(empties->lens == std::vector<uint32_t>{0, 0});
  CHECK(empties->values.empty());
  CHECK(Await(w.Pull({78, 5})).status().code() == Code::kNotFound);
  // A push whose every row holds no floats carries no values at all.
  REQUIRE(Await(w.Push({81, 82}, std::vector<float>{}, {0, 0})).ok());
  Result<PullResult> no_floats = Await(w.Pull({82, 81}));
  REQUIRE(no_floats.ok());
  CHECK(no_floats->lens == std::vector<uint32_t>{0, 0});
  CHECK(no_floats->values.empty());

  // A missing key among the rows is named, wherever it stands.
  for (size_t at : {size_t{0}, size_t{120}}) {
    std::vector<uint64_t> keys(rows.begin(), rows.end());
    keys.insert(keys.begin() + static_cast<std::ptrdiff_t>(at), 5);
    Result<PullResult> r = Await(w.Pull(keys));
    CHECK(r.status().code() == Code::kNotFound);
    CHECK_THAT(r.status().message(), Catch::Contains("unknown key 5"));
  }
}

namespace {

// Pushes `keys` from w, key k holding len_of(k) floats k * 2048 + j (exact in a float for
// the few thousand keys and lengths under 2048 the tests use); returns what each holds.
std::map<uint64_t, std::vector<float>> PushNumbered(WorkerNode& w, const std::vector<uint64_t>& keys,
                                                    const std::function<uint32_t(uint64_t)>& len_of) {
  std::map<uint64_t, std::vector<float>> stored;
  std::vector<float> values;
  std::vector<uint32_t> lens;
  for (uint64_t k : keys) {
    const uint32_t len = len_of(k);
    lens.push_back(len);
    for (uint32_t j = 0; j < len; ++j) stored[k].push_back(static_cast<float>(k * 2048 + j));
    values.insert(values.end(), stored[k].begin(), stored[k].end());
  }
  REQUIRE(Await(w.Push(keys, values, lens)).ok());
  return stored;
}

// What a pull of `ask` gives: the keys' values back to back and their lens, in ask's order.
PullResult Expected(const std::map<uint64_t, std::vector<float>>& stored, const std::vector<uint64_t>& ask) {
  PullResult want;
  for (uint64_t k : ask) {
    const std::vector<float>& v = stored.at(k);
    want.values.insert(want.values.end(), v.begin(), v.end());
    want.lens.push_back(static_cast<uint32_t>(v.size()));
  }
  return want;
}

}  // namespace

TEST_CASE("Pull over three servers: runs of consecutive keys, keys interleaved between servers, or both, in one result",
          "[node][net][dataplane]") {
  // An answer to a run of consecutive keys of the request is kept whole until the result is
  // copied out; others are placed key by key. Whichever way each server's answer went, and
  // in whatever order they arrive, the result is in the order of the keys asked.
  TestCluster::Config config;
  config.servers = 3;
  TestCluster c(config);
  c.Start();
  WorkerNode& w = c.worker(0);
  std::vector<uint64_t> keys(3000);
  std::iota(keys.begin(), keys.end(), uint64_t{1});
  core::SortKeysByPosition(&keys);  // each server's keys one run
  std::map<uint64_t, std::vector<float>> stored =
      PushNumbered(w, keys, [](uint64_t k) { return k % 7 == 0 ? 3u : 2u; });
  std::vector<std::vector<uint64_t>> owned(3);
  for (uint64_t k : keys) owned[core::ServerForKey(k, 3)].push_back(k);
  REQUIRE(!owned[0].empty());
  REQUIRE(!owned[1].empty());
  REQUIRE(!owned[2].empty());
  auto check = [&](const std::vector<uint64_t>& ask) {
    const PullResult want = Expected(stored, ask);
    Result<PullResult> r = Await(w.Pull(ask));
    REQUIRE(r.ok());
    CHECK(r->values == want.values);
    CHECK(r->lens == want.lens);
    Result<PullView> v = Await(w.ZPull(ask));
    REQUIRE(v.ok());
    CHECK(v->lens == want.lens);
    std::vector<float> seen;
    for (size_t i = 0; i < ask.size(); ++i) seen.insert(seen.end(), v->values[i], v->values[i] + v->lens[i]);
    CHECK(seen == want.values);
  };
  SECTION("every server's keys a run, of mixed lengths") { check(keys); }
  SECTION("rows of one length, a run per server, servers in reverse order") {
    std::vector<uint64_t> ask;
    for (int s = 2; s >= 0; --s) {
      for (uint64_t k : owned[s]) {
        if (stored[k].size() == 2) ask.push_back(k);
      }
    }
    check(ask);
  }
  SECTION("server 0's keys a run, then servers 1 and 2 interleaved") {
    std::vector<uint64_t> ask = owned[0];
    for (size_t i = 0; i < std::max(owned[1].size(), owned[2].size()); ++i) {
      if (i < owned[1].size()) ask.push_back(owned[1][i]);
      if (i < owned[2].size()) ask.push_back(owned[2][i]);
    }
    check(ask);
  }
  SECTION("every key's place shuffled") {
    std::vector<uint64_t> ask = keys;
    std::shuffle(ask.begin(), ask.end(), std::mt19937_64(5));
    check(ask);
  }
}

TEST_CASE("Pull over two servers in shuffled order: empty, one-float and long keys side by side, in one result",
          "[node][net][dataplane]") {
  // Keys placed one by one (each server's keys spread through the request): short values
  // are gathered and appended in batches, values longer than such a batch directly; both
  // kinds and empty keys among each other, against the values pushed.
  TestCluster::Config config;
  config.servers = 2;
  TestCluster c(config);
  c.Start();
  WorkerNode& w = c.worker(0);
  std::vector<uint64_t> keys(500);
  std::iota(keys.begin(), keys.end(), uint64_t{1});
  const uint32_t kLens[] = {1, 0, 700, 1100, 3, 1, 1024};
  const std::map<uint64_t, std::vector<float>> stored = PushNumbered(w, keys, [&](uint64_t k) { return kLens[k % 7]; });
  for (uint64_t seed : {1, 2, 3}) {
    std::vector<uint64_t> ask = keys;
    std::shuffle(ask.begin(), ask.end(), std::mt19937_64(seed));
    const PullResult want = Expected(stored, ask);
    Result<PullResult> r = Await(w.Pull(ask));
    REQUIRE(r.ok());
    CHECK(r->lens == want.lens);
    CHECK(r->values == want.values);
  }
}

TEST_CASE("PullInto that fails on one server is ready only when no answer can still write into dest",
          "[node][net][dataplane]") {
  // Server 0 holds a large key, server 1 is asked for a key it does not have. Server 1's
  // kNotFound comes back while server 0's answer is still being read into dest (given a
  // layout, each answer has its span there): the future must not be ready before that
  // answer has ended, or the caller could free dest while the socket still writes into it.
  TestCluster c(Nodes(1, 2));
  c.Start();
  WorkerNode& w = c.worker(0);
  const uint64_t big = KeysOf(0, 2, 1)[0];
  const uint64_t missing = KeysOf(1, 2, 1)[0];
  const uint32_t floats = 8u << 20;  // 32 MiB
  REQUIRE(Await(w.Push({big}, std::vector<float>(floats, 1.5f))).ok());
  std::vector<float> dest(floats + 1);
  for (int round = 0; round < 3; ++round) {
    std::fill(dest.begin(), dest.end(), 0.0f);
    std::vector<uint32_t> layout = {floats, 1};
    Status st = Await(w.PullInto({big, missing}, dest.data(), dest.size(), &layout));
    CHECK(st.code() == Code::kNotFound);
    // From here on dest is the caller's again: nothing may write into it.
    std::fill(dest.begin(), dest.end(), -7.0f);
    std::this_thread::sleep_for(200ms);  // longer than server 0's answer takes to arrive
    CHECK(std::count(dest.begin(), dest.end(), -7.0f) == static_cast<long>(dest.size()));
  }
}

TEST_CASE("PullSync answers like Pull - over a direct link when the keys live on one server",
          "[node][net][dataplane]") {
  TestCluster c(AssignNodes(1, 2));
  c.Start();
  WorkerNode& w = c.worker(0);
  const std::vector<uint64_t> on0 = KeysOf(0, 2, 3), on1 = KeysOf(1, 2, 2);
  std::vector<uint64_t> both = on0;
  both.insert(both.end(), on1.begin(), on1.end());
  const std::vector<uint32_t> lens = {2, 1, 3, 4, 1};
  std::vector<float> values;
  for (size_t i = 0; i < 11; ++i) values.push_back(static_cast<float>(i) * 0.25f);
  REQUIRE(Await(w.Push(both, values, lens)).ok());

  // One server: the direct way, the same values and lengths as Pull.
  Result<PullResult> direct = w.PullSync(on0);
  REQUIRE(direct.ok());
  CHECK(w.direct_pulls() == 1);
  Result<PullResult> pulled = Await(w.Pull(on0));
  REQUIRE(pulled.ok());
  CHECK(direct->values == pulled->values);
  CHECK(direct->lens == pulled->lens);
  CHECK(direct->lens == std::vector<uint32_t>{2, 1, 3});
  REQUIRE(w.PullSync(on1).ok());
  CHECK(w.direct_pulls() == 2);
  // Keys on two servers: the ordinary Pull, still the right answer.
  Result<PullResult> all = w.PullSync(both);
  REQUIRE(all.ok());
  CHECK(all->values == values);
  CHECK(w.direct_pulls() == 2);
  // Errors are the server's, as through Pull (a key never pushed, asked of server 0 over
  // the direct link); the link stays usable.
  const std::vector<uint64_t> unknown = KeysOf(0, 2, 4);  // the 4th was never pushed
  Result<PullResult> missing = w.PullSync({unknown[3]});
  CHECK(missing.status().code() == Code::kNotFound);
  CHECK(missing.status().code() == Await(w.Pull({unknown[3]})).status().code());
  Result<PullResult> again = w.PullSync(on0);
  REQUIRE(again.ok());
  CHECK(w.direct_pulls() == 3);
  CHECK(again->values == direct->values);
}

TEST_CASE("PullSync right after an unanswered Push of the same worker sees that Push",
          "[node][net][dataplane]") {
  TestCluster c(AssignNodes(1, 1));
  c.Start();
  WorkerNode& w = c.worker(0);
  PushLargeThenPullSmall(w, 50, [](WorkerNode& w) { return w.PullSync({5}); });
  // Once the pushes are answered the direct way serves again.
  const uint64_t before = w.direct_pulls();
  Result<PullResult> r = w.PullSync({5});
  REQUIRE(r.ok());
  CHECK(r->values == std::vector<float>{50.0f});
  CHECK(w.direct_pulls() == before + 1);
}

TEST_CASE("metadata claiming more servers than a job may have is ignored - worker_dispatch_fuzz oom",
          "[node][net][dataplane][fuzz]") {
  // worker_dispatch_fuzz: server_num from the wire sizes PullSync's route table and Push's
  // key groups (2^30 addresses: out of memory). A node refuses metadata whose totals
  // exceed kMaxRoleTotal and keeps the metadata it has.
  TestCluster c(Nodes(1, 1));
  c.Start();
  WorkerNode& w = c.worker(0);
  REQUIRE(Await(w.Push({7}, {1.0f})).ok());
  const uint64_t epoch = w.metadata().epoch();
  for (int total : {1 << 30, core::kMaxRoleTotal + 1, -1}) {
    pb::SendMetadataMessage md = w.metadata();
    md.set_server_num(total);
    md.set_epoch(md.epoch() + 1);
    comm::Frame f;
    f.meta = MakeMeta(pb::SEND_METADATA, pb::SCHEDULER, -1);
    f.payload = ToBuffer(md);
    NodeProbe::FromScheduler(w, /*conn=*/1, std::move(f));
    CHECK(w.server_count() == 1);
    CHECK(w.metadata().epoch() == epoch);
  }
  REQUIRE(Await(w.Push({7}, {2.0f})).ok());
  Result<PullResult> r = w.PullSync({7});
  REQUIRE(r.ok());
  CHECK(r->values == std::vector<float>{3.0f});
}

TEST_CASE("PullSync over a direct link proves the cluster token", "[node][net][dataplane][auth]") {
  SchedulerOptions so;
  so.worker_num = 1;
  so.server_num = 1;
  so.heartbeat_interval = 50ms;
  so.cluster_token = "a token for the direct link";
  SchedulerNode sched(so);
  REQUIRE(sched.Start().ok());
  NodeOptions o;
  o.scheduler_port = sched.port();
  o.heartbeat_interval = 50ms;
  o.request_timeout = 10s;
  o.cluster_token = so.cluster_token;
  o.node_id = "s0";
  ServerNode server(o);
  REQUIRE(server.Start().ok());
  o.node_id = "w0";
  WorkerNode worker(o);
  REQUIRE(worker.Start().ok());
  REQUIRE(worker.WaitForReady(kDeadline).ok());
  REQUIRE(Await(worker.Push({9}, {1.5f, 2.5f})).ok());
  Result<PullResult> r = worker.PullSync({9});
  REQUIRE(r.ok());
  CHECK(r->values == std::vector<float>{1.5f, 2.5f});
  CHECK(worker.direct_pulls() == 1);
  worker.Stop();
  server.Stop();
  sched.Stop();
}

TEST_CASE("PullSync from a server that stopped fails with a clear status - not a hang",
          "[node][net][dataplane]") {
  TestCluster::Config config;
  config.servers = 1;
  config.request_timeout = 3s;
  TestCluster c(config);
  c.Start();
  WorkerNode& w = c.worker(0);
  REQUIRE(Await(w.Push({1}, {1.0f})).ok());
  REQUIRE(w.PullSync({1}).ok());
  REQUIRE(w.direct_pulls() == 1);
  c.server(0).Stop();
  const auto t0 = std::chrono::steady_clock::now();
  Result<PullResult> r = w.PullSync({1});
  INFO("status: " << r.status());
  CHECK_FALSE(r.ok());
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
  CHECK(w.direct_pulls() == 1);
}

// Established client-side TCP connections (in this process's network namespace) to
// 127.0.0.1:port, from /proc/net/tcp.
int ClientLinksTo(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  char want[16];
  std::snprintf(want, sizeof want, "0100007F:%04X", port);
  int n = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if (remote == want && state == "01") ++n;
  }
  return n;
}

TEST_CASE("Stop closes PullSync's direct links - a link out with a caller is not kept",
          "[node][net][dataplane]") {
  TestCluster c(Nodes(1, 1));
  c.Start();
  WorkerNode& w = c.worker(0);
  REQUIRE(Await(w.Push({1}, {1.0f})).ok());
  // Two threads at once: one or two direct links to the one server, kept idle after.
  std::atomic<bool> other_ok{false};  // Catch's assertions are for the test thread only
  std::thread other([&w, &other_ok] { other_ok = w.PullSync({1}).ok(); });
  CHECK(w.PullSync({1}).ok());
  other.join();
  CHECK(other_ok.load());
  REQUIRE(w.direct_pulls() == 2);
  const int port = c.server(0).listen_port();
  const int before = ClientLinksTo(port);
  CHECK(before >= 2);  // the loop's link and at least one direct link
  w.Stop();
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (ClientLinksTo(port) != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK(ClientLinksTo(port) == 0);
  // A stopped worker opens no direct link again.
  Result<PullResult> after = w.PullSync({1});
  CHECK_FALSE(after.ok());
  CHECK(w.direct_pulls() == 2);
  CHECK(ClientLinksTo(port) == 0);
}

TEST_CASE("malformed pscore.push payloads are refused with an error answer and the server stays up",
          "[node][net][dataplane]") {
  TestCluster::Config config;
  TestCluster c(config);
  c.Start();
  WorkerNode& w = c.worker(0);
  const uint64_t keys[] = {1, 2, 3};
  const uint32_t lens[] = {2, 2, 2};
  const float values[] = {1, 2, 3, 4, 5, 6};

  std::vector<std::pair<std::string, BufferPtr>> bad;
  // lens sum to 6, but only 5 values.
  bad.emplace_back("lens longer than values", core::EncodeKvPairs(keys, 3, lens, values, 5));
  // Two lens for three keys.
  bad.emplace_back("fewer lens than keys", core::EncodeKvPairs(keys, 3, lens, values, 4));
  // A push without values.
  bad.emplace_back("no values", core::EncodeKvPairs(keys, 3, lens, nullptr, 0));
  BufferPtr good = core::EncodeKvPairs(keys, 3, lens, values, 6);
  for (size_t cut : {size_t{0}, size_t{3}, good->size() / 2, good->size() - 1}) {
    bad.emplace_back("truncated to " + std::to_string(cut) + " bytes", Buffer::Copy(good->data(), cut));
  }
  bad.emplace_back("garbage", Buffer::FromString(std::string(64, '\xff')));
  for (auto& [what, payload] : bad) {
    INFO(what);
    auto f = w.Call(0, kPushHandler, payload);
    Result<BufferPtr> r = Await(f);
    REQUIRE_FALSE(r.ok());
    CHECK((r.status().code() == Code::kProtocol || r.status().code() == Code::kInvalidArgument));
  }
  // Nothing was applied, and the server still serves a valid push and pull.
  CHECK(c.server(0).store().num_keys() == 0);
  auto p = w.Call(0, kPushHandler, good);
  REQUIRE(Await(p).ok());
  auto f = w.Pull({1, 2, 3});
  Result<PullResult> r = Await(f);
  REQUIRE(r.ok());
  CHECK(r->values == std::vector<float>(values, values + 6));
}

TEST_CASE("a pull request that asks for answers without keys gets them, one that does not gets the keys",
          "[node][net][dataplane]") {
  TestCluster c(TestCluster::Config{});
  c.Start();
  WorkerNode& w = c.worker(0);
  // Rows of one length (the one-walk answer) and of two lengths (the two walks); one
  // server, so every key is its own.
  const std::vector<uint64_t> keys = {11, 12, 13};
  REQUIRE(Await(w.Push(keys, std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 2, 2})).ok());
  REQUIRE(Await(w.Push({14}, std::vector<float>{7}, {1})).ok());
  for (const std::vector<uint64_t>& ask : {keys, std::vector<uint64_t>{11, 14, 13}}) {
    INFO(ask.size() << " keys, the second " << ask[1]);
    std::vector<float> expect;
    for (uint64_t k : ask) {
      if (k == 14) {
        expect.push_back(7);
      } else {
        expect.push_back(static_cast<float>(2 * (k - 11) + 1));
        expect.push_back(static_cast<float>(2 * (k - 11) + 2));
      }
    }
    Result<BufferPtr> keyless = Await(w.Call(0, kPullHandler, core::EncodePullRequest(ask.data(), ask.size())));
    REQUIRE(keyless.ok());
    Result<core::KvView> a = core::DecodeKvPairs((*keyless)->data(), (*keyless)->size(), true, /*answer=*/true);
    REQUIRE(a.ok());
    CHECK(a->keys == nullptr);
    CHECK(a->num_keys == ask.size());
    if (ask == keys) {
      CHECK((a->lens == nullptr && a->row_len == 2));  // rows of one length: no lens either
    } else {
      CHECK(a->num_lens == ask.size());
    }
    CHECK(std::vector<float>(a->values, a->values + a->num_values) == expect);
    // A requester that does not ask (one that predates the flag) reads the keys.
    Result<BufferPtr> full =
        Await(w.Call(0, kPullHandler, core::EncodeKvPairs(ask.data(), ask.size(), nullptr, nullptr, 0)));
    REQUIRE(full.ok());
    Result<core::KvView> b = core::DecodeKvPairs((*full)->data(), (*full)->size(), true);
    REQUIRE(b.ok());
    CHECK(std::vector<uint64_t>(b->keys, b->keys + b->num_keys) == ask);
    CHECK(std::vector<float>(b->values, b->values + b->num_values) == expect);
    CHECK((*keyless)->size() + ask.size() * sizeof(uint64_t) <= (*full)->size());
  }
  // The worker's own pulls (loop and direct link) read the keyless answers.
  Result<PullResult> p = Await(w.Pull({13, 14, 11}));
  REQUIRE(p.ok());
  CHECK(p->values == std::vector<float>{5, 6, 7, 1, 2});
  CHECK(p->lens == std::vector<uint32_t>{2, 1, 2});
  Result<PullResult> s = w.PullSync({12, 13});
  REQUIRE(s.ok());
  CHECK(s->values == std::vector<float>{3, 4, 5, 6});
}

TEST_CASE("a Pull whose answer would pass max_message_bytes is refused kResourceExhausted - repeated keys included - and the server stays up",
          "[node][net][dataplane]") {
  TestCluster::Config config;
  config.max_message_bytes = 1 << 20;
  TestCluster c(config);
  c.Start();
  WorkerNode& w = c.worker(0);
  // Key 1: 1000 floats (answers written from the store); key 2: 100 floats (copied).
  REQUIRE(Await(w.Push({1, 2}, std::vector<float>(1100, 0.5f), {1000, 100})).ok());
  for (auto [key, times] : {std::pair<uint64_t, size_t>{1, 300}, std::pair<uint64_t, size_t>{2, 3000}}) {
    INFO("key " << key << " x " << times);
    std::vector<uint64_t> keys(times, key);  // about 1.2 MB of answer from a small request
    Result<PullResult> r = Await(w.Pull(keys));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kResourceExhausted);
    CHECK_THAT(r.status().message(), Catch::Contains("max_message_bytes"));
  }
  // The link and the server are fine: a pull that fits is answered.
  Result<PullResult> ok = Await(w.Pull({1, 2, 1}));
  REQUIRE(ok.ok());
  CHECK(ok->values.size() == 2100);
  CHECK(c.timeouts() == 0);
}

TEST_CASE("a Pull whose answer leaves keys (and one-length rows' lens) out is measured without them against max_message_bytes",
          "[node][net][dataplane]") {
  TestCluster::Config config;
  config.max_message_bytes = 1 << 20;
  TestCluster c(config);
  c.Start();
  WorkerNode& w = c.worker(0);
  // 100,000 keys of one float: 400 KB of answer, where keys and lens would add 1.2 MB.
  std::vector<uint64_t> rows(100000);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = 1000 + i;
  for (size_t at = 0; at < rows.size(); at += 25000) {  // pushes carry keys and lens: in parts
    std::vector<uint64_t> part(rows.begin() + at, rows.begin() + at + 25000);
    std::vector<float> values(part.size());
    for (size_t i = 0; i < part.size(); ++i) values[i] = static_cast<float>(part[i] % 977);
    REQUIRE(Await(w.Push(part, values)).ok());
  }
  Result<PullResult> one = Await(w.Pull(rows));
  REQUIRE(one.ok());
  REQUIRE(one->values.size() == rows.size());
  bool same = true;
  for (size_t i = 0; i < rows.size() && same; ++i) same = one->values[i] == static_cast<float>(rows[i] % 977);
  CHECK(same);
  // 60,000 keys of 1 or 2 floats: 360 KB of values and 240 KB of lens; the keys would
  // take the answer past 1 MiB.
  std::vector<uint64_t> mixed(60000);
  std::vector<uint32_t> lens(mixed.size());
  for (size_t i = 0; i < mixed.size(); ++i) {
    mixed[i] = 500000 + i;
    lens[i] = 1 + static_cast<uint32_t>(i % 2);
  }
  std::vector<float> expect;
  for (size_t at = 0; at < mixed.size(); at += 20000) {
    std::vector<uint64_t> part(mixed.begin() + at, mixed.begin() + at + 20000);
    std::vector<uint32_t> part_lens(lens.begin() + at, lens.begin() + at + 20000);
    std::vector<float> values;
    for (size_t i = 0; i < part.size(); ++i) {
      for (uint32_t j = 0; j < part_lens[i]; ++j) values.push_back(static_cast<float>((part[i] + j) % 613));
    }
    expect.insert(expect.end(), values.begin(), values.end());
    REQUIRE(Await(w.Push(part, values, part_lens)).ok());
  }
  Result<PullResult> two = Await(w.Pull(mixed));
  REQUIRE(two.ok());
  CHECK(two->lens == lens);
  CHECK(two->values == expect);
  CHECK(c.timeouts() == 0);
}

TEST_CASE("a 64 MiB Push/Pull round-trips and heartbeats stay on time", "[node][net][dataplane]") {
  TestCluster::Config config;
  config.heartbeat_timeout = 2s;
  TestCluster c(config);
  c.Start();
  const size_t n = (64u << 20) / sizeof(float);
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 4093);
  for (int round = 0; round < 2; ++round) {
    auto p = c.worker(0).Push({42}, values);
    REQUIRE(Await(p).ok());
  }
  auto f = c.worker(0).Pull({42});
  Result<PullResult> r = Await(f);
  REQUIRE(r.ok());
  REQUIRE(r->values.size() == n);
  bool same = true;
  for (size_t i = 0; i < n && same; ++i) same = r->values[i] == 2.0f * values[i];
  CHECK(same);
  CHECK(c.timeouts() == 0);
}

TEST_CASE("a 1 GiB Push/Pull works with max_message_bytes raised and heartbeats stay on time",
          "[node][net][dataplane][slow]") {
  TestCluster::Config config;
  config.max_message_bytes = 2ull << 30;
  config.heartbeat_timeout = 3s;
  config.store.rule = core::UpdateRule::kAssign;
  TestCluster c(config);
  c.Start();
  const size_t n = (1ull << 30) / sizeof(float);
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 65521);
  auto p = c.worker(0).Push({7}, values);
  REQUIRE(Await(p, 120s).ok());
  auto f = c.worker(0).Pull({7});
  Result<PullResult> r = Await(f, 120s);
  REQUIRE(r.ok());
  REQUIRE(r->values.size() == n);
  CHECK(std::equal(values.begin(), values.end(), r->values.begin()));
  std::vector<float>().swap(r->values);  // one GiB less held
  // The same into the caller's memory: read from the socket straight into it.
  std::vector<float> dest(n, -1.0f);
  const uint64_t in_place = c.worker(0).in_place_pulls();
  REQUIRE(Await(c.worker(0).PullInto({7}, dest.data(), dest.size()), 120s).ok());
  CHECK(c.worker(0).in_place_pulls() == in_place + 1);
  CHECK(dest == values);
  std::vector<float>().swap(dest);
  // Pull again: the first told the key's size, so the result is allocated before the
  // request goes out and the answer is read straight into it.
  auto again = c.worker(0).Pull({7});
  Result<PullResult> r2 = Await(again, 120s);
  REQUIRE(r2.ok());
  CHECK(c.worker(0).in_place_pulls() == in_place + 2);
  CHECK(r2->values == values);
  CHECK(c.timeouts() == 0);
}

}  // namespace pscore::node
