// Transport over loopback: listen/connect, large payloads, backpressure, close watching.
#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "pscore/comm/connection.h"
#include "pscore/comm/transport.h"

namespace pscore::comm {
namespace {

using testing::EchoServer;
using testing::OneShot;
using testing::OnLoop;
using testing::RawSocket;
using testing::TestMeta;

// A Transport on its own loop that hands received frames to the test thread.
struct Peer {
  EventLoop loop;
  std::unique_ptr<Transport> transport;
  std::mutex mu;
  std::vector<Frame> frames;  // guarded by mu
  std::condition_variable cv;

  explicit Peer(std::string name, TransportOptions options = TransportOptions()) : loop(name) {
    Transport::Handlers h;
    h.on_frame = [this](ConnId, Frame&& f) {
      std::lock_guard<std::mutex> lock(mu);
      frames.push_back(std::move(f));
      cv.notify_all();
    };
    transport = std::make_unique<Transport>(&loop, options, std::move(h));
    REQUIRE(loop.Start().ok());
  }
  ~Peer() { Stop().IgnoreError(); }
  Status Stop() {
    Status st = loop.Stop();
    transport.reset();
    return st;
  }
  Result<ConnId> Connect(int port, ConnectOptions opts = ConnectOptions()) {
    auto out = std::make_shared<OneShot<Result<ConnId>>>();
    loop.Post([this, port, opts, out] {
      transport->Connect("127.0.0.1", port, opts, [out](Result<ConnId> r) { out->Set(std::move(r)); });
    });
    return out->Get();
  }
  Frame WaitFrame(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, testing::kWait, [&] { return frames.size() >= n; })) {
      FAIL("frame #" << n << " never arrived");
    }
    return std::move(frames[n - 1]);
  }
};

// A Peer connected to a plain socket that the test reads from and closes by hand.
struct ClientAndRaw {
  ClientAndRaw() : client("client") {
    const int port = listener.Start();
    REQUIRE(port > 0);
    Result<ConnId> c = client.Connect(port);
    REQUIRE(c.ok());
    conn = *c;
    REQUIRE(listener.Accept(&raw));
  }
  testing::RawListener listener;
  Peer client;
  ConnId conn{};
  RawSocket raw;
};

// `server` listens on an ephemeral port; `client` connects to it.
Result<ConnId> ListenAndConnect(Peer& server, Peer& client) {
  Result<int> port = OnLoop(server.loop, [&] { return server.transport->Listen("127.0.0.1", 0); });
  if (!port.ok()) return port.status();
  return client.Connect(*port);
}

}  // namespace

TEST_CASE("transport: listen on port 0, connect, send both ways", "[comm][net][transport]") {
  Peer server("server");
  Result<int> port = OnLoop(server.loop, [&] { return server.transport->Listen("127.0.0.1", 0); });
  REQUIRE(port.ok());
  CHECK(*port > 0);
  Peer client("client");
  Result<ConnId> conn = client.Connect(*port);
  REQUIRE(conn.ok());

  OnLoop(client.loop, [&] {
    REQUIRE(client.transport->Send(*conn, TestMeta(1), Buffer::FromString("ping")).ok());
    REQUIRE(client.transport->Send(*conn, TestMeta(2), nullptr).ok());
  });
  Frame f1 = server.WaitFrame(1);
  Frame f2 = server.WaitFrame(2);
  CHECK(f1.meta.request_id() == 1);
  REQUIRE(f1.payload != nullptr);
  CHECK(f1.payload->view() == "ping");
  CHECK(f2.meta.request_id() == 2);
  CHECK(f2.payload == nullptr);
  CHECK(OnLoop(server.loop, [&] { return server.transport->num_connections(); }) == 1u);
  TransportStats cs = OnLoop(client.loop, [&] { return client.transport->stats(); });
  CHECK(cs.frames_out == 2);
  CHECK(cs.connections_opened == 1);
  REQUIRE(client.Stop().ok());
  REQUIRE(server.Stop().ok());
}

