// TLS under the transport: sessions driven in memory (the refusal messages of both sides),
// then over loopback: frames and large payloads inside TLS, identities, the token inside
// TLS, and each failure (plaintext peer, wrong CA, expired and not-yet-valid certificates,
// a stalled handshake) closing only its own connection.
#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include <algorithm>
#include <string>
#include <vector>

#include "pscore/comm/frame_decoder.h"
#include "pscore/comm/http_server.h"
#include "pscore/comm/tls.h"
#include "pscore/comm/transport.h"
#include "comm/tls_pki.h"

namespace pscore::comm {
namespace {

using testing::EncodeFrame;
using testing::OneShot;
using testing::OnLoop;
using testing::RawSocket;
using testing::TestMeta;
using testing::TestPki;

// Shuttles ciphertext between two sessions until neither has anything to say. Returns the
// first handshake error of (client, server).
std::pair<Status, Status> Pump(TlsSession& client, TlsSession& server) {
  Status cs = client.Handshake();
  Status ss;
  for (int round = 0; round < 10; ++round) {
    std::string bytes;
    client.TakeCipher(&bytes);
    if (!bytes.empty()) {
      server.Feed(bytes.data(), bytes.size());
      if (ss.ok()) ss = server.Handshake();
    }
    bytes.clear();
    server.TakeCipher(&bytes);
    if (!bytes.empty()) {
      client.Feed(bytes.data(), bytes.size());
      if (cs.ok()) cs = client.Handshake();
      // A refusal of the client's certificate reaches it after its own handshake is done.
      if (cs.ok() && client.established()) {
        char sink[64];
        Result<size_t> r = client.Read(sink, sizeof(sink));
        if (!r.ok()) cs = r.status();
      }
    }
    if (client.pending_cipher() == 0 && server.pending_cipher() == 0) break;
  }
  return {cs, ss};
}

bool Contains(const Status& st, const std::string& text) { return st.message().find(text) != std::string::npos; }

// A Transport on its own loop; received frames go to the test thread.
struct Peer {
  EventLoop loop;
  std::unique_ptr<Transport> transport;
  std::mutex mu;
  std::vector<std::pair<ConnId, Frame>> frames;  // guarded by mu
  std::condition_variable cv;

  Peer(std::string name, TransportOptions options) : loop(name) {
    Transport::Handlers h;
    h.on_frame = [this](ConnId id, Frame&& f) {
      std::lock_guard<std::mutex> lock(mu);
      frames.emplace_back(id, std::move(f));
      cv.notify_all();
    };
    transport = std::make_unique<Transport>(&loop, options, std::move(h));
    REQUIRE(loop.Start().ok());
  }
  ~Peer() {
    loop.Stop().IgnoreError();
    transport.reset();
  }
  int Listen() {
    Result<int> port = OnLoop(loop, [&] { return transport->Listen("127.0.0.1", 0); });
    REQUIRE(port.ok());
    return *port;
  }
  Result<ConnId> Connect(int port, Duration timeout = std::chrono::seconds(10)) {
    auto out = std::make_shared<OneShot<Result<ConnId>>>();
    ConnectOptions opts;
    opts.timeout = timeout;
    loop.Post([this, port, opts, out] {
      transport->Connect("127.0.0.1", port, opts, [out](Result<ConnId> r) { out->Set(std::move(r)); });
    });
    return out->Get();
  }
  std::pair<ConnId, Frame> WaitFrame(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, testing::kWait, [&] { return frames.size() >= n; })) FAIL("frame #" << n << " never arrived");
    return std::move(frames[n - 1]);
  }
  size_t frame_count() {
    std::lock_guard<std::mutex> lock(mu);
    return frames.size();
  }
  // The status `id` closes with (waits with a deadline).
  Status WaitClosed(ConnId id) {
    auto out = std::make_shared<OneShot<Status>>();
    loop.Post([this, id, out] { transport->WatchClose(id, [out](const Status& why) { out->Set(why); }); });
    return out->Get();
  }
  TransportStats stats() {
    return OnLoop(loop, [&] { return transport->stats(); });
  }
};

TransportOptions WithTls(std::shared_ptr<TlsContext> tls) {
  TransportOptions o;
  o.tls = std::move(tls);
  return o;
}

