// Request/response over loopback: echo, reconnect, lost peer, deadlines.
#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "pscore/comm/messenger.h"
#include "pscore/comm/tcp_client.h"

namespace pscore::comm {
namespace {

using testing::EchoServer;
using testing::OneShot;
using testing::OnLoop;
using testing::TestMeta;

// A client Messenger on its own loop. Destroyed after its loop stopped.
struct Client {
  EventLoop loop{"client"};
  std::unique_ptr<Messenger> messenger;
  std::atomic<int> failed{0};
  OneShot<int> failed_before_close;  // how many calls had failed when on_close ran

  Client() {
    Messenger::Handlers h;
    h.on_close = [this](ConnId, const Status&) { failed_before_close.Set(failed.load()); };
    messenger = std::make_unique<Messenger>(&loop, TransportOptions(), std::move(h));
    REQUIRE(loop.Start().ok());
  }
  ConnId Connect(int port) {
    auto conn = std::make_shared<OneShot<Result<ConnId>>>();
    loop.Post([this, port, conn] {
      messenger->transport().Connect("127.0.0.1", port, ConnectOptions(),
                                     [conn](Result<ConnId> r) { conn->Set(std::move(r)); });
    });
    Result<ConnId> r = conn->Get();
    REQUIRE(r.ok());
    return *r;
  }
  ~Client() { Stop().IgnoreError(); }
  Status Stop() {
    Status st = loop.Stop();
    messenger.reset();
    return st;
  }
};

// One echo call through the client's messenger; returns the answer's payload or error.
Result<std::string> EchoOnce(Client& c, ConnId conn, const std::string& payload,
                             Duration timeout = std::chrono::seconds(10), int32_t user_cmd = 0) {
  auto out = std::make_shared<OneShot<Result<std::string>>>();
  c.loop.Post([&c, conn, payload, timeout, user_cmd, out] {
    c.messenger->Call(conn, TestMeta(0, user_cmd), Buffer::FromString(payload), timeout,
                      [out](Result<Frame> r) {
                        if (!r.ok()) {
                          out->Set(r.status());
                        } else {
                          out->Set(std::string(r->payload ? r->payload->view() : ""));
                        }
                      });
  });
  return out->Get();
}

}  // namespace

TEST_CASE("messenger: 10,000 echoed requests are all answered correctly", "[comm][net][messenger]") {
  EchoServer server;
  int port = server.Start();
  Client client;
  ConnId conn = client.Connect(port);
  constexpr int kRequests = 10000;
  std::atomic<int> correct{0};
  std::atomic<int> wrong{0};
  OneShot<bool> done;
  std::vector<char> seen_ok(kRequests, 0);  // client loop thread only until done
  client.loop.Post([&] {
    std::atomic<int>* answered = new std::atomic<int>(0);
    for (int i = 0; i < kRequests; ++i) {
      std::string body = "request-" + std::to_string(i) + std::string(i % 97, 'z');
      client.messenger->Call(conn, TestMeta(0, i % 50), Buffer::FromString(body), std::chrono::seconds(20),
                             [&, i, body, answered](Result<Frame> r) {
                               bool ok = r.ok() && r->payload && r->payload->view() == body &&
                                         r->meta.is_response();
                               ++(ok ? correct : wrong);
                               if (ok) seen_ok[i] = 1;
                               if (++*answered == kRequests) {
                                 delete answered;
                                 done.Set(true);
                               }
                             });
    }
  });
  REQUIRE(done.Get());
  int first_missing = -1;
  for (int i = 0; i < kRequests && first_missing < 0; ++i) {
    if (!seen_ok[i]) first_missing = i;
  }
  CHECK(first_missing == -1);
  CHECK(correct.load() == kRequests);
  CHECK(wrong.load() == 0);
  CHECK(server.requests() == static_cast<uint64_t>(kRequests));
  CHECK(OnLoop(client.loop, [&] { return client.messenger->pending_requests(); }) == 0);
  REQUIRE(client.Stop().ok());
  REQUIRE(server.Stop().ok());
}

// The entry for `cmd` in a StatsByCommand snapshot (all zero if the command is absent).
CommandStats EntryFor(const std::vector<CommandStats>& all, int cmd) {
  for (const CommandStats& c : all) {
    if (c.cmd == cmd) return c;
  }
  CommandStats none;
  none.cmd = cmd;
  return none;
}

TEST_CASE("transport: frames and bytes are counted by command both ways", "[comm][net][messenger]") {
  EchoServer server;
  int port = server.Start();
  Client client;
  ConnId conn = client.Connect(port);
  // Three one-way heartbeats, then five echoed SEND_DATA calls on the same connection: the
  // answers arrive after the server has read the heartbeats (one connection keeps order).
  std::atomic<int> notify_failed{0};  // no Catch assertion on the loop thread
  client.loop.Post([&] {
    for (int i = 0; i < 3; ++i) {
      pb::MessageMeta meta;
      meta.set_cmd(pb::HEARTBEAT);
      if (!client.messenger->Notify(conn, meta, Buffer::FromString("beat")).ok()) ++notify_failed;
    }
  });
  for (int i = 0; i < 5; ++i) REQUIRE(EchoOnce(client, conn, std::string(100, 'x')).ok());
  CHECK(notify_failed == 0);
  // Command numbers no peer should send: 40 has its own slot, 1000 and -3 share the last.
  testing::RawSocket raw;
  REQUIRE(raw.Connect(port));
  std::vector<std::string> odd_frames;
  for (int cmd : {40, 1000, -3}) {
    pb::MessageMeta meta = TestMeta(7);
    meta.set_cmd(static_cast<pb::NodeCommand>(cmd));
    odd_frames.push_back(testing::EncodeFrame(meta, "odd"));
    REQUIRE(raw.SendAll(odd_frames.back()));
    pb::MessageMeta answer;
    std::string payload;
    REQUIRE(raw.RecvFrame(&answer, &payload));  // echoed: the server has counted it
    CHECK(answer.cmd() == cmd);
  }

  auto [srv_stats, srv_cmds] = OnLoop(server.loop(), [&] {
    return std::make_pair(server.messenger().transport().stats(), server.messenger().transport().StatsByCommand());
  });
  auto [cli_stats, cli_cmds] = OnLoop(client.loop, [&] {
    return std::make_pair(client.messenger->transport().stats(), client.messenger->transport().StatsByCommand());
  });
  // The client sent 3 heartbeats and 5 requests and got 5 answers; nothing else.
  CommandStats cli_hb = EntryFor(cli_cmds, pb::HEARTBEAT);
  CommandStats cli_data = EntryFor(cli_cmds, pb::SEND_DATA);
  CHECK(cli_cmds.size() == 2);
  CHECK(cli_hb.frames_out == 3);
  CHECK(cli_hb.frames_in == 0);
  CHECK(cli_data.frames_out == 5);
  CHECK(cli_data.frames_in == 5);
  CHECK(cli_data.bytes_out > 5 * (kHeaderBytes + 100));
  // What one side sent by command, the other received, byte for byte.
  CommandStats srv_hb = EntryFor(srv_cmds, pb::HEARTBEAT);
  CommandStats srv_data = EntryFor(srv_cmds, pb::SEND_DATA);
  CHECK(srv_hb.frames_in == 3);
  CHECK(srv_hb.bytes_in == cli_hb.bytes_out);
  CHECK(srv_hb.frames_out == 0);  // one-way: not answered
  CHECK(srv_data.frames_in == 5);
  CHECK(srv_data.bytes_in == cli_data.bytes_out);
  CHECK(srv_data.bytes_out == cli_data.bytes_in);
  // Exact sizes for the raw frames; the made-up numbers are bounded to one shared slot.
  CommandStats c40 = EntryFor(srv_cmds, 40);
  CHECK(c40.frames_in == 1);
  CHECK(c40.frames_out == 1);
  CHECK(c40.bytes_in == odd_frames[0].size());
  CommandStats other = EntryFor(srv_cmds, kOtherCommand);
  CHECK(other.frames_in == 2);
  CHECK(other.frames_out == 2);
  CHECK(other.bytes_in == odd_frames[1].size() + odd_frames[2].size());
  REQUIRE(!srv_cmds.empty());
  CHECK(srv_cmds.back().cmd == kOtherCommand);
  // The per-command counts add up to the totals (every byte read belonged to a whole frame).
  uint64_t frames_in = 0, frames_out = 0, bytes_in = 0, bytes_out = 0;
  for (const CommandStats& c : srv_cmds) {
    frames_in += c.frames_in;
    frames_out += c.frames_out;
    bytes_in += c.bytes_in;
    bytes_out += c.bytes_out;
  }
  CHECK(frames_in == srv_stats.frames_in);
  CHECK(frames_out == srv_stats.frames_out);
  CHECK(bytes_in == srv_stats.bytes_in);
  CHECK(bytes_out == srv_stats.bytes_out);
  CHECK(frames_in == 3 + 5 + 3);
  REQUIRE(client.Stop().ok());
  REQUIRE(server.Stop().ok());
}

TEST_CASE("messenger: an error status in the answer fails the call", "[comm][net][messenger]") {
  EventLoop sloop("err-server");
  Messenger::Handlers h;
  std::unique_ptr<Messenger> srv;
  h.on_request = [&](ConnId c, Frame&& f) {
    srv->Reply(c, f.meta, Status(Code::kNotFound, "no such key")).IgnoreError();
  };
  srv = std::make_unique<Messenger>(&sloop, TransportOptions(), std::move(h));
  REQUIRE(sloop.Start().ok());
  Result<int> port = OnLoop(sloop, [&] { return srv->transport().Listen("127.0.0.1", 0); });
  REQUIRE(port.ok());
  Client client;
  ConnId conn = client.Connect(*port);
  Result<std::string> r = EchoOnce(client, conn, "k");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kNotFound);
  CHECK(r.status().message() == "no such key");
  REQUIRE(client.Stop().ok());
  REQUIRE(sloop.Stop().ok());
  srv.reset();
}

