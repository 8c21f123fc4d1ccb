// The small pieces comm's TCP plumbing shares: the address parser, the retry policy, the
// liveness token, the accept cap and the connection sweep.
#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include <sys/socket.h>

#include "pscore/comm/address.h"
#include "pscore/comm/alive.h"
#include "pscore/comm/backoff.h"
#include "pscore/comm/conn_sweep.h"
#include "pscore/comm/tcp_listener.h"

namespace pscore::comm {
namespace {

using testing::OnLoop;

TEST_CASE("address: host:port splits at the last colon and checks the port", "[comm][address]") {
  Result<HostPort> a = ParseHostPort("10.0.0.7:8080");
  REQUIRE(a.ok());
  CHECK(a->host == "10.0.0.7");
  CHECK(a->port == 8080);
  Result<HostPort> v6 = ParseHostPort("::1:9");
  REQUIRE(v6.ok());
  CHECK(v6->host == "::1");
  CHECK(v6->port == 9);
  Result<HostPort> empty_host = ParseHostPort(":0");
  REQUIRE(empty_host.ok());
  CHECK(empty_host->host.empty());
  for (const char* bad : {"10.0.0.7", "10.0.0.7:", "h:80x", "h:-1", "h:65536", "h:123456", "h: 80"}) {
    INFO(bad);
    Result<HostPort> r = ParseHostPort(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
  }
  CHECK(JoinHostPort("127.0.0.1", 80) == "127.0.0.1:80");
}

TEST_CASE("address: numeric hosts and localhost resolve, names do not", "[comm][address]") {
  sockaddr_storage addr;
  REQUIRE(ResolveAddress("127.0.0.1", 80, &addr).ok());
  CHECK(addr.ss_family == AF_INET);
  REQUIRE(ResolveAddress("::1", 80, &addr).ok());
  CHECK(addr.ss_family == AF_INET6);
  REQUIRE(ResolveAddress("localhost", 0, &addr).ok());
  CHECK(addr.ss_family == AF_INET);
  REQUIRE(ResolveAddress("", 0, &addr).ok());
  CHECK(ResolveAddress("example.com", 80, &addr).code() == Code::kInvalidArgument);
  CHECK(ResolveAddress("127.0.0.1", 65536, &addr).code() == Code::kInvalidArgument);
  CHECK(ResolveAddress("127.0.0.1", -1, &addr).code() == Code::kInvalidArgument);
}

TEST_CASE("backoff: waits double up to the cap and start over after Reset", "[comm][backoff]") {
  using std::chrono::milliseconds;
  Backoff b(milliseconds(20), milliseconds(100));
  CHECK(b.Peek() == milliseconds(20));
  CHECK(b.Next() == milliseconds(20));
  CHECK(b.Next() == milliseconds(40));
  CHECK(b.Next() == milliseconds(80));
  CHECK(b.Next() == milliseconds(100));
  CHECK(b.Next() == milliseconds(100));
  b.Reset();
  CHECK(b.Next() == milliseconds(20));
}

TEST_CASE("alive token: a watch reads gone after Expire or once the owner is destroyed", "[comm][alive]") {
  AliveToken::Watch empty;
  CHECK_FALSE(empty.alive());
  AliveToken::Watch kept;
  {
    AliveToken token;
    kept = token.watch();
    AliveToken::Watch other = token.watch();
    CHECK(kept.alive());
    CHECK(static_cast<bool>(other));
  }
  CHECK_FALSE(kept.alive());
  AliveToken token;
  AliveToken::Watch w = token.watch();
  CHECK_FALSE(token.expired());
  token.Expire();
  CHECK(token.expired());
  CHECK_FALSE(w.alive());
  CHECK_FALSE(token.watch().alive());
}

TEST_CASE("accept cap: admits below the cap, counts refusals at it, 0 means no cap", "[comm][listener]") {
  AcceptCap cap("test", 2);
  CHECK(cap.Admit(0));
  CHECK(cap.Admit(1));
  CHECK_FALSE(cap.Admit(2));
  CHECK_FALSE(cap.Admit(5));
  CHECK(cap.refused() == 2);
  AcceptCap none("test", 0);
  CHECK(none.Admit(1000000));
  CHECK(none.refused() == 0);
}

TEST_CASE("listener: a bad host fails before anything is bound - port 0 reports the port picked",
          "[comm][listener][net]") {
  EventLoop loop("listener-test");
  REQUIRE(loop.Start().ok());
  Status bad = OnLoop(loop, [&] {
    TcpListener::Callbacks cb;
    cb.accepted = [](uv_tcp_s*) {};
    return TcpListener::Open(&loop, "not-an-ip", 0, "test", std::move(cb)).status();
  });
  CHECK(bad.code() == Code::kInvalidArgument);
  Result<int> port = OnLoop(loop, [&]() -> Result<int> {
    TcpListener::Callbacks cb;
    cb.accepted = [](uv_tcp_s*) {};
    Result<TcpListener*> l = TcpListener::Open(&loop, "127.0.0.1", 0, "test", std::move(cb));
    if (!l.ok()) return l.status();
    const int p = (*l)->port();
    const bool named = (*l)->address() == "127.0.0.1:" + std::to_string(p);
    (*l)->Close();
    if (!named) return Status(Code::kInternal, "address does not name the port");
    return p;
  });
  REQUIRE(port.ok());
  CHECK(*port > 0);
  CHECK(loop.Stop().ok());  // the listener's handle was closed: uv_loop_close succeeds
}

TEST_CASE("conn sweep: runs at a quarter of the shortest timeout within its bounds, and not after Stop",
          "[comm][sweep]") {
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  CHECK(ConnSweep::Period(seconds(2)) == milliseconds(500));
  CHECK(ConnSweep::Period(milliseconds(8)) == milliseconds(10));  // at least 10 ms
  CHECK(ConnSweep::Period(seconds(10), seconds(1)) == seconds(1));
  CHECK(ConnSweep::Period(milliseconds(1), milliseconds(1)) == milliseconds(10));

  EventLoop loop("sweep-test");
  REQUIRE(loop.Start().ok());
  std::atomic<int> passes{0};
  ConnSweep sweep;
  OnLoop(loop, [&] {
    sweep.Start(&loop, milliseconds(10), [&] { ++passes; });
    sweep.Start(&loop, milliseconds(10), [&] { passes += 1000; });  // already running: ignored
    return sweep.running();
  });
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (passes.load() < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(milliseconds(5));
  const int at_stop = OnLoop(loop, [&] {
    sweep.Stop();
    sweep.Stop();  // idempotent
    return passes.load();
  });
  CHECK(at_stop >= 3);
  CHECK(at_stop < 1000);
  std::this_thread::sleep_for(milliseconds(50));
  CHECK(passes.load() == at_stop);
  CHECK_FALSE(OnLoop(loop, [&] { return sweep.running(); }));
  CHECK(loop.Stop().ok());
}

}  // namespace
}  // namespace pscore::comm