// A connection from `client` that the server is expected to refuse: the dial fails, or it
// is closed right after (TLS 1.3 tells a client its certificate was refused only after
// the client's side of the handshake is done).
void ExpectRefused(Peer& client, int port) {
  Result<ConnId> c = client.Connect(port, std::chrono::seconds(2));
  if (c.ok()) {
    Status why = client.WaitClosed(*c);
    CHECK_FALSE(why.ok());
  }
}

// The server still serves a good client afterwards: a frame goes through.
void ExpectServes(Peer& server, int port, std::shared_ptr<TlsContext> good) {
  const size_t before = server.frame_count();
  Peer client("good-client", WithTls(std::move(good)));
  Result<ConnId> c = client.Connect(port);
  REQUIRE(c.ok());
  OnLoop(client.loop, [&] { REQUIRE(client.transport->Send(*c, TestMeta(77), Buffer::FromString("ok")).ok()); });
  auto [id, f] = server.WaitFrame(before + 1);
  CHECK(f.meta.request_id() == 77);
}

// After ciphertext reached `s`: the handshake moves on, or the plaintext is read into *plain
// (through a buffer smaller than a record, so a record is read in several calls).
Status Step(TlsSession& s, std::string* plain) {
  if (!s.established()) {
    Status st = s.Handshake();
    if (!st.ok() || !s.established()) return st;
  }
  char buf[5000];
  for (;;) {
    Result<size_t> r = s.Read(buf, sizeof(buf));
    if (!r.ok()) return r.status();
    if (*r == 0) return Status::Ok();
    plain->append(buf, *r);
  }
}

// Hands `bytes` to `to` in pieces whose sizes cycle through `steps`, two of three lent (read
// in place) and the third fed (copied). A lent piece's buffer is scribbled over once its
// guard is gone, so a byte OpenSSL had not read by then must have been kept. Steps after
// every piece; returns the first error.
Status Deliver(TlsSession& to, const std::string& bytes, const std::vector<size_t>& steps, std::string* plain) {
  std::string scratch;
  size_t at = 0;
  for (size_t i = 0; at < bytes.size(); ++i) {
    const size_t n = std::min(steps[i % steps.size()], bytes.size() - at);
    scratch.assign(bytes, at, n);
    Status st;
    if (i % 3 == 2) {
      to.Feed(scratch.data(), n);
      st = Step(to, plain);
    } else {
      TlsSession::Lent lent = to.Lend(scratch.data(), n);
      st = Step(to, plain);
    }
    std::fill(scratch.begin(), scratch.end(), '\xAA');
    if (!st.ok()) return st;
    at += n;
  }
  return Status::Ok();
}

std::string Pattern(size_t n, uint32_t seed) {
  std::string out(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    out[i] = static_cast<char>(x >> 24);
  }
  return out;
}

}  // namespace

TEST_CASE("tls: ciphertext lent in place or fed, in pieces cut anywhere in its records, decrypts whole",
          "[comm][tls]") {
  TestPki pki;
  const std::vector<size_t> steps = GENERATE(std::vector<size_t>{1}, std::vector<size_t>{5, 16406, 3, 16389},
                                             std::vector<size_t>{12289, 17}, std::vector<size_t>{65536});
  CAPTURE(steps);
  TlsSession client(pki.Context("w0", "worker-0"), /*server=*/false);
  TlsSession server(pki.Context("sched", "scheduler"), /*server=*/true);
  std::string at_client, at_server;
  REQUIRE(client.Handshake().ok());
  for (int round = 0; round < 10; ++round) {
    std::string bytes;
    client.TakeCipher(&bytes);
    REQUIRE(Deliver(server, bytes, steps, &at_server).ok());
    bytes.clear();
    server.TakeCipher(&bytes);
    REQUIRE(Deliver(client, bytes, steps, &at_client).ok());
    if (client.established() && server.established() && client.pending_cipher() == 0 &&
        server.pending_cipher() == 0) {
      break;
    }
  }
  REQUIRE(client.established());
  REQUIRE(server.established());
  // Writes ending records at awkward places: 1 byte, a full record, one byte more, and a
  // large run (smaller when it goes a byte at a time).
  const size_t large = steps.front() == 1 ? 70001 : (1u << 20) + 7;
  std::string sent;
  for (size_t n : {size_t{1}, size_t{16384}, size_t{16385}, size_t{40000}, large}) {
    std::string piece = Pattern(n, static_cast<uint32_t>(n));
    REQUIRE(client.Write(piece.data(), piece.size()).ok());
    sent += piece;
  }
  std::string cipher;
  client.TakeCipher(&cipher);
  REQUIRE(Deliver(server, cipher, steps, &at_server).ok());
  CHECK(at_server.size() == sent.size());
  CHECK(at_server == sent);
  // And back, while the server still holds nothing unread.
  std::string back = Pattern(50000, 7);
  REQUIRE(server.Write(back.data(), back.size()).ok());
  cipher.clear();
  server.TakeCipher(&cipher);
  REQUIRE(Deliver(client, cipher, steps, &at_client).ok());
  CHECK(at_client == back);
}

