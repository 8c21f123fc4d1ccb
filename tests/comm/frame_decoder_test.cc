#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/pool_limit_guard.h"
#include "pscore/comm/frame_decoder.h"

namespace pscore::comm {
namespace {

using testing::EncodeFrame;
using testing::TestMeta;

struct Expected {
  pb::MessageMeta meta;
  std::string payload;
};

std::vector<Expected> SampleFrames() {
  std::vector<Expected> frames;
  frames.push_back({TestMeta(1, 7), "hello"});
  frames.push_back({TestMeta(2), ""});               // zero-length payload
  frames.push_back({pb::MessageMeta(), ""});         // empty meta, no payload
  pb::MessageMeta big = TestMeta(3);
  big.set_handler(std::string(3000, 'h'));           // meta only, larger than a read
  frames.push_back({big, ""});
  std::string payload(40000, '\0');                  // over kDirectReadMin
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 31 + 7);
  frames.push_back({TestMeta(4), payload});
  frames.push_back({TestMeta(5), std::string(1, 'x')});
  return frames;
}

std::string Concat(const std::vector<Expected>& frames) {
  std::string s;
  for (const auto& f : frames) s += EncodeFrame(f.meta, f.payload);
  return s;
}

void CheckSame(const std::vector<Frame>& got, const std::vector<Expected>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].meta.SerializeAsString() == want[i].meta.SerializeAsString());
    if (want[i].payload.empty()) {
      CHECK(got[i].payload == nullptr);
    } else {
      REQUIRE(got[i].payload != nullptr);
      CHECK(got[i].payload->view() == want[i].payload);
    }
  }
}

}  // namespace

TEST_CASE("decoder: every split point of a multi-frame stream decodes identically",
          "[comm][decoder]") {
  std::vector<Expected> want = SampleFrames();
  std::string stream = Concat(want);
  for (size_t split = 0; split <= stream.size(); ++split) {
    FrameDecoder d{Limits{}};
    std::vector<Frame> got;
    REQUIRE(d.Feed(std::string_view(stream).substr(0, split), &got).ok());
    REQUIRE(d.Feed(std::string_view(stream).substr(split), &got).ok());
    CheckSame(got, want);
    REQUIRE_FALSE(d.mid_frame());
  }
}

TEST_CASE("decoder: byte-at-a-time and three-way splits decode identically", "[comm][decoder]") {
  std::vector<Expected> want = SampleFrames();
  std::string stream = Concat(want);
  {
    FrameDecoder d{Limits{}};
    std::vector<Frame> got;
    for (char c : stream) REQUIRE(d.Feed(std::string_view(&c, 1), &got).ok());
    CheckSame(got, want);
  }
  for (size_t a = 1; a < stream.size(); a += 997) {
    for (size_t b = a; b < stream.size(); b += 1499) {
      FrameDecoder d{Limits{}};
      std::vector<Frame> got;
      std::string_view s(stream);
      REQUIRE(d.Feed(s.substr(0, a), &got).ok());
      REQUIRE(d.Feed(s.substr(a, b - a), &got).ok());
      REQUIRE(d.Feed(s.substr(b), &got).ok());
      CheckSame(got, want);
    }
  }
}

TEST_CASE("decoder: mid_frame tracks partial input", "[comm][decoder]") {
  FrameDecoder d{Limits{}};
  std::vector<Frame> got;
  std::string f = EncodeFrame(TestMeta(9), "abc");
  CHECK_FALSE(d.mid_frame());
  REQUIRE(d.Feed(f.substr(0, 5), &got).ok());
  CHECK(d.mid_frame());
  REQUIRE(d.Feed(f.substr(5), &got).ok());
  CHECK_FALSE(d.mid_frame());
  CHECK(got.size() == 1);
}

