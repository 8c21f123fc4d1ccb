// Malformed or stalled input from raw sockets: the bad connection is closed with its
// reason while a well-behaved connection, opened before, keeps being served.
#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace pscore::comm {
namespace {

using testing::EchoServer;
using testing::EncodeFrame;
using testing::RawEcho;
using testing::RawSocket;
using testing::TestMeta;

struct BadInputCase {
  std::string name;
  std::string bytes;        // sent by the bad peer
  bool vanish;              // the bad peer closes right after sending
  Code want_code;
  std::string want_text;    // must appear in the close reason
};

TransportOptions SmallLimits() {
  TransportOptions o;
  o.limits.max_message_bytes = 1 << 20;
  o.partial_frame_timeout = std::chrono::milliseconds(200);
  return o;
}

void RunBadInput(const BadInputCase& c) {
  INFO("case: " << c.name);
  EchoServer server(SmallLimits());
  int port = server.Start();
  RawSocket good;
  REQUIRE(good.Connect(port));
  REQUIRE(RawEcho(good, 1, "before"));
  ConnId good_id = server.WaitOpened(1);

  RawSocket bad;
  REQUIRE(bad.Connect(port));
  ConnId bad_id = server.WaitOpened(2);
  REQUIRE(bad.SendAll(c.bytes));
  if (c.vanish) bad.Close();
  Status why = server.WaitClosed(bad_id);
  INFO("close reason: " << why);
  CHECK(why.code() == c.want_code);
  CHECK(why.message().find(c.want_text) != std::string::npos);
  if (!c.vanish) CHECK(bad.WaitClosed());  // the server hung up on it

  // The good connection is unaffected.
  CHECK(RawEcho(good, 2, "after"));
  CHECK(RawEcho(good, 3, std::string(100000, 'p')));
  CHECK_FALSE(server.IsClosed(good_id));
  REQUIRE(server.Stop().ok());
}

}  // namespace

TEST_CASE("bad input: wrong magic", "[comm][net][bad_input]") {
  std::string bytes = EncodeFrame(TestMeta(5), "x");
  bytes[0] = 'X';
  RunBadInput({"wrong magic", bytes, false, Code::kProtocol, "bad magic"});
}

TEST_CASE("bad input: meta length over 64 KiB", "[comm][net][bad_input]") {
  RunBadInput({"meta too long", EncodeHeader(FrameHeader{kMagic, (64u << 10) + 1, 0}), false,
               Code::kProtocol, "meta length 65537"});
}

TEST_CASE("bad input: payload over max_message_bytes", "[comm][net][bad_input]") {
  RunBadInput({"payload too long", EncodeHeader(FrameHeader{kMagic, 0, (1u << 20) + 1}), false,
               Code::kProtocol, "payload length 1048577"});
}

TEST_CASE("bad input: unparsable meta", "[comm][net][bad_input]") {
  std::string junk(20, '\xff');
  RunBadInput({"unparsable meta",
               EncodeHeader(FrameHeader{kMagic, static_cast<uint32_t>(junk.size()), 0}) + junk,
               false, Code::kProtocol, "unparsable meta"});
}

TEST_CASE("bad input: a frame cut off by a peer that vanishes", "[comm][net][bad_input]") {
  std::string frame = EncodeFrame(TestMeta(6), std::string(50000, 'c'));
  RunBadInput({"cut off", frame.substr(0, 30000), true, Code::kUnavailable,
               "in the middle of a frame"});
}

TEST_CASE("bad input: half a header then a stall is cut off after the timeout",
          "[comm][net][bad_input]") {
  std::string frame = EncodeFrame(TestMeta(7), "y");
  RunBadInput({"stalled", frame.substr(0, 8), false, Code::kTimeout, "partial frame stalled"});
}

TEST_CASE("bad input: an idle connection between frames is not cut off", "[comm][net][bad_input]") {
  EchoServer server(SmallLimits());
  int port = server.Start();
  RawSocket idle;
  REQUIRE(idle.Connect(port));
  REQUIRE(RawEcho(idle, 1, "a"));
  ConnId id = server.WaitOpened(1);
  // Wait well past the 200 ms partial-frame timeout, measured on the server's loop.
  testing::OneShot<bool> waited;
  testing::OnLoop(server.loop(), [&] {
    server.loop().AddTimer(std::chrono::milliseconds(600), Duration::zero(), [&] { waited.Set(true); });
  });
  REQUIRE(waited.Get());
  CHECK_FALSE(server.IsClosed(id));
  CHECK(RawEcho(idle, 2, "b"));
  REQUIRE(server.Stop().ok());
}