TEST_CASE("tls: sessions in memory handshake and carry data both ways and name their peers", "[comm][tls]") {
  TestPki pki;
  auto sched = pki.Context("sched", "scheduler");
  auto node = pki.Context("w0", "worker-0");
  CHECK(sched->identity() == "scheduler");
  CHECK(sched->SecondsToExpiry() > 29L * 86400);
  TlsSession client(node, /*server=*/false);
  TlsSession server(sched, /*server=*/true);
  auto [cs, ss] = Pump(client, server);
  REQUIRE(cs.ok());
  REQUIRE(ss.ok());
  REQUIRE(client.established());
  REQUIRE(server.established());
  CHECK(client.peer_identity() == "scheduler");
  CHECK(server.peer_identity() == "worker-0");
  std::string big(3 << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 4093) big[i] = static_cast<char>(i);
  REQUIRE(client.Write(big.data(), big.size()).ok());
  std::string cipher;
  client.TakeCipher(&cipher);
  CHECK(cipher.size() > big.size());
  server.Feed(cipher.data(), cipher.size());
  std::string got(big.size(), '\0');
  size_t at = 0;
  while (at < got.size()) {
    Result<size_t> r = server.Read(&got[at], got.size() - at);
    REQUIRE(r.ok());
    REQUIRE(*r > 0);
    at += *r;
  }
  CHECK(got == big);
}

TEST_CASE("tls: sessions in memory refuse a wrong CA and expired or not-yet-valid certificates and plaintext",
          "[comm][tls]") {
  TestPki pki;
  TestPki other("other-ca");
  auto sched = pki.Context("sched", "scheduler");
  SECTION("a client certificate from another CA") {
    TlsFiles files = other.Issue("w0", "worker-0");
    files.ca = pki.ca_file();  // it trusts the right CA; its own certificate is foreign
    auto bad = TlsContext::Load(files);
    REQUIRE(bad.ok());
    TlsSession client(*bad, false), server(sched, true);
    auto [cs, ss] = Pump(client, server);
    INFO("client: " << cs << " server: " << ss);
    CHECK(Contains(ss, "peer certificate (CN=worker-0) rejected: unable to get local issuer certificate"));
    CHECK(Contains(cs, "alert: tlsv1 alert unknown ca"));
  }
  SECTION("a server certificate from another CA") {
    auto node = pki.Context("w0", "worker-0");
    auto bad_sched = other.Context("s", "scheduler");
    TlsSession client(node, false), server(bad_sched, true);
    auto [cs, ss] = Pump(client, server);
    CHECK(Contains(cs, "rejected"));
    CHECK(Contains(ss, "alert"));
  }
  SECTION("an expired client certificate") {
    auto files = pki.Issue("old", "worker-0", -7200, -3600);
    auto bad = TlsContext::Load(files);  // loads (with an error line): the peer refuses it
    REQUIRE(bad.ok());
    CHECK((*bad)->SecondsToExpiry() < 0);
    TlsSession client(*bad, false), server(sched, true);
    auto [cs, ss] = Pump(client, server);
    CHECK(Contains(ss, "certificate has expired"));
    CHECK(Contains(cs, "certificate expired"));
  }
  SECTION("a client certificate not yet valid") {
    auto bad = TlsContext::Load(pki.Issue("new", "worker-0", 3600, 7200));
    REQUIRE(bad.ok());
    TlsSession client(*bad, false), server(sched, true);
    auto [cs, ss] = Pump(client, server);
    CHECK(Contains(ss, "certificate is not yet valid"));
    CHECK(Contains(cs, "alert"));
  }
  SECTION("plaintext bytes to a TLS server") {
    TlsSession server(sched, true);
    std::string frame = "PSC1 and then some more plaintext bytes of a frame";
    server.Feed(frame.data(), frame.size());
    Status ss = server.Handshake();
    CHECK(Contains(ss, "not speaking TLS"));
  }
  SECTION("a certificate and key that do not match, and a missing file, fail to load") {
    TlsFiles a = pki.Issue("a", "a");
    TlsFiles b = pki.Issue("b", "b");
    a.key = b.key;
    CHECK(Contains(TlsContext::Load(a).status(), "does not match"));
    a.cert = pki.dir() + "/missing.crt";
    CHECK_FALSE(TlsContext::Load(a).ok());
    CHECK(Contains(TlsContext::Load(TlsFiles{"x", "", ""}).status(), "--tls_cert, --tls_key and --tls_ca"));
  }
}