TEST_CASE("decoder: limits are refused with kProtocol naming the sizes", "[comm][decoder]") {
  Limits limits;
  limits.max_message_bytes = 1 << 20;
  std::vector<Frame> got;
  SECTION("meta over 64 KiB") {
    FrameDecoder d(limits);
    Status st = d.Feed(EncodeHeader(FrameHeader{kMagic, (64 << 10) + 1, 0}), &got);
    CHECK(st.code() == Code::kProtocol);
    CHECK(st.message().find("65537") != std::string::npos);
    CHECK(st.message().find("65536") != std::string::npos);
  }
  SECTION("payload over max_message_bytes") {
    FrameDecoder d(limits);
    Status st = d.Feed(EncodeHeader(FrameHeader{kMagic, 0, (1 << 20) + 5}), &got);
    CHECK(st.code() == Code::kProtocol);
    CHECK(st.message().find("1048581") != std::string::npos);
    CHECK(st.message().find("1048576") != std::string::npos);
  }
  SECTION("bad magic after a good frame") {
    FrameDecoder d(limits);
    std::string s = EncodeFrame(TestMeta(1), "ok") + "XXXXxxxxxxxxxxxx";
    Status st = d.Feed(s, &got);
    CHECK(st.code() == Code::kProtocol);
    CHECK(st.message().find("magic") != std::string::npos);
    CHECK(got.size() == 1);  // the valid frame before the garbage was decoded
  }
  SECTION("unparsable meta") {
    FrameDecoder d(limits);
    std::string junk(12, '\xff');
    std::string s = EncodeHeader(FrameHeader{kMagic, static_cast<uint32_t>(junk.size()), 0}) + junk;
    Status st = d.Feed(s, &got);
    CHECK(st.code() == Code::kProtocol);
    CHECK(st.message().find("unparsable meta") != std::string::npos);
    CHECK(got.empty());
  }
}

TEST_CASE("decoder: 64 MiB payload is read straight into its buffer", "[comm][decoder]") {
  const size_t kSize = 64ull << 20;
  std::string payload(kSize, '\0');
  for (size_t i = 0; i < kSize; i += 4096) payload[i] = static_cast<char>(i / 4096);
  payload[kSize - 1] = 'z';
  std::string stream = EncodeFrame(TestMeta(42), payload) + EncodeFrame(TestMeta(43), "tail");

  FrameDecoder d{Limits{}};
  std::vector<Frame> got;
  // Emulate a socket: fill each region handed out with at most 256 KiB per read.
  size_t pos = 0;
  while (pos < stream.size()) {
    size_t room = 0;
    char* region = d.ReadRegion(&room);
    REQUIRE(room > 0);
    size_t n = std::min({room, stream.size() - pos, size_t{256} << 10});
    std::memcpy(region, stream.data() + pos, n);
    pos += n;
    REQUIRE(d.Commit(n, &got).ok());
  }
  REQUIRE(got.size() == 2);
  REQUIRE(got[0].payload != nullptr);
  CHECK(got[0].meta.request_id() == 42);
  CHECK(got[0].payload->size() == kSize);
  CHECK(got[0].payload->view() == payload);
  CHECK(got[1].payload->view() == "tail");
  // Only the bytes that shared a read with the header went through the input buffer.
  INFO("copied " << d.copied_payload_bytes());
  CHECK(d.copied_payload_bytes() < (256u << 10) + 16);
}

TEST_CASE("decoder: right after a large frame a read brings little of the next - its payload is read in place",
          "[comm][decoder]") {
  // Big reads have grown the input buffer; a read filling it at a frame boundary would
  // bring up to that much of the next frame's payload, to be copied out of the buffer.
  const std::string payload(1 << 20, 'p');
  std::string stream;
  for (int i = 0; i < 4; ++i) stream += EncodeFrame(TestMeta(i + 1), payload);
  stream += EncodeFrame(TestMeta(9), "small") + EncodeFrame(TestMeta(10), payload);
  FrameDecoder d{Limits{}};
  std::vector<Frame> got;
  std::vector<size_t> boundary_rooms;  // room offered with nothing of a frame buffered
  size_t pos = 0;
  while (pos < stream.size()) {
    const bool boundary = !d.mid_frame();
    size_t room = 0;
    char* region = d.ReadRegion(&room);
    if (boundary) boundary_rooms.push_back(room);
    size_t n = std::min(room, stream.size() - pos);  // a socket with everything ready
    std::memcpy(region, stream.data() + pos, n);
    pos += n;
    REQUIRE(d.Commit(n, &got).ok());
  }
  REQUIRE(got.size() == 6);
  for (size_t i : {0, 1, 2, 3, 5}) CHECK(got[i].payload->view() == payload);
  CHECK(got[4].payload->view() == "small");
  // First read: the whole (4 KiB) buffer; after each large frame at most 4 KiB. The small
  // frame came in the same read as the end of the frame before it.
  REQUIRE(boundary_rooms.size() == 5);
  for (size_t room : boundary_rooms) CHECK(room <= 4096);
  // So each large payload went through the buffer by at most one small read's worth.
  INFO("copied " << d.copied_payload_bytes());
  CHECK(d.copied_payload_bytes() <= 5 * 4096);
}

TEST_CASE("decoder: a read of zero bytes changes nothing", "[comm][decoder]") {
  FrameDecoder d{Limits{}};
  std::vector<Frame> got;
  size_t room = 0;
  d.ReadRegion(&room);
  REQUIRE(d.Commit(0, &got).ok());
  CHECK(got.empty());
  CHECK_FALSE(d.mid_frame());
  REQUIRE(d.Feed(EncodeFrame(TestMeta(1), "a"), &got).ok());
  CHECK(got.size() == 1);
}