TEST_CASE("bad input: an accepted connection that never sends a frame is closed after the deadline",
          "[comm][net][bad_input]") {
  TransportOptions o = SmallLimits();
  o.first_frame_timeout = std::chrono::milliseconds(200);
  EchoServer server(o);
  int port = server.Start();
  RawSocket good;
  REQUIRE(good.Connect(port));
  REQUIRE(RawEcho(good, 1, "hello"));
  ConnId good_id = server.WaitOpened(1);
  RawSocket silent;
  REQUIRE(silent.Connect(port));
  ConnId silent_id = server.WaitOpened(2);
  Status why = server.WaitClosed(silent_id);
  INFO("close reason: " << why);
  CHECK(why.code() == Code::kTimeout);
  CHECK(why.message().find("no whole frame within 200 ms") != std::string::npos);
  CHECK(silent.WaitClosed());
  // The connection that spoke once stays, however long it is idle afterwards.
  CHECK_FALSE(server.IsClosed(good_id));
  CHECK(RawEcho(good, 2, "still here"));
  TransportStats stats = testing::OnLoop(server.loop(), [&] { return server.messenger().transport().stats(); });
  CHECK(stats.silent_closed == 1);
  CHECK(stats.protocol_errors == 0);
  REQUIRE(server.Stop().ok());
}

TEST_CASE("bad input: a first frame still unfinished at the first-frame deadline is a silent close - not a protocol error",
          "[comm][net][bad_input]") {
  TransportOptions o = SmallLimits();
  o.first_frame_timeout = std::chrono::milliseconds(200);
  o.partial_frame_timeout = std::chrono::seconds(30);  // the frame is not stalled long enough
  EchoServer server(o);
  int port = server.Start();
  RawSocket slow;
  REQUIRE(slow.Connect(port));
  std::string frame = EncodeFrame(TestMeta(8), std::string(1000, 's'));
  REQUIRE(slow.SendAll(frame.substr(0, frame.size() / 2)));
  ConnId id = server.WaitOpened(1);
  Status why = server.WaitClosed(id);
  INFO("close reason: " << why);
  CHECK(why.message().find("no whole frame within 200 ms") != std::string::npos);
  TransportStats stats = testing::OnLoop(server.loop(), [&] { return server.messenger().transport().stats(); });
  CHECK(stats.silent_closed == 1);
  CHECK(stats.protocol_errors == 0);
  REQUIRE(server.Stop().ok());
}

TEST_CASE("bad input: accepted connections over the cap are closed at once", "[comm][net][bad_input]") {
  TransportOptions o = SmallLimits();
  o.max_accepted_connections = 3;
  EchoServer server(o);
  int port = server.Start();
  RawSocket a, b, c, extra;
  REQUIRE(a.Connect(port));
  REQUIRE(b.Connect(port));
  REQUIRE(c.Connect(port));
  REQUIRE(RawEcho(a, 1, "a"));
  REQUIRE(RawEcho(b, 1, "b"));
  REQUIRE(RawEcho(c, 1, "c"));
  REQUIRE(extra.Connect(port));  // the kernel completes the handshake; the server then hangs up
  CHECK(extra.WaitClosed());
  CHECK(RawEcho(a, 2, "a again"));
  TransportStats stats = testing::OnLoop(server.loop(), [&] { return server.messenger().transport().stats(); });
  CHECK(stats.connections_refused == 1);
  // A slot freed by a close is usable again.
  ConnId a_id = server.WaitOpened(1);
  a.Close();
  CHECK(server.WaitClosed(a_id).code() == Code::kUnavailable);
  RawSocket later;
  REQUIRE(later.Connect(port));
  CHECK(RawEcho(later, 1, "later"));
  REQUIRE(server.Stop().ok());
}