TEST_CASE("messenger: a peer cannot answer a request that went to another peer", "[comm][net][messenger]") {
  // The honest server holds the client's first request; the forger answers the client's
  // second request under the first one's id (ids are sequential), with its own payload.
  EchoServer honest;
  int honest_port = honest.Start();
  EventLoop floop("forger");
  Messenger::Handlers h;
  std::unique_ptr<Messenger> forger;
  h.on_request = [&](ConnId c, Frame&& f) {
    pb::MessageMeta forged = f.meta;
    forged.set_request_id(f.meta.request_id() - 1);
    forger->Reply(c, forged, Status::Ok(), Buffer::FromString("forged")).IgnoreError();
  };
  forger = std::make_unique<Messenger>(&floop, TransportOptions(), std::move(h));
  REQUIRE(floop.Start().ok());
  Result<int> forger_port = OnLoop(floop, [&] { return forger->transport().Listen("127.0.0.1", 0); });
  REQUIRE(forger_port.ok());
  Client client;
  ConnId to_honest = client.Connect(honest_port);
  ConnId to_forger = client.Connect(*forger_port);
  auto first = std::make_shared<OneShot<Result<std::string>>>();
  auto second = std::make_shared<OneShot<Status>>();
  client.loop.Post([&, first, second] {
    auto text = [](Result<Frame> r) -> Result<std::string> {
      if (!r.ok()) return r.status();
      return std::string(r->payload ? r->payload->view() : "");
    };
    client.messenger->Call(to_honest, TestMeta(0, testing::kCmdSilent), Buffer::FromString("held"),
                           std::chrono::milliseconds(500), [first, text](Result<Frame> r) { first->Set(text(std::move(r))); });
    client.messenger->Call(to_forger, TestMeta(0, 0), Buffer::FromString("ask"), std::chrono::milliseconds(500),
                           [second](Result<Frame> r) { second->Set(r.status()); });
  });
  Result<std::string> r = first->Get();
  INFO((r.ok() ? "answered: " + *r : r.status().ToString()));
  CHECK(r.status().code() == Code::kTimeout);  // not "forged": the forger's answer was dropped
  CHECK(second->Get().code() == Code::kTimeout);  // its own id was never answered
  CHECK(OnLoop(client.loop, [&] { return client.messenger->pending_requests(); }) == 0);
  REQUIRE(client.Stop().ok());
  REQUIRE(floop.Stop().ok());
  forger.reset();
  REQUIRE(honest.Stop().ok());
}