TEST_CASE("transport: small and large payloads, buffers and messages, interleaved in one batch arrive intact",
          "[comm][net][transport]") {
  Peer server("server");
  Result<int> port = OnLoop(server.loop, [&] { return server.transport->Listen("127.0.0.1", 0); });
  REQUIRE(port.ok());
  Peer client("client");
  Result<ConnId> conn = client.Connect(*port);
  REQUIRE(conn.ok());
  // Sizes around the inline bound, all queued in one loop iteration (one write batch).
  const std::vector<size_t> sizes = {0, 1, kInlinePayloadBytes - 1, kInlinePayloadBytes, kInlinePayloadBytes + 1,
                                     7, 70000, 3};
  std::vector<std::string> sent;
  OnLoop(client.loop, [&] {
    uint64_t id = 1;
    for (size_t n : sizes) {
      std::string bytes(n, '\0');
      for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>('a' + (i * 7 + n) % 26);
      sent.push_back(bytes);
      REQUIRE(client.transport->Send(*conn, TestMeta(id++), n ? Buffer::FromString(bytes) : nullptr).ok());
      // The same bytes as a protobuf message (a MessageMeta whose error field holds them).
      pb::MessageMeta body;
      body.set_error(bytes);
      sent.push_back(body.SerializeAsString());
      REQUIRE(client.transport->Send(*conn, TestMeta(id++), body).ok());
    }
  });
  for (size_t i = 0; i < sent.size(); ++i) {
    Frame f = server.WaitFrame(i + 1);
    CHECK(f.meta.request_id() == i + 1);
    std::string got = f.payload ? std::string(f.payload->view()) : std::string();
    CHECK(got == sent[i]);
  }
}