TEST_CASE("bad input: headers announcing huge payloads hold a chunk each - past the process cap the connection is closed",
          "[comm][net][bad_input][budget]") {
  TransportOptions o = SmallLimits();
  o.limits.max_message_bytes = uint64_t{256} << 20;
  const uint64_t chunk = FrameDecoder::kPayloadChunk;
  o.max_incomplete_frame_bytes = 4 * chunk;
  EchoServer server(o);
  int port = server.Start();
  RawSocket good;
  REQUIRE(good.Connect(port));
  REQUIRE(RawEcho(good, 1, "before"));
  // Each announces just under 256 MiB and sends 10 bytes of it, then falls silent.
  const std::string meta = TestMeta(9).SerializeAsString();
  const std::string start =
      EncodeHeader(FrameHeader{kMagic, static_cast<uint32_t>(meta.size()), (uint64_t{256} << 20) - 64}) + meta +
      std::string(10, 'z');
  std::vector<RawSocket> attackers(6);
  std::vector<ConnId> ids;
  for (size_t i = 0; i < attackers.size(); ++i) {
    REQUIRE(attackers[i].Connect(port));
    ids.push_back(server.WaitOpened(i + 2));
    REQUIRE(attackers[i].SendAll(start));
    REQUIRE(RawEcho(good, 2 + i, "between"));  // the server has read the attacker's bytes by now
  }
  // Four fit the cap of four chunks; the fifth and sixth are closed with the reason.
  for (size_t i = 4; i < attackers.size(); ++i) {
    Status why = server.WaitClosed(ids[i]);
    INFO("close reason: " << why);
    CHECK(why.code() == Code::kResourceExhausted);
    CHECK(why.message().find("cap " + std::to_string(4 * chunk)) != std::string::npos);
    CHECK(attackers[i].WaitClosed());
  }
  for (size_t i = 0; i < 4; ++i) CHECK_FALSE(server.IsClosed(ids[i]));
  auto [stats, held] = testing::OnLoop(server.loop(), [&] {
    Transport& t = server.messenger().transport();
    return std::make_pair(t.stats(), t.incomplete_frame_bytes());
  });
  CHECK(stats.incomplete_cap_closed == 2);
  CHECK(stats.protocol_errors == 0);
  CHECK(held == 4 * chunk);
  // With two attackers gone, the good connection gets a payload of more than a chunk through.
  attackers[0].Close();
  attackers[1].Close();
  CHECK(server.WaitClosed(ids[0]).code() == Code::kUnavailable);
  CHECK(server.WaitClosed(ids[1]).code() == Code::kUnavailable);
  CHECK(RawEcho(good, 20, std::string(300000, 'p')));
  CHECK_FALSE(server.IsClosed(server.WaitOpened(1)));
  REQUIRE(server.Stop().ok());
}

}  // namespace pscore::comm