TEST_CASE("messenger: a request to a peer that never answers times out", "[comm][net][messenger]") {
  EchoServer server;
  int port = server.Start();
  Client client;
  ConnId conn = client.Connect(port);
  auto start = std::chrono::steady_clock::now();
  Result<std::string> r = EchoOnce(client, conn, "hello?", std::chrono::milliseconds(150),
                                   testing::kCmdSilent);
  auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kTimeout);
  CHECK(took >= std::chrono::milliseconds(150));
  CHECK(took < std::chrono::seconds(5));
  // The connection survives a timed-out request.
  Result<std::string> ok = EchoOnce(client, conn, "still there");
  REQUIRE(ok.ok());
  CHECK(*ok == "still there");
  REQUIRE(client.Stop().ok());
  REQUIRE(server.Stop().ok());
}

TEST_CASE("messenger: poll_spin opens a window after a lone request and after the last answer only",
          "[comm][net][messenger]") {
  using namespace std::chrono_literals;
  // A peer that holds its kCmdSilent request until told to answer, and echoes the rest.
  EventLoop server_loop("holder");
  std::unique_ptr<Messenger> server;
  OneShot<std::pair<ConnId, pb::MessageMeta>> held;
  Messenger::Handlers sh;
  sh.on_request = [&](ConnId c, Frame&& f) {
    if (f.meta.user_cmd() == testing::kCmdSilent) {
      held.Set({c, f.meta});
      return;
    }
    server->Reply(c, f.meta, Status::Ok(), std::move(f.payload)).IgnoreError();
  };
  server = std::make_unique<Messenger>(&server_loop, TransportOptions(), std::move(sh));
  REQUIRE(server_loop.Start().ok());
  const Result<int> port = OnLoop(server_loop, [&] { return server->transport().Listen("127.0.0.1", 0); });
  REQUIRE(port.ok());
  Client client;
  const ConnId conn = client.Connect(*port);
  auto spinning = [&client] { return OnLoop(client.loop, [&client] { return client.loop.spinning(); }); };
  // With no poll_spin no window opens.
  REQUIRE(EchoOnce(client, conn, "plain").ok());
  CHECK_FALSE(spinning());
  // The held request goes out with poll_spin off; then it is turned on (a minute, so no
  // window closes on its own while the test looks).
  OneShot<Result<std::string>> held_answer;
  client.loop.Post([&] {
    client.messenger->Call(conn, TestMeta(0, testing::kCmdSilent), Buffer::FromString("held"), 30s,
                           [&](Result<Frame> r) {
                             held_answer.Set(r.ok() ? Result<std::string>(std::string(r->payload->view()))
                                                    : Result<std::string>(r.status()));
                           });
  });
  const std::pair<ConnId, pb::MessageMeta> held_request = held.Get();
  OnLoop(client.loop, [&] { client.messenger->set_poll_spin(60s); });
  // A request in flight beside another opens no window, nor does its answer while the
  // other is still pending.
  OneShot<bool> echoed;
  CHECK_FALSE(OnLoop(client.loop, [&] {
    client.messenger->Call(conn, TestMeta(0), Buffer::FromString("beside"), 10s,
                           [&](Result<Frame> r) { echoed.Set(r.ok()); });
    return client.loop.spinning();
  }));
  CHECK(echoed.Get());
  CHECK_FALSE(spinning());
  // The last answer does.
  OnLoop(server_loop, [&] {
    CHECK(server->Reply(held_request.first, held_request.second, Status::Ok(), Buffer::FromString("released")).ok());
  });
  const Result<std::string> released = held_answer.Get();
  REQUIRE(released.ok());
  CHECK(*released == "released");
  CHECK(spinning());
  // So does a lone request, as it goes out.
  Client lone;
  const ConnId lone_conn = lone.Connect(*port);
  CHECK(OnLoop(lone.loop, [&] {
    lone.messenger->set_poll_spin(60s);
    lone.messenger->Call(lone_conn, TestMeta(0), Buffer::FromString("alone"), 10s, [](Result<Frame>) {});
    return lone.loop.spinning();
  }));
  // Stopped inside their windows, both loops close cleanly.
  REQUIRE(lone.Stop().ok());
  REQUIRE(client.Stop().ok());
  REQUIRE(server_loop.Stop().ok());
  server.reset();
}