TEST_CASE("transport: a payload of a head and tail slices arrives as one run of bytes and frees the slices once written",
          "[comm][net][transport]") {
  Peer server("server");
  Peer client("client");
  Result<ConnId> conn = ListenAndConnect(server, client);
  REQUIRE(conn.ok());
  // Each case: head size, then slice sizes; small totals are copied inline, large ones are
  // written from the slices' own memory.
  const std::vector<std::vector<size_t>> cases = {
      {0, 5},          {3, 4, 0, 9},           {kInlinePayloadBytes - 2, 1, 1}, {kInlinePayloadBytes, 1},
      {16, 300000},    {0, 70000, 5, 200000},  {100, 1, 2, 3, 4, 5, 6, 7},      {64, 1u << 20, 1u << 20},
      std::vector<size_t>(1500, 1000)};  // more slices than one writev takes (IOV_MAX 1024)
  auto released = std::make_shared<std::atomic<int>>(0);
  int slices = 0;
  std::vector<std::string> sent;
  OnLoop(client.loop, [&] {
    uint64_t id = 1;
    for (const auto& c : cases) {
      std::string all;
      Payload p;
      for (size_t j = 0; j < c.size(); ++j) {
        std::string bytes(c[j], '\0');
        for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>('a' + (i * 13 + j + id) % 26);
        all += bytes;
        if (j == 0) {
          p.head = bytes.empty() ? nullptr : Buffer::FromString(bytes);
          continue;
        }
        // The slice's memory lives in a string owned only by the slice.
        auto owned = std::shared_ptr<std::string>(new std::string(std::move(bytes)), [released](std::string* s) {
          released->fetch_add(1);
          delete s;
        });
        p.tail.push_back(Slice{owned, owned->data(), owned->size()});
        ++slices;
      }
      CHECK(p.size() == all.size());
      sent.push_back(all);
      REQUIRE(client.transport->Send(*conn, TestMeta(id++), std::move(p)).ok());
    }
  });
  for (size_t i = 0; i < sent.size(); ++i) {
    Frame f = server.WaitFrame(i + 1);
    CHECK(f.meta.request_id() == i + 1);
    std::string got = f.payload ? std::string(f.payload->view()) : std::string();
    CHECK(got.size() == sent[i].size());
    CHECK(got == sent[i]);
  }
  // Every frame arrived, so every write completed: the transport holds no slice any more.
  const auto deadline = std::chrono::steady_clock::now() + testing::kWait;
  while (released->load() != slices && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(released->load() == slices);
  // Flatten gives the same bytes in one buffer (and the head itself when there is no tail).
  Payload two(Buffer::FromString("ab"));
  CHECK(two.Flatten() == two.head);
  two.tail.push_back(Slice{nullptr, "cd", 2});
  CHECK(two.Flatten()->view() == "abcd");
  CHECK(Payload().Flatten() == nullptr);
  REQUIRE(client.Stop().ok());
  REQUIRE(server.Stop().ok());
}

TEST_CASE("transport: payload parts larger than one iovec takes are written in pieces and arrive intact",
          "[comm][net][transport]") {
  TransportOptions options;
  options.limits.max_message_bytes = 1ull << 30;
  Peer server("server", options);
  Peer client("client", options);
  Result<ConnId> conn = ListenAndConnect(server, client);
  REQUIRE(conn.ok());
  // A head just over kMaxIovBytes and a slice of a few bytes: three iovecs for one frame.
  BufferPtr head = Buffer::Allocate(kMaxIovBytes + 3);
  for (size_t i = 0; i < head->size(); i += 4096) head->data()[i] = static_cast<char>(i >> 12);
  head->data()[head->size() - 1] = 'z';
  static const char kTail[] = "tail!";
  Payload p(head);
  p.tail.push_back(Slice{nullptr, kTail, 5});
  OnLoop(client.loop, [&] { REQUIRE(client.transport->Send(*conn, TestMeta(9), p).ok()); });
  Frame f = server.WaitFrame(1);
  REQUIRE(f.payload != nullptr);
  REQUIRE(f.payload->size() == head->size() + 5);
  CHECK(std::memcmp(f.payload->data(), head->data(), head->size()) == 0);
  CHECK(std::string(f.payload->data() + head->size(), 5) == "tail!");
  REQUIRE(client.Stop().ok());
  REQUIRE(server.Stop().ok());
}

TEST_CASE("transport: a 64 MiB payload arrives intact", "[comm][net][transport]") {
  Peer server("server");
  Peer client("client");
  Result<ConnId> conn = ListenAndConnect(server, client);
  REQUIRE(conn.ok());
  const size_t kSize = 64ull << 20;
  BufferPtr big = Buffer::Allocate(kSize);
  for (size_t i = 0; i < kSize; ++i) big->data()[i] = static_cast<char>((i * 2654435761u) >> 13);
  OnLoop(client.loop, [&] { REQUIRE(client.transport->Send(*conn, TestMeta(7), big).ok()); });
  Frame f = server.WaitFrame(1);
  REQUIRE(f.payload != nullptr);
  CHECK(f.payload->size() == kSize);
  CHECK(f.payload->view() == big->view());
  REQUIRE(client.Stop().ok());
  REQUIRE(server.Stop().ok());
}

TEST_CASE("transport: connect retries until the listener appears, and gives up in time",
          "[comm][net][transport]") {
  // Find a free port, then release it so nothing listens there.
  Peer probe("probe");
  Result<int> free_port = OnLoop(probe.loop, [&] { return probe.transport->Listen("127.0.0.1", 0); });
  REQUIRE(free_port.ok());
  REQUIRE(probe.Stop().ok());

  Peer client("client");
  ConnectOptions quick;
  quick.timeout = std::chrono::milliseconds(200);
  quick.initial_backoff = std::chrono::milliseconds(10);
  Result<ConnId> refused = client.Connect(*free_port, quick);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == Code::kUnavailable);
  CHECK(refused.status().message().find("attempts") != std::string::npos);

  // Dial first, listen a little later: the retry finds it.
  ConnectOptions patient;
  patient.initial_backoff = std::chrono::milliseconds(10);
  patient.max_backoff = std::chrono::milliseconds(50);
  auto result = std::make_shared<OneShot<Result<ConnId>>>();
  client.loop.Post([&, result] {
    client.transport->Connect("127.0.0.1", *free_port, patient,
                              [result](Result<ConnId> r) { result->Set(std::move(r)); });
  });
  Peer server("server");
  OneShot<bool> listening;
  OnLoop(server.loop, [&] {
    server.loop.AddTimer(std::chrono::milliseconds(100), Duration::zero(), [&] {
      listening.Set(server.transport->Listen("127.0.0.1", *free_port).ok());
    });
  });
  REQUIRE(listening.Get());
  Result<ConnId> late = result->Get();
  REQUIRE(late.ok());
  REQUIRE(client.Stop().ok());
  REQUIRE(server.Stop().ok());
}