namespace pscore::comm {

TEST_CASE("slow readers: a peer over the per-connection queue cap is closed and counted", "[comm][net][bad_input][queue]") {
  TransportOptions o = SmallLimits();
  o.max_queued_write_bytes = 2u << 20;
  EchoServer server(o);
  int port = server.Start();
  RawSocket slow;  // never reads
  REQUIRE(slow.Connect(port));
  ConnId id = server.WaitOpened(1);
  BufferPtr mib = Buffer::Allocate(1u << 20);
  std::memset(mib->data(), 'q', mib->size());
  // All in one loop turn: nothing is flushed in between, so the queue holds every frame.
  auto [sent, stats] = testing::OnLoop(server.loop(), [&] {
    Transport& t = server.messenger().transport();
    std::vector<Status> st;
    for (int i = 0; i < 3; ++i) st.push_back(t.Send(id, TestMeta(static_cast<uint64_t>(i + 1)), mib));
    return std::make_pair(st, t.stats());
  });
  CHECK(sent[0].ok());
  CHECK(sent[1].code() == Code::kResourceExhausted);  // 2 MiB + headers is over the cap
  CHECK(server.WaitClosed(id).code() == Code::kResourceExhausted);
  CHECK(stats.queued_cap_closed == 1);
  CHECK(stats.total_queued_cap_closed == 0);
  CHECK(stats.queued_write_bytes == 0);  // a closed connection's queue no longer counts
  REQUIRE(server.Stop().ok());
}

TEST_CASE("slow readers: past the total queue cap only a peer above its fair share is closed",
          "[comm][net][bad_input][queue]") {
  TransportOptions o = SmallLimits();
  o.max_queued_write_bytes = 64u << 20;
  o.max_total_queued_write_bytes = 4u << 20;  // two connections: a fair share is 2 MiB
  EchoServer server(o);
  int port = server.Start();
  RawSocket a, b;  // neither reads
  REQUIRE(a.Connect(port));
  ConnId a_id = server.WaitOpened(1);
  REQUIRE(b.Connect(port));
  ConnId b_id = server.WaitOpened(2);
  BufferPtr mib = Buffer::Allocate(1u << 20);
  std::memset(mib->data(), 'q', mib->size());
  BufferPtr half = Buffer::Allocate(512u << 10);
  std::memset(half->data(), 'h', half->size());
  struct Seen {
    std::vector<Status> st;
    uint64_t total_before_close = 0, total_after = 0, b_queued = 0;
    TransportStats stats;
  };
  // All in one loop turn: nothing is flushed in between, so the queues hold every frame.
  Seen seen = testing::OnLoop(server.loop(), [&] {
    Transport& t = server.messenger().transport();
    Seen s;
    for (int i = 0; i < 3; ++i) s.st.push_back(t.Send(a_id, TestMeta(1), mib));  // a: 3 MiB
    s.st.push_back(t.Send(b_id, TestMeta(2), half));                             // total 3.5 MiB
    s.st.push_back(t.Send(b_id, TestMeta(3), mib));  // total past 4 MiB, but b holds 1.5 MiB: queued
    s.total_before_close = t.queued_write_bytes();
    s.st.push_back(t.Send(a_id, TestMeta(4), mib));  // a would hold 4 MiB, over its share: closed
    s.total_after = t.queued_write_bytes();
    s.b_queued = t.QueuedBytes(b_id);
    s.stats = t.stats();
    return s;
  });
  for (size_t i = 0; i < 5; ++i) CHECK(seen.st[i].ok());
  CHECK(seen.total_before_close > (4u << 20));
  INFO(seen.st[5]);
  CHECK(seen.st[5].code() == Code::kResourceExhausted);
  CHECK(seen.st[5].message().find("fair share") != std::string::npos);
  CHECK(server.WaitClosed(a_id).code() == Code::kResourceExhausted);
  CHECK(seen.stats.total_queued_cap_closed == 1);
  CHECK(seen.stats.queued_cap_closed == 0);
  CHECK(seen.total_after == seen.b_queued);  // only b's frames are still queued
  CHECK(seen.b_queued > (3u << 19));
  CHECK_FALSE(server.IsClosed(b_id));
  REQUIRE(server.Stop().ok());
}

}  // namespace pscore::comm