namespace {

// A frame whose meta names a payload head of `head` bytes.
pb::MessageMeta SplitMeta(uint64_t request_id, uint64_t head) {
  pb::MessageMeta m = TestMeta(request_id);
  m.set_is_response(true);
  m.set_payload_head(head);
  return m;
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 13 + seed);
  return s;
}

// Feeds `stream` as a socket would, at most `chunk` bytes per read; as a connection does,
// the frames of each Commit (or Resume, while the decoder is paused) are delivered to
// *got before the decoder goes on.
Status FeedChunked(FrameDecoder* d, std::string_view stream, size_t chunk, std::vector<Frame>* got) {
  std::vector<Frame> out;
  auto deliver = [&] {
    for (Frame& f : out) got->push_back(std::move(f));
    out.clear();
  };
  while (!stream.empty()) {
    size_t room = 0;
    char* region = d->ReadRegion(&room);
    size_t n = std::min({room, stream.size(), chunk});
    std::memcpy(region, stream.data(), n);
    stream.remove_prefix(n);
    PSCORE_RETURN_IF_ERROR(d->Commit(n, &out));
    deliver();
    while (d->paused()) {
      PSCORE_RETURN_IF_ERROR(d->Resume(&out));
      deliver();
    }
  }
  return Status::Ok();
}

}  // namespace

TEST_CASE("decoder: a payload's tail goes to the sink the owner hands out - head kept - whatever the reads",
          "[comm][decoder]") {
  for (size_t tail_len : {size_t{100}, size_t{40000}, size_t{1} << 20}) {
    const size_t head_len = 24;
    std::string head = Pattern(head_len, 1);
    std::string tail = Pattern(tail_len, 2);
    std::string stream = EncodeFrame(TestMeta(1), "before") + EncodeFrame(SplitMeta(7, head_len), head + tail) +
                         EncodeFrame(TestMeta(2), "after");
    for (size_t chunk : {size_t{1} << 20, size_t{65536}, size_t{4093}, size_t{7}}) {
      if (chunk == 7 && tail_len > 40000) continue;  // byte-level splits: the small cases suffice
      INFO("tail " << tail_len << " chunk " << chunk);
      FrameDecoder d{Limits{}};
      std::string sink(tail_len, '\x55');
      int asked = 0;
      d.set_sink([&](const pb::MessageMeta& meta, uint64_t tail) -> char* {
        ++asked;
        CHECK(meta.request_id() == 7);
        CHECK(tail == tail_len);
        return sink.data();
      });
      std::vector<Frame> got;
      REQUIRE(FeedChunked(&d, stream, chunk, &got).ok());
      CHECK(asked == 1);
      REQUIRE(got.size() == 3);
      CHECK(got[0].payload->view() == "before");
      CHECK(got[0].tail_bytes == 0);
      REQUIRE(got[1].payload != nullptr);
      CHECK(got[1].payload->view() == head);
      CHECK(got[1].tail_bytes == tail_len);
      CHECK_FALSE(got[1].tail_dropped);
      CHECK(got[1].wire_bytes == EncodeFrame(SplitMeta(7, head_len), head + tail).size());
      CHECK(sink == tail);
      CHECK(got[2].payload->view() == "after");
      CHECK_FALSE(d.mid_frame());
      if (tail_len >= (size_t{1} << 20) && chunk <= 65536) {
        // Read straight into the sink: only the bytes that shared a read with the header,
        // and the last few under kDirectReadMin, went through the input buffer.
        CHECK(d.copied_payload_bytes() < chunk + FrameDecoder::kDirectReadMin + 100);
      }
    }
  }
}

TEST_CASE("decoder: without a sink - or with a head hint outside the payload - the payload arrives whole",
          "[comm][decoder]") {
  std::string payload = Pattern(50000, 3);
  // Hints of 0 or not inside the payload are ignored (the sink is not asked); a hint
  // inside it asks the sink, which declines here: the whole payload, as usual.
  for (uint64_t head : {uint64_t{0}, uint64_t{50000}, uint64_t{50001}, uint64_t{1} << 40, uint64_t{8}}) {
    INFO("head " << head);
    FrameDecoder d{Limits{}};
    int asked = 0;
    d.set_sink([&](const pb::MessageMeta&, uint64_t) -> char* {
      ++asked;
      return nullptr;
    });
    std::vector<Frame> got;
    REQUIRE(d.Feed(EncodeFrame(SplitMeta(1, head), payload), &got).ok());
    CHECK(asked == (head == 8 ? 1 : 0));
    REQUIRE(got.size() == 1);
    CHECK(got[0].payload->view() == payload);
    CHECK(got[0].tail_bytes == 0);
  }
}