TEST_CASE("messenger: all pending requests fail at once with kUnavailable when the peer closes",
          "[comm][net][messenger]") {
  EchoServer server;
  int port = server.Start();
  Client client;
  ConnId conn = client.Connect(port);
  constexpr int kPending = 100;
  std::vector<Status> results;  // client loop thread only
  OneShot<bool> all_failed;
  client.loop.Post([&] {
    for (int i = 0; i < kPending; ++i) {
      client.messenger->Call(conn, TestMeta(0, testing::kCmdSilent), nullptr, std::chrono::seconds(60),
                             [&](Result<Frame> r) {
                               results.push_back(r.status());
                               ++client.failed;
                               if (static_cast<int>(results.size()) == kPending) all_failed.Set(true);
                             });
    }
  });
  // Wait until the server holds every request, then make it hang up.
  ConnId server_side = server.WaitOpened(1);
  for (int spins = 0; server.requests() < kPending; ++spins) {
    REQUIRE(spins < 20000);
    OnLoop(server.loop(), [] {});
  }
  OnLoop(server.loop(), [&] {
    server.messenger().transport().Close(server_side, Status(Code::kCancelled, "test hangs up"));
  });
  REQUIRE(all_failed.Get());
  // Every pending request had failed by the time the close handler ran: at once.
  CHECK(client.failed_before_close.Get() == kPending);
  for (const Status& s : results) {
    CHECK(s.code() == Code::kUnavailable);
    CHECK(s.message().find("connection lost") != std::string::npos);
  }
  CHECK(OnLoop(client.loop, [&] { return client.messenger->pending_requests(); }) == 0);
  REQUIRE(client.Stop().ok());
  REQUIRE(server.Stop().ok());
}