TEST_CASE("transport: a connect whose SYNs are dropped ends at its deadline - not at the kernel's two minutes",
          "[comm][net][transport]") {
  // A listener with a backlog of 0 that never accepts: once one connection fills its
  // accept queue, the kernel drops every further SYN (as a firewall DROP rule would).
  sockaddr_in addr;
  int lfd = testing::ListenOnLoopback(0, &addr);
  REQUIRE(lfd >= 0);
  std::vector<int> fillers;
  for (int i = 0; i < 4; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    REQUIRE(fd >= 0);
    ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));  // EINPROGRESS, or dropped
    fillers.push_back(fd);
  }
  Peer client("client");
  ConnectOptions opts;
  opts.timeout = std::chrono::milliseconds(1500);
  Result<ConnId> r = client.Connect(ntohs(addr.sin_port), opts);  // OneShot waits 20 s at most
  for (int fd : fillers) ::close(fd);
  ::close(lfd);
  REQUIRE_FALSE(r.ok());
  INFO(r.status().ToString());
  CHECK(r.status().code() == Code::kTimeout);
  CHECK_THAT(r.status().message(), Catch::Contains("no connection within 1500 ms"));
  REQUIRE(client.Stop().ok());
}

TEST_CASE("transport: send to a closed connection fails - WatchClose reports closes",
          "[comm][net][transport]") {
  Peer server("server");
  Peer client("client");
  Result<ConnId> conn = ListenAndConnect(server, client);
  REQUIRE(conn.ok());
  OneShot<Status> watched;
  OnLoop(client.loop, [&] {
    client.transport->WatchClose(*conn, [&](const Status& why) { watched.Set(why); });
    client.transport->Close(*conn, Status(Code::kCancelled, "done here"));
  });
  Status why = watched.Get();
  CHECK(why.code() == Code::kCancelled);
  CHECK(why.message() == "done here");
  Status send = OnLoop(client.loop, [&] { return client.transport->Send(*conn, TestMeta(1), nullptr); });
  CHECK(send.code() == Code::kUnavailable);
  Status late = OnLoop(client.loop, [&] {
    auto st = std::make_shared<Status>();
    client.transport->WatchClose(*conn, [st](const Status& s) { *st = s; });
    return *st;
  });
  CHECK(late.code() == Code::kUnavailable);  // watching a closed connection answers at once
  CHECK_FALSE(OnLoop(client.loop, [&] { return client.transport->IsOpen(*conn); }));
  Result<int> bad = OnLoop(client.loop, [&] { return client.transport->Listen("not-an-ip", 0); });
  CHECK(bad.status().code() == Code::kInvalidArgument);
  REQUIRE(client.Stop().ok());
  REQUIRE(server.Stop().ok());
}