namespace {

// Frames as a Connection writes them: each meta padded so that its payload starts 8-byte
// aligned in the stream.
std::string PaddedStream(const std::vector<Expected>& frames) {
  std::string s;
  for (const Expected& f : frames) {
    std::string meta = f.meta.SerializeAsString();
    const size_t pad = f.payload.empty() ? 0 : MetaPadBytes(s.size(), meta.size());
    meta.resize(meta.size() + pad);
    StoreMetaPad(pad, meta.data() + meta.size() - pad);
    s += EncodeHeader(FrameHeader{kMagic, static_cast<uint32_t>(meta.size()), f.payload.size()}) + meta + f.payload;
  }
  return s;
}

// Small frames of many sizes and meta lengths (some without a payload); with `large`, a
// 40 KB and a 1 MiB payload among them.
std::vector<Expected> SmallFrames(bool large) {
  std::vector<Expected> frames;
  for (int i = 0; i < 300; ++i) {
    pb::MessageMeta m = TestMeta(static_cast<uint64_t>(i + 1));
    m.set_handler(std::string(static_cast<size_t>(i % 11), 'h'));
    const size_t n = i % 7 == 0 ? 0 : static_cast<size_t>((i * 977) % 16000 + 1);
    frames.push_back({m, Pattern(n, static_cast<int>(i))});
    if (large && i == 100) frames.push_back({TestMeta(1000), Pattern(40000, 1)});
    if (large && i == 200) frames.push_back({TestMeta(1001), Pattern(size_t{1} << 20, 2)});
  }
  return frames;
}

}  // namespace

TEST_CASE("padding: every stream offset and meta length gets a payload 8-byte aligned - the meta still parses",
          "[comm][decoder]") {
  for (uint64_t off = 0; off < 24; ++off) {
    for (size_t len = 0; len < 40; ++len) {
      const size_t pad = MetaPadBytes(off, len);
      CHECK((off + kHeaderBytes + len + pad) % kPayloadAlign == 0);
      CHECK((pad == 0 || (pad >= 2 && pad <= 9)));
    }
  }
  pb::MessageMeta m = TestMeta(5, 7);
  m.set_handler("push");
  for (size_t pad : {size_t{2}, size_t{5}, size_t{9}}) {
    std::string bytes = m.SerializeAsString();
    bytes.resize(bytes.size() + pad);
    StoreMetaPad(pad, bytes.data() + bytes.size() - pad);
    pb::MessageMeta back;
    REQUIRE(back.ParseFromString(bytes));
    CHECK(back.pad() == std::string(pad - 2, '\0'));
    back.clear_pad();
    CHECK(back.SerializeAsString() == m.SerializeAsString());
  }
}

TEST_CASE("decoder: small payloads of padded frames are handed out in place - and never change while held",
          "[comm][decoder]") {
  for (bool large : {false, true}) {
    std::vector<Expected> want = SmallFrames(large);
    const std::string stream = PaddedStream(want);
    for (size_t chunk : {size_t{1}, size_t{13}, size_t{4096}, size_t{65536}, size_t{1} << 20}) {
      INFO("large " << large << " chunk " << chunk);
      FrameDecoder d{Limits{}};
      std::vector<Frame> got;  // every payload held until the whole stream is decoded
      REQUIRE(FeedChunked(&d, stream, chunk, &got).ok());
      CheckSame(got, want);  // after all the reads that followed each of them
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i].payload == nullptr) continue;
        CHECK(reinterpret_cast<uintptr_t>(got[i].payload->data()) % kPayloadAlign == 0);
      }
      // Small frames alone: not a byte copied. Among large ones: at most what arrived in
      // the reads that brought their headers.
      if (!large) CHECK(d.copied_payload_bytes() == 0);
      if (large) CHECK(d.copied_payload_bytes() <= 40000 + (size_t{128} << 10));
    }
    // Unpadded, the same frames still decode right (misaligned payloads are copied).
    FrameDecoder d{Limits{}};
    std::vector<Frame> got;
    REQUIRE(FeedChunked(&d, Concat(want), 4096, &got).ok());
    CheckSame(got, want);
  }
}