TEST_CASE("tcp client: reconnects after the server restarts on the same port",
          "[comm][net][messenger]") {
  auto server = std::make_unique<EchoServer>(TransportOptions(), "server-1");
  int port = server->Start();
  Client client;
  std::mutex mu;
  std::vector<ConnId> connects;  // guarded by mu
  std::condition_variable cv;
  OneShot<Status> lost;
  std::unique_ptr<TcpClient> tcp;
  OnLoop(client.loop, [&] {
    TcpClient::Callbacks cb;
    cb.on_connected = [&](ConnId c) {
      std::lock_guard<std::mutex> lock(mu);
      connects.push_back(c);
      cv.notify_all();
    };
    cb.on_lost = [&](const Status& why) { lost.Set(why); };
    ConnectOptions opts;
    opts.initial_backoff = std::chrono::milliseconds(10);
    opts.max_backoff = std::chrono::milliseconds(100);
    tcp = std::make_unique<TcpClient>(&client.messenger->transport(), "127.0.0.1", port, opts,
                                      /*reconnect=*/true, std::move(cb));
    tcp->Start();
  });
  auto wait_connects = [&](size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, testing::kWait, [&] { return connects.size() >= n; })) {
      FAIL("client did not (re)connect");
    }
    return connects[n - 1];
  };
  ConnId first = wait_connects(1);
  Result<std::string> r1 = EchoOnce(client, first, "one");
  REQUIRE(r1.ok());
  CHECK(*r1 == "one");

  REQUIRE(server->Stop().ok());
  Status why = lost.Get();
  CHECK(why.code() == Code::kUnavailable);
  server = std::make_unique<EchoServer>(TransportOptions(), "server-2");
  REQUIRE(server->Start(port) == port);

  ConnId second = wait_connects(2);
  CHECK(second != first);
  Result<std::string> r2 = EchoOnce(client, second, "two");
  REQUIRE(r2.ok());
  CHECK(*r2 == "two");
  CHECK(OnLoop(client.loop, [&] { return tcp->conn(); }) == second);
  OnLoop(client.loop, [&] { tcp.reset(); });
  REQUIRE(client.Stop().ok());
  REQUIRE(server->Stop().ok());
}

TEST_CASE("tcp client: a peer that accepts and closes at once is dialed again with backoff - not in a busy loop",
          "[comm][net][messenger]") {
  // A listener (a raw socket on this thread's helper) that closes every connection at
  // accept, as a process at its connection cap does.
  sockaddr_in addr;
  int lfd = testing::ListenOnLoopback(64, &addr);
  REQUIRE(lfd >= 0);
  std::atomic<bool> stop{false};
  std::atomic<int> accepted{0};
  std::thread acceptor([&] {
    while (!stop.load()) {
      pollfd p{lfd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int fd = ::accept(lfd, nullptr, nullptr);
      if (fd < 0) continue;
      ++accepted;
      ::close(fd);
    }
  });
  Client client;
  std::atomic<int> connects{0};
  std::unique_ptr<TcpClient> tcp;
  OnLoop(client.loop, [&] {
    TcpClient::Callbacks cb;
    cb.on_connected = [&](ConnId) { ++connects; };
    ConnectOptions opts;
    opts.initial_backoff = std::chrono::milliseconds(20);
    opts.max_backoff = std::chrono::milliseconds(1000);
    tcp = std::make_unique<TcpClient>(&client.messenger->transport(), "127.0.0.1", ntohs(addr.sin_port), opts,
                                      /*reconnect=*/true, std::move(cb));
    tcp->Start();
  });
  // The client keeps dialing (each dial succeeds, then the link is lost at once) ...
  auto deadline = std::chrono::steady_clock::now() + testing::kWait;
  while (connects.load() < 3) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // ... but with a backoff that doubles: 20 + 40 + ... ms. Within a second, a handful of
  // dials, where redialing at once made thousands.
  const int before = connects.load();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int in_a_second = connects.load() - before;
  OnLoop(client.loop, [&] { tcp.reset(); });
  stop = true;
  acceptor.join();
  ::close(lfd);
  INFO(in_a_second << " connections in a second, " << accepted.load() << " accepted in all");
  CHECK(in_a_second < 50);
  REQUIRE(client.Stop().ok());
}

}  // namespace pscore::comm