TEST_CASE("transport: writing to a peer that is gone closes the connection with kUnavailable - the process lives on",
          "[comm][net][transport]") {
  struct sigaction current {};
  REQUIRE(::sigaction(SIGPIPE, nullptr, &current) == 0);
  REQUIRE(current.sa_handler == SIG_DFL);  // as in a program that embeds pscore and never thought of it
  ClientAndRaw f;
  Peer& client = f.client;
  RawSocket& gone = f.raw;
  gone.Close();
  OneShot<Status> watched;
  OnLoop(client.loop, [&] { client.transport->WatchClose(f.conn, [&](const Status& why) { watched.Set(why); }); });
  // The first writes may still be taken; a later one meets the peer's reset: EPIPE.
  for (int i = 0; i < 200 && OnLoop(client.loop, [&] { return client.transport->IsOpen(f.conn); }); ++i) {
    OnLoop(client.loop, [&] { return client.transport->Send(f.conn, TestMeta(1), Buffer::Allocate(1 << 20)); }).IgnoreError();  // may fail once closed
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Status why = watched.Get();
  INFO(why);
  CHECK(why.code() == Code::kUnavailable);
  REQUIRE(client.Stop().ok());
}

TEST_CASE("transport: small frames queued in one turn start out once their batch fills - order and bytes intact",
          "[comm][net][transport]") {
  ClientAndRaw f;
  Peer& client = f.client;
  RawSocket& peer = f.raw;
  // 4 KiB frames, a large and an inline one among them, all queued in one loop turn.
  const size_t kFrames = 64;
  auto payload_of = [](uint64_t id) {
    const size_t n = id % 16 == 5 ? 70000 : id % 16 == 9 ? 40 : 4096;
    std::string bytes(n, '\0');
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>('a' + (i * 3 + id) % 26);
    return bytes;
  };
  const bool out_in_turn = OnLoop(client.loop, [&] {
    for (uint64_t id = 1; id <= kFrames; ++id) {
      REQUIRE(client.transport->Send(f.conn, TestMeta(id), Buffer::FromString(payload_of(id))).ok());
    }
    // Still inside the turn that queued them: the first frame is already on the socket.
    pollfd p{peer.fd(), POLLIN, 0};
    return ::poll(&p, 1, 5000) == 1;
  });
  CHECK(out_in_turn);
  for (uint64_t id = 1; id <= kFrames; ++id) {
    pb::MessageMeta meta;
    std::string got;
    REQUIRE(peer.RecvFrame(&meta, &got));
    CHECK(meta.request_id() == id);
    CHECK(got == payload_of(id));
  }
  REQUIRE(client.Stop().ok());
}

TEST_CASE("transport: small frames to a peer gone mid-turn - the close comes on a later turn, never inside Send",
          "[comm][net][transport]") {
  ClientAndRaw f;
  Peer& client = f.client;
  RawSocket& gone = f.raw;
  bool sending = false, closed_while_sending = false;  // loop thread only
  OneShot<Status> watched;
  OnLoop(client.loop, [&] {
    client.transport->WatchClose(f.conn, [&](const Status& why) {
      closed_while_sending = sending;
      watched.Set(why);
    });
    sending = true;
    for (uint64_t id = 1; id <= 64; ++id) {
      // The peer goes away with unread bytes (a reset) after the first batches went out:
      // the batches after it meet the reset while this turn still queues frames.
      if (id == 9) gone.Close();
      Status st = client.transport->Send(f.conn, TestMeta(id), Buffer::Allocate(4096));
      if (!st.ok()) break;
    }
    sending = false;
  });
  Status why = watched.Get();
  INFO(why);
  CHECK(why.code() == Code::kUnavailable);
  CHECK_FALSE(OnLoop(client.loop, [&] { return closed_while_sending; }));
  REQUIRE(client.Stop().ok());
}

TEST_CASE("transport: a peer that never reads is closed with kResourceExhausted",
          "[comm][net][transport][backpressure]") {
  TransportOptions small;
  small.max_queued_write_bytes = 256 << 10;
  EchoServer server(small);
  int port = server.Start();
  RawSocket good;
  REQUIRE(good.Connect(port));
  REQUIRE(testing::RawEcho(good, 1, "hi"));
  ConnId good_id = server.WaitOpened(1);

  RawSocket hog;
  REQUIRE(hog.Connect(port, /*rcvbuf=*/4096));
  ConnId hog_id = server.WaitOpened(2);
  // Send requests whose echoes pile up at the server, and never read any of them.
  std::string frame = testing::EncodeFrame(TestMeta(2), std::string(64 << 10, 'h'));
  int sent = 0;
  while (sent < 4000 && !server.IsClosed(hog_id) && hog.SendAll(frame)) ++sent;
  Status why = server.WaitClosed(hog_id);
  INFO("sent " << sent << " frames; close reason: " << why);
  CHECK(why.code() == Code::kResourceExhausted);
  CHECK(why.message().find("not reading") != std::string::npos);
  // The well-behaved connection is still served.
  CHECK(testing::RawEcho(good, 3, "still here"));
  CHECK_FALSE(server.IsClosed(good_id));
  REQUIRE(server.Stop().ok());
}

}  // namespace pscore::comm