namespace pscore::comm {

TEST_CASE("fan-out: a shared payload queued on many connections counts once toward the total, once per connection toward each cap",
          "[comm][net][bad_input][queue]") {
  TransportOptions o = SmallLimits();
  o.max_queued_write_bytes = (5u << 20) / 2;  // 2.5 MiB: two 1 MiB payloads fit, a third does not
  o.max_total_queued_write_bytes = 4u << 20;  // eight copies of 1 MiB would be far over it
  EchoServer server(o);
  int port = server.Start();
  constexpr size_t kPeers = 8;
  std::vector<RawSocket> peers(kPeers);  // none reads
  std::vector<ConnId> ids;
  for (size_t i = 0; i < kPeers; ++i) {
    REQUIRE(peers[i].Connect(port));
    ids.push_back(server.WaitOpened(i + 1));
  }
  auto mib = [](char fill) {
    BufferPtr b = Buffer::Allocate(1u << 20);
    std::memset(b->data(), fill, b->size());
    return b;
  };
  BufferPtr first = mib('a'), second = mib('b'), third = mib('c');
  struct Seen {
    std::vector<Status> st;
    uint64_t total_one = 0, total_two = 0, sum_queued = 0, total_after = 0;
    size_t shared_one = 0, shared_two = 0, shared_after = 0;
    TransportStats stats;
  };
  // All in one loop turn: nothing is flushed in between, so the queues hold every frame.
  Seen seen = testing::OnLoop(server.loop(), [&] {
    Transport& t = server.messenger().transport();
    Seen s;
    for (ConnId id : ids) s.st.push_back(t.Send(id, TestMeta(1), Payload::Shared(first)));
    s.total_one = t.queued_write_bytes();
    s.shared_one = t.shared_payloads_queued();
    for (ConnId id : ids) s.st.push_back(t.Send(id, TestMeta(2), Payload::Shared(second)));
    s.total_two = t.queued_write_bytes();
    s.shared_two = t.shared_payloads_queued();
    for (ConnId id : ids) s.sum_queued += t.QueuedBytes(id);
    // A reader that never reads may not pin more: the third payload is over each one's cap.
    for (ConnId id : ids) s.st.push_back(t.Send(id, TestMeta(3), Payload::Shared(third)));
    s.total_after = t.queued_write_bytes();
    s.shared_after = t.shared_payloads_queued();
    s.stats = t.stats();
    return s;
  });
  const uint64_t frame_overhead = 1024;  // header and meta of one frame, generously
  for (size_t i = 0; i < 2 * kPeers; ++i) CHECK(seen.st[i].ok());
  CHECK(seen.shared_one == 1);
  CHECK(seen.total_one >= (1u << 20));
  CHECK(seen.total_one <= (1u << 20) + kPeers * frame_overhead);
  CHECK(seen.shared_two == 2);
  CHECK(seen.total_two >= (2u << 20));
  CHECK(seen.total_two <= (2u << 20) + 2 * kPeers * frame_overhead);
  CHECK(seen.sum_queued >= kPeers * (2u << 20));  // each connection's own queue holds both
  for (size_t i = 2 * kPeers; i < 3 * kPeers; ++i) CHECK(seen.st[i].code() == Code::kResourceExhausted);
  CHECK(seen.stats.queued_cap_closed == kPeers);
  CHECK(seen.stats.total_queued_cap_closed == 0);
  CHECK(seen.total_after == 0);  // every connection closed: nothing is counted any more
  CHECK(seen.shared_after == 0);
  for (ConnId id : ids) CHECK(server.WaitClosed(id).code() == Code::kResourceExhausted);
  REQUIRE(server.Stop().ok());
}

TEST_CASE("fan-out: a shared payload written to some peers and dropped by others leaves the total at zero",
          "[comm][net][bad_input][queue]") {
  EchoServer server(SmallLimits());
  int port = server.Start();
  RawSocket reader, quitter;
  REQUIRE(reader.Connect(port));
  ConnId reader_id = server.WaitOpened(1);
  REQUIRE(quitter.Connect(port));
  ConnId quitter_id = server.WaitOpened(2);
  BufferPtr payload = Buffer::Allocate(1000u << 10);  // under SmallLimits' max_message_bytes
  std::memset(payload->data(), 's', payload->size());
  auto [total, shared] = testing::OnLoop(server.loop(), [&] {
    Transport& t = server.messenger().transport();
    t.Send(reader_id, TestMeta(1), Payload::Shared(payload)).IgnoreError();
    t.Send(quitter_id, TestMeta(1), Payload::Shared(payload)).IgnoreError();
    return std::make_pair(t.queued_write_bytes(), t.shared_payloads_queued());
  });
  CHECK(total >= payload->size());
  CHECK(total < 2 * payload->size());  // two connections, one payload
  CHECK(shared == 1);
  quitter.Close();
  CHECK(server.WaitClosed(quitter_id).code() != Code::kOk);
  // The reader takes the whole frame: its write completes and the last hold goes.
  pb::MessageMeta meta;
  std::string got;
  REQUIRE(reader.RecvFrame(&meta, &got));
  CHECK(got == payload->view());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::pair<uint64_t, size_t> now{1, 1};
  while (std::chrono::steady_clock::now() < deadline) {
    now = testing::OnLoop(server.loop(), [&] {
      Transport& t = server.messenger().transport();
      return std::make_pair(t.queued_write_bytes(), t.shared_payloads_queued());
    });
    if (now.first == 0 && now.second == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(now.first == 0);
  CHECK(now.second == 0);
  REQUIRE(server.Stop().ok());
}

}  // namespace pscore::comm