TEST_CASE("decoder: between back-to-back large frames a read brings the next head - their payloads are hardly copied",
          "[comm][decoder]") {
  // As a socket delivers them: each read gets what it asks for. After the first frame
  // (read into a fresh 4 KiB buffer), a read at a frame boundary asks for the next head
  // only (the last head's size plus the padding's play), and the read that ends a frame
  // for no more than a head after it: the payloads go straight into their own buffers.
  for (size_t size : {size_t{64} << 10, size_t{1} << 20}) {
    INFO("size " << size);
    std::vector<Expected> want;
    for (int i = 0; i < 20; ++i) {
      pb::MessageMeta m = TestMeta(static_cast<uint64_t>(i + 1));
      m.set_handler(std::string(static_cast<size_t>(i % 5), 'h'));  // heads of several sizes
      want.push_back({m, Pattern(size + static_cast<size_t>(i) * 4, i)});
    }
    FrameDecoder d{Limits{}};
    std::vector<Frame> got;
    REQUIRE(FeedChunked(&d, PaddedStream(want), size_t{1} << 30, &got).ok());
    CheckSame(got, want);
    CHECK(d.copied_payload_bytes() <= 4096 + 19 * 2 * kPayloadAlign);
  }
}

TEST_CASE("decoder: a small frame asks for its sink only once all of it is in - the tail is copied there",
          "[comm][decoder]") {
  const size_t head_len = 16, tail_len = 3000;
  std::string tail = Pattern(tail_len, 4);
  std::string frame = EncodeFrame(SplitMeta(9, head_len), Pattern(head_len, 5) + tail);
  FrameDecoder d{Limits{}};
  std::string sink(tail_len, '\x55');
  int asked = 0;
  d.set_sink([&](const pb::MessageMeta&, uint64_t n) -> char* {
    ++asked;
    CHECK(n == tail_len);
    return sink.data();
  });
  std::vector<Frame> got;
  REQUIRE(FeedChunked(&d, std::string_view(frame).substr(0, frame.size() - 1), 1000, &got).ok());
  CHECK(asked == 0);  // a DropSink until now has nothing to drop: the owner's SinkFn decides
  CHECK(got.empty());
  REQUIRE(d.Feed(std::string_view(frame).substr(frame.size() - 1), &got).ok());
  CHECK(asked == 1);
  REQUIRE(got.size() == 1);
  CHECK(got[0].tail_bytes == tail_len);
  CHECK(got[0].payload->view() == Pattern(head_len, 5));
  CHECK(sink == tail);
}

TEST_CASE("decoder: a dropped sink receives nothing more - the frame comes out marked and the stream goes on",
          "[comm][decoder]") {
  for (size_t tail_len : {size_t{1} << 20}) {
    INFO("tail " << tail_len);
    const size_t head_len = 16;
    std::string tail = Pattern(tail_len, 4);
    std::string frame = EncodeFrame(SplitMeta(9, head_len), Pattern(head_len, 5) + tail);
    std::string next = EncodeFrame(TestMeta(10), "next");
    FrameDecoder d{Limits{}};
    std::string sink(tail_len, '\x55');
    d.set_sink([&](const pb::MessageMeta&, uint64_t) -> char* { return sink.data(); });
    std::vector<Frame> got;
    // Up to the middle of the tail, then the sink is dropped (another id first: no effect).
    const size_t cut = frame.size() - tail_len / 2;
    REQUIRE(FeedChunked(&d, std::string_view(frame).substr(0, cut), 8192, &got).ok());
    REQUIRE(got.empty());
    d.DropSink(8);
    REQUIRE(FeedChunked(&d, std::string_view(frame).substr(cut, 100), 8192, &got).ok());
    d.DropSink(9);
    const std::string at_drop = sink;
    REQUIRE(FeedChunked(&d, std::string_view(frame).substr(cut + 100) , 8192, &got).ok());
    CHECK(sink == at_drop);  // nothing written after the drop
    CHECK(sink.substr(0, tail_len - tail_len / 2 + 100) == tail.substr(0, tail_len - tail_len / 2 + 100));
    CHECK(sink.substr(tail_len - tail_len / 2 + 100) == std::string(tail_len / 2 - 100, '\x55'));
    REQUIRE(got.size() == 1);
    CHECK(got[0].tail_dropped);
    CHECK(got[0].tail_bytes == 0);
    d.DropSink(9);  // after the frame: no effect
    REQUIRE(d.Feed(next, &got).ok());
    REQUIRE(got.size() == 2);
    CHECK(got[1].payload->view() == "next");
    CHECK_FALSE(got[1].tail_dropped);
  }
}