TEST_CASE("tls: frames and a 64 MiB payload and the token handshake run inside TLS and each side knows the other's name",
          "[comm][net][tls]") {
  TestPki pki;
  TransportOptions so = WithTls(pki.Context("sched", "scheduler"));
  TransportOptions co = WithTls(pki.Context("w0", "worker-0"));
  const bool token = GENERATE(false, true);
  if (token) so.auth_token = co.auth_token = "secret";
  Peer server("server", so);
  Peer client("client", co);
  Result<ConnId> c = client.Connect(server.Listen());
  REQUIRE(c.ok());
  CHECK(OnLoop(client.loop, [&] { return client.transport->PeerIdentity(*c); }) == "scheduler");
  std::string big(64 << 20, '\0');
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>(i / 4096);
  OnLoop(client.loop, [&] {
    REQUIRE(client.transport->Send(*c, TestMeta(1), Buffer::FromString("ping")).ok());
    REQUIRE(client.transport->Send(*c, TestMeta(2), nullptr).ok());
    REQUIRE(client.transport->Send(*c, TestMeta(3), Buffer::FromString(big)).ok());
  });
  auto [id1, f1] = server.WaitFrame(1);
  auto [id2, f2] = server.WaitFrame(2);
  auto [id3, f3] = server.WaitFrame(3);
  CHECK(f1.payload->view() == "ping");
  CHECK(f2.payload == nullptr);
  REQUIRE(f3.payload != nullptr);
  CHECK(f3.payload->view() == big);
  CHECK(OnLoop(server.loop, [&, id = id1] { return server.transport->PeerIdentity(id); }) == "worker-0");
  // And back.
  OnLoop(server.loop, [&, id = id1] { REQUIRE(server.transport->Send(id, TestMeta(9), Buffer::FromString("pong")).ok()); });
  auto [cid, back] = client.WaitFrame(1);
  CHECK(back.payload->view() == "pong");
  CHECK(server.stats().tls_handshakes == 1);
  CHECK(client.stats().tls_handshakes == 1);
}

TEST_CASE("tls: a plaintext peer on a TLS port and a TLS peer on a plaintext port are closed and the port serves on",
          "[comm][net][tls]") {
  TestPki pki;
  auto client_tls = pki.Context("w0", "worker-0");
  Peer server("server", WithTls(pki.Context("sched", "scheduler")));
  const int port = server.Listen();
  {
    Peer plain("plain", TransportOptions());
    Result<ConnId> c = plain.Connect(port);
    REQUIRE(c.ok());  // plaintext has no handshake of its own
    OnLoop(plain.loop, [&] { plain.transport->Send(*c, TestMeta(1), Buffer::FromString("hi")).IgnoreError(); });
    CHECK_FALSE(plain.WaitClosed(*c).ok());
  }
  CHECK(server.frame_count() == 0);
  CHECK(server.stats().tls_failures == 1);
  ExpectServes(server, port, client_tls);

  Peer plain_server("plain-server", TransportOptions());
  const int plain_port = plain_server.Listen();
  Peer tls_client("tls-client", WithTls(client_tls));
  CHECK_FALSE(tls_client.Connect(plain_port, std::chrono::milliseconds(500)).ok());
  CHECK(plain_server.frame_count() == 0);
}