namespace {

// Records what the decoder hands it; checks every piece's shape as it comes.
struct Recorder : TailStream {
  bool accept = true;
  std::string head;
  uint64_t tail = 0;
  std::string got;
  int begun = 0;
  int pieces = 0;
  bool misshapen = false;  // a piece unaligned, or not whole floats before the last one
  bool* destroyed = nullptr;
  ~Recorder() override {
    if (destroyed != nullptr) *destroyed = true;
  }
  bool Begin(Buffer& h, uint64_t t) override {
    ++begun;
    head.assign(h.data(), h.size());
    tail = t;
    return accept;
  }
  void Consume(const char* data, size_t n) override {
    ++pieces;
    if (reinterpret_cast<uintptr_t>(data) % 4 != 0) misshapen = true;
    if (n % 4 != 0 && got.size() + n != tail) misshapen = true;
    got.append(data, n);
  }
};

pb::MessageMeta RequestSplitMeta(uint64_t request_id, uint64_t head) {
  pb::MessageMeta m = TestMeta(request_id);
  m.set_payload_head(head);
  return m;
}

}  // namespace

TEST_CASE("decoder: a stream takes a tail piece by piece - aligned whole floats - whatever the reads",
          "[comm][decoder][stream]") {
  for (size_t tail_len : {size_t{4}, size_t{103}, size_t{40000}, size_t{1} << 20}) {
    for (size_t head_len : {size_t{8}, size_t{21}, size_t{24000}}) {  // the last one read straight in
      std::string head = Pattern(head_len, 1);
      std::string tail = Pattern(tail_len, 2);
      const std::string frame = EncodeFrame(RequestSplitMeta(7, head_len), head + tail);
      std::string stream = EncodeFrame(TestMeta(1), "before") + frame + EncodeFrame(TestMeta(2), "after");
      for (size_t chunk : {size_t{1} << 20, size_t{65536}, size_t{4093}, size_t{7}, size_t{1}}) {
        if (chunk < 4093 && tail_len + head_len > 40000) continue;  // tiny reads: the small cases suffice
        INFO("tail " << tail_len << " head " << head_len << " chunk " << chunk);
        FrameDecoder d{Limits{}};
        auto rec = std::make_shared<Recorder>();
        int asked = 0;
        std::vector<Frame> got;
        d.set_stream([&](const pb::MessageMeta& meta, uint64_t t) -> std::shared_ptr<TailStream> {
          ++asked;
          CHECK(meta.request_id() == 7);
          CHECK(t == tail_len);
          CHECK(got.size() == 1);  // the frame before it was delivered first
          return rec;
        });
        REQUIRE(FeedChunked(&d, stream, chunk, &got).ok());
        CHECK(asked == 1);
        CHECK(rec->begun == 1);
        CHECK(rec->head == head);
        CHECK(rec->tail == tail_len);
        CHECK(rec->got == tail);
        CHECK_FALSE(rec->misshapen);
        REQUIRE(got.size() == 3);
        CHECK(got[0].payload->view() == "before");
        CHECK(got[0].stream == nullptr);
        CHECK(got[1].payload->view() == head);
        CHECK(got[1].tail_bytes == tail_len);
        CHECK(got[1].stream == rec);
        CHECK(got[1].wire_bytes == frame.size());
        CHECK(got[2].payload->view() == "after");
        CHECK(got[2].stream == nullptr);
        CHECK_FALSE(d.mid_frame());
        if (tail_len >= (size_t{1} << 20) && chunk >= 65536) CHECK(rec->pieces < 64);  // big pieces, not bytes
      }
    }
  }
}

TEST_CASE("decoder: a stream that declines at the head gets nothing more - the payload arrives whole",
          "[comm][decoder][stream]") {
  for (size_t head_len : {size_t{16}, size_t{20000}}) {
    for (size_t chunk : {size_t{1} << 20, size_t{4093}, size_t{5}}) {
      INFO("head " << head_len << " chunk " << chunk);
      std::string payload = Pattern(head_len + 50000, 3);
      FrameDecoder d{Limits{}};
      auto rec = std::make_shared<Recorder>();
      rec->accept = false;
      d.set_stream([&](const pb::MessageMeta&, uint64_t) -> std::shared_ptr<TailStream> { return rec; });
      std::vector<Frame> got;
      REQUIRE(FeedChunked(&d, EncodeFrame(RequestSplitMeta(1, head_len), payload) + EncodeFrame(TestMeta(2), "x"),
                          chunk, &got)
                  .ok());
      CHECK(rec->begun == 1);
      CHECK(rec->pieces == 0);
      REQUIRE(got.size() == 2);
      CHECK(got[0].payload->view() == payload);
      CHECK(got[0].tail_bytes == 0);
      CHECK(got[0].stream == nullptr);
      CHECK(got[1].payload->view() == "x");
    }
  }
  // No stream offered (null), no head hint, or a hint outside the payload: not asked / whole.
  for (uint64_t head : {uint64_t{0}, uint64_t{64}, uint64_t{65}, uint64_t{8}}) {
    FrameDecoder d{Limits{}};
    int asked = 0;
    d.set_stream([&](const pb::MessageMeta&, uint64_t) -> std::shared_ptr<TailStream> {
      ++asked;
      return nullptr;
    });
    std::vector<Frame> got;
    REQUIRE(d.Feed(EncodeFrame(RequestSplitMeta(1, head), Pattern(64, 4)), &got).ok());
    CHECK(asked == (head == 8 ? 1 : 0));
    REQUIRE(got.size() == 1);
    CHECK(got[0].payload->view() == Pattern(64, 4));
  }
}

TEST_CASE("decoder: a payload whose stream declined at the head goes into a pooled block of its size when the pool has one",
          "[comm][decoder][stream]") {
  PoolLimitGuard guard;
  const size_t head_len = 40;
  const std::string payload = Pattern(head_len + (size_t{8} << 20), 7);
  auto budget = std::make_shared<MemoryBudget>(uint64_t{64} << 20);
  for (bool pooled : {true, false}) {
    INFO((pooled ? "a block of the payload's size pooled" : "nothing pooled"));
    Buffer::SetPoolLimit(0);  // empty: earlier tests (and rounds) may have left blocks in it
    Buffer::SetPoolLimit(Buffer::kDefaultPoolLimit);  // on in every build here (off by default under ASan)
    const char* block = nullptr;
    if (pooled) {
      BufferPtr released = Buffer::Allocate(payload.size());
      block = released->data();
    }
    FrameDecoder d{Limits{}};
    d.set_budget(budget);
    auto rec = std::make_shared<Recorder>();
    rec->accept = false;
    d.set_stream([&](const pb::MessageMeta&, uint64_t) -> std::shared_ptr<TailStream> { return rec; });
    std::vector<Frame> got;
    REQUIRE(FeedChunked(&d, EncodeFrame(RequestSplitMeta(1, head_len), payload), size_t{64} << 10, &got).ok());
    CHECK(rec->begun == 1);
    REQUIRE(got.size() == 1);
    CHECK(got[0].payload->view() == payload);
    // Pooled: the head copied into the block, the tail read there. Else it grows as it
    // comes, from a chunk (the hostile-peer rule): never the pooled block.
    CHECK((got[0].payload->data() == block) == pooled);
    CHECK(d.copied_payload_bytes() < (size_t{64} << 10));
    got.clear();
    CHECK(budget->held() == 0);
  }
}

TEST_CASE("decoder: a sink for the tail goes first - the stream is not asked", "[comm][decoder][stream]") {
  FrameDecoder d{Limits{}};
  std::string sink(100, '\0');
  int streams = 0;
  d.set_sink([&](const pb::MessageMeta&, uint64_t) -> char* { return sink.data(); });
  d.set_stream([&](const pb::MessageMeta&, uint64_t) -> std::shared_ptr<TailStream> {
    ++streams;
    return nullptr;
  });
  std::vector<Frame> got;
  REQUIRE(d.Feed(EncodeFrame(RequestSplitMeta(1, 8), Pattern(108, 6)), &got).ok());
  CHECK(streams == 0);
  CHECK(sink == Pattern(108, 6).substr(8));
}

TEST_CASE("decoder: a stream cut off mid-tail is let go without its frame", "[comm][decoder][stream]") {
  bool destroyed = false;
  {
    FrameDecoder d{Limits{}};
    auto rec = std::make_shared<Recorder>();
    rec->destroyed = &destroyed;
    d.set_stream([&](const pb::MessageMeta&, uint64_t) -> std::shared_ptr<TailStream> { return rec; });
    std::string frame = EncodeFrame(RequestSplitMeta(3, 16), Pattern(16 + 100000, 7));
    std::vector<Frame> got;
    REQUIRE(FeedChunked(&d, std::string_view(frame).substr(0, frame.size() - 5000), 8192, &got).ok());
    CHECK(got.empty());
    CHECK(d.mid_frame());
    CHECK(rec->got.size() > 0);
    CHECK(rec->got.size() <= 100000 - 5000);
    rec.reset();
    CHECK_FALSE(destroyed);  // the decoder still holds it
  }
  CHECK(destroyed);  // the connection (decoder) went away: the stream with it
}

}  // namespace pscore::comm