TEST_CASE("tls: a wrong CA and expired or not-yet-valid certificates are refused and the port serves on",
          "[comm][net][tls]") {
  TestPki pki;
  TestPki other("other-ca");
  Peer server("server", WithTls(pki.Context("sched", "scheduler")));
  const int port = server.Listen();
  {
    TlsFiles files = other.Issue("w0", "worker-0");
    files.ca = pki.ca_file();
    Peer bad("wrong-ca", WithTls(*TlsContext::Load(files)));
    ExpectRefused(bad, port);
  }
  {
    Peer bad("expired", WithTls(*TlsContext::Load(pki.Issue("old", "worker-0", -7200, -60))));
    ExpectRefused(bad, port);
  }
  {
    Peer bad("future", WithTls(*TlsContext::Load(pki.Issue("new", "worker-0", 3600, 7200))));
    ExpectRefused(bad, port);
  }
  CHECK(server.frame_count() == 0);
  CHECK(server.stats().tls_failures >= 3);
  ExpectServes(server, port, pki.Context("w1", "worker-1"));
  // The other way: the client refuses a server whose certificate the CA did not sign.
  Peer rogue("rogue-server", WithTls(other.Context("s", "scheduler")));
  Peer client("client", WithTls(pki.Context("w2", "worker-2")));
  Result<ConnId> c = client.Connect(rogue.Listen(), std::chrono::seconds(2));
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == Code::kPermissionDenied);
  CHECK(Contains(c.status(), "rejected"));
}

TEST_CASE("tls: a handshake that stalls is closed at its deadline on either side", "[comm][net][tls]") {
  TestPki pki;
  TransportOptions so = WithTls(pki.Context("sched", "scheduler"));
  so.tls_handshake_timeout = std::chrono::milliseconds(300);
  Peer server("server", so);
  const int port = server.Listen();
  RawSocket silent;
  REQUIRE(silent.Connect(port));
  CHECK(silent.WaitClosed());  // it said nothing; the server gave up
  CHECK(server.stats().tls_failures == 1);
  ExpectServes(server, port, pki.Context("w0", "worker-0"));

  // A dialler whose server never answers the ClientHello.
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(lfd, 4) == 0);
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  TransportOptions co = WithTls(pki.Context("w1", "worker-1"));
  co.tls_handshake_timeout = std::chrono::milliseconds(300);
  Peer client("client", co);
  Result<ConnId> c = client.Connect(ntohs(addr.sin_port), std::chrono::seconds(5));
  CHECK_FALSE(c.ok());
  CHECK(Contains(c.status(), "TLS handshake not finished"));
  ::close(lfd);
}

}  // namespace pscore::comm

namespace pscore::comm {

TEST_CASE("tls: an HTTPS port closes a plaintext request and a handshake that stalls",
          "[comm][net][tls]") {
  TestPki pki;
  HttpServerOptions o;
  o.tls = pki.Context("sched", "scheduler");
  o.request_timeout = std::chrono::milliseconds(300);
  EventLoop loop("https");
  REQUIRE(loop.Start().ok());
  std::unique_ptr<HttpServer> server;
  Result<int> port = OnLoop(loop, [&] {
    server = std::make_unique<HttpServer>(&loop, o, [&](HttpConnId id, HttpRequest&&) {
      server->Respond(id, 200, "text/plain", "never reached").IgnoreError();
    });
    return server->Listen("127.0.0.1", 0);
  });
  REQUIRE(port.ok());
  {
    RawSocket plain;
    REQUIRE(plain.Connect(*port));
    REQUIRE(plain.SendAll("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
    CHECK(plain.WaitClosed());
  }
  {
    RawSocket silent;
    REQUIRE(silent.Connect(*port));
    CHECK(silent.WaitClosed());  // no ClientHello within the request timeout
  }
  CHECK(OnLoop(loop, [&] { return server->stats().requests; }) == 0u);
  CHECK(OnLoop(loop, [&] { return server->stats().bad_requests; }) >= 1u);
  OnLoop(loop, [&] { server.reset(); });
  REQUIRE(loop.Stop().ok());
}

TEST_CASE("tls: a peer sending its ciphertext a byte at a time or in odd pieces, and frames of every size both ways, "
          "arrive whole",
          "[comm][net][tls]") {
  TestPki pki;
  Peer server("server", WithTls(pki.Context("sched", "scheduler")));
  RawSocket sock;
  REQUIRE(sock.Connect(server.Listen()));
  TlsSession client(pki.Context("w0", "worker-0"), /*server=*/false);
  // Our ciphertext goes out in pieces whose sizes cycle through `steps`.
  auto send = [&](const std::vector<size_t>& steps) {
    std::string bytes;
    client.TakeCipher(&bytes);
    size_t at = 0;
    for (size_t i = 0; at < bytes.size(); ++i) {
      const size_t n = std::min(steps[i % steps.size()], bytes.size() - at);
      REQUIRE(sock.SendAll(std::string_view(bytes.data() + at, n)));
      at += n;
    }
  };
  const auto deadline = std::chrono::steady_clock::now() + testing::kWait;
  char buf[4096];
  REQUIRE(client.Handshake().ok());
  send({1});
  while (!client.established()) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    const ssize_t r = ::recv(sock.fd(), buf, sizeof(buf), 0);
    REQUIRE(r > 0);
    client.Feed(buf, static_cast<size_t>(r));
    REQUIRE(client.Handshake().ok());
  }
  send({1});  // our certificate and Finished
  std::string first = EncodeFrame(TestMeta(1), "hello");
  REQUIRE(client.Write(first.data(), first.size()).ok());
  send({1});
  const std::string big = Pattern((1u << 20) + 13, 2);
  std::string more = EncodeFrame(TestMeta(2), big) + EncodeFrame(TestMeta(3), "");
  REQUIRE(client.Write(more.data(), more.size()).ok());
  send({7, 16390, 1, 5000});
  auto [id, f1] = server.WaitFrame(1);
  CHECK(f1.payload->view() == "hello");
  auto [id2, f2] = server.WaitFrame(2);
  REQUIRE(f2.payload != nullptr);
  CHECK(f2.payload->view() == big);
  auto [id3, f3] = server.WaitFrame(3);
  CHECK(f3.meta.request_id() == 3);
  CHECK(OnLoop(server.loop, [&, c = id] { return server.transport->PeerIdentity(c); }) == "worker-0");

  // Back, queued in one go: payloads around the inline, gathering, record and chunk sizes,
  // and one of a head and tail slices (sent from where they are).
  const std::vector<size_t> sizes = {0, 1, 511, 512, 513, 2047, 2048, 2049, 16383, 16384, 16385, 300000, (1u << 20) + 3};
  std::vector<std::string> expect;
  OnLoop(server.loop, [&, c = id] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      expect.push_back(Pattern(sizes[i], static_cast<uint32_t>(100 + i)));
      REQUIRE(server.transport->Send(c, TestMeta(100 + i), Buffer::FromString(expect.back())).ok());
    }
    auto tail = std::make_shared<std::string>(Pattern(70000, 9));
    Payload p(Buffer::FromString("head-"));
    p.tail.push_back(Slice{tail, tail->data(), 30000});
    p.tail.push_back(Slice{tail, tail->data() + 30000, tail->size() - 30000});
    expect.push_back("head-" + *tail);
    REQUIRE(server.transport->Send(c, TestMeta(100 + sizes.size()), std::move(p)).ok());
  });
  FrameDecoder decoder(TransportOptions().limits);
  std::vector<Frame> frames;
  while (frames.size() < expect.size()) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    const ssize_t r = ::recv(sock.fd(), buf, sizeof(buf), 0);
    REQUIRE(r > 0);
    std::string plain;
    REQUIRE(Deliver(client, std::string(buf, static_cast<size_t>(r)), {static_cast<size_t>(r)}, &plain).ok());
    REQUIRE(decoder.Feed(plain, &frames).ok());
  }
  REQUIRE(frames.size() == expect.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    CAPTURE(i);
    CHECK(frames[i].meta.request_id() == 100 + i);
    const std::string got = frames[i].payload ? std::string(frames[i].payload->view()) : std::string();
    CHECK(got.size() == expect[i].size());
    CHECK(got == expect[i]);
  }
  CHECK(server.stats().tls_handshakes == 1);
}

}  // namespace pscore::comm