namespace pscore::comm {
namespace {

// A frame's header and meta announcing `data_len` payload bytes, and `sent` of them.
std::string AnnouncedFrame(uint64_t request_id, uint64_t data_len, size_t sent) {
  const std::string meta = TestMeta(request_id).SerializeAsString();
  return EncodeHeader(FrameHeader{kMagic, static_cast<uint32_t>(meta.size()), data_len}) + meta +
         std::string(sent, 'a');
}

}  // namespace

TEST_CASE("decoder: payload memory grows with the bytes that arrive - never from the announced length",
          "[comm][decoder][budget]") {
  Limits limits;
  limits.max_message_bytes = uint64_t{256} << 20;
  auto budget = std::make_shared<MemoryBudget>(uint64_t{1} << 30);
  FrameDecoder d{limits};
  d.set_budget(budget);
  std::vector<Frame> got;
  // A header announcing just under 256 MiB and a few bytes: one chunk held, not 256 MiB.
  const uint64_t announced = (uint64_t{256} << 20) - 100;
  const std::string frame_start = AnnouncedFrame(1, announced, 10);
  REQUIRE(d.Feed(frame_start, &got).ok());
  CHECK(got.empty());
  CHECK(d.held_bytes() == FrameDecoder::kPayloadChunk);
  CHECK(budget->held() == FrameDecoder::kPayloadChunk);
  // As bytes arrive, what is held stays within what arrived plus max(chunk, what arrived).
  uint64_t received = 10;
  const std::string piece(300 << 10, 'b');
  for (int i = 0; i < 12; ++i) {
    REQUIRE(d.Feed(piece, &got).ok());
    received += piece.size();
    INFO("received " << received);
    CHECK(d.held_bytes() <= received + std::max<uint64_t>(FrameDecoder::kPayloadChunk, received) +
                                FrameDecoder::kDirectReadMin);
    CHECK(d.held_bytes() > received);
  }
  CHECK(got.empty());
}

TEST_CASE("decoder: a payload grown as it arrives is whole and in place - and its memory is returned",
          "[comm][decoder][budget]") {
  auto budget = std::make_shared<MemoryBudget>(uint64_t{64} << 20);
  for (size_t size : {size_t{300} << 10, (size_t{5} << 20) + 12, size_t{9} << 20}) {
    INFO("size " << size);
    std::vector<Expected> want = {{TestMeta(1), Pattern(size, 3)}, {TestMeta(2), "after"}};
    FrameDecoder d{Limits{}};
    d.set_budget(budget);
    std::vector<Frame> got;
    // Reads of at most 64 KiB: the buffer grows step by step, its pages moved, not copied.
    REQUIRE(FeedChunked(&d, PaddedStream(want), size_t{64} << 10, &got).ok());
    CheckSame(got, want);
    CHECK(d.held_bytes() == 0);
    CHECK(budget->held() == 0);
    CHECK(d.copied_payload_bytes() < (size_t{64} << 10));
  }
}

TEST_CASE("decoder: frames received in part share one budget - the one that needs more than is left fails",
          "[comm][decoder][budget]") {
  Limits limits;
  limits.max_message_bytes = uint64_t{256} << 20;
  const uint64_t chunk = FrameDecoder::kPayloadChunk;
  auto budget = std::make_shared<MemoryBudget>(3 * chunk);
  std::vector<std::unique_ptr<FrameDecoder>> decoders;
  std::vector<Frame> got;
  for (int i = 0; i < 3; ++i) {
    decoders.push_back(std::make_unique<FrameDecoder>(limits));
    decoders.back()->set_budget(budget);
    REQUIRE(decoders.back()->Feed(AnnouncedFrame(1, uint64_t{200} << 20, 5), &got).ok());
  }
  CHECK(budget->held() == 3 * chunk);
  FrameDecoder over{limits};
  over.set_budget(budget);
  const Status st = over.Feed(AnnouncedFrame(1, uint64_t{200} << 20, 5), &got);
  INFO(st);
  CHECK(st.code() == Code::kResourceExhausted);
  CHECK(st.message().find("cap " + std::to_string(3 * chunk)) != std::string::npos);
  CHECK(budget->refusals() == 1);
  // A frame small enough to be decoded from the input buffer holds no budget.
  FrameDecoder small{limits};
  small.set_budget(budget);
  REQUIRE(small.Feed(EncodeFrame(TestMeta(2), "small"), &got).ok());
  CHECK(got.size() == 1);
  // A decoder that goes away (its connection closed) gives its share back.
  decoders.pop_back();
  CHECK(budget->held() == 2 * chunk);
  FrameDecoder next{limits};
  next.set_budget(budget);
  CHECK(next.Feed(AnnouncedFrame(1, uint64_t{200} << 20, 5), &got).ok());
  decoders.clear();
  CHECK(budget->held() == chunk);
}

}  // namespace pscore::comm
