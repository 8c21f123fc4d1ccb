#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include <string>
#include <vector>

#include "pscore/comm/frame.h"
#include "pscore/comm/frame_decoder.h"

namespace pscore::comm {

TEST_CASE("frame header round-trips little-endian fields", "[comm][frame]") {
  FrameHeader h{kMagic, 1234, (5ull << 32) | 77};
  std::string bytes = EncodeHeader(h);
  REQUIRE(bytes.size() == kHeaderBytes);
  CHECK(bytes.substr(0, 4) == "PSC1");
  CHECK(static_cast<uint8_t>(bytes[4]) == (1234 & 0xff));
  CHECK(static_cast<uint8_t>(bytes[5]) == (1234 >> 8));
  FrameHeader back = LoadHeader(bytes.data());
  CHECK(back.magic == kMagic);
  CHECK(back.meta_len == 1234);
  CHECK(back.data_len == ((5ull << 32) | 77));
}

TEST_CASE("ParseHeader waits for 16 bytes and checks limits", "[comm][frame]") {
  Limits limits;
  limits.max_message_bytes = 1000;
  std::optional<FrameHeader> h;
  std::string bytes = EncodeHeader(FrameHeader{kMagic, 10, 20});
  REQUIRE(ParseHeader(std::string_view(bytes).substr(0, 15), limits, &h).ok());
  CHECK_FALSE(h.has_value());
  REQUIRE(ParseHeader(bytes, limits, &h).ok());
  REQUIRE(h.has_value());
  CHECK(h->meta_len == 10);
  CHECK(h->data_len == 20);

  std::optional<FrameHeader> bad;
  Status st = ParseHeader(EncodeHeader(FrameHeader{0xdeadbeef, 1, 1}), limits, &bad);
  CHECK(st.code() == Code::kProtocol);
  CHECK(st.message().find("magic") != std::string::npos);
  CHECK_FALSE(bad.has_value());

  st = ParseHeader(EncodeHeader(FrameHeader{kMagic, kMaxMetaBytes + 1, 0}), limits, &bad);
  CHECK(st.code() == Code::kProtocol);
  CHECK(st.message().find(std::to_string(kMaxMetaBytes + 1)) != std::string::npos);
  CHECK(st.message().find(std::to_string(kMaxMetaBytes)) != std::string::npos);

  st = ParseHeader(EncodeHeader(FrameHeader{kMagic, 0, 1001}), limits, &bad);
  CHECK(st.code() == Code::kProtocol);
  CHECK(st.message().find("1001") != std::string::npos);
  CHECK(st.message().find("1000") != std::string::npos);
  CHECK_FALSE(bad.has_value());

  // Exactly at the limits is fine.
  REQUIRE(ParseHeader(EncodeHeader(FrameHeader{kMagic, kMaxMetaBytes, 1000}), limits, &h).ok());
  CHECK(h->data_len == 1000);
}

TEST_CASE("meta padding is protobuf's encoding of MessageMeta.pad - bytes unchanged on the wire", "[comm][frame]") {
  for (size_t pad = 2; pad <= kPayloadAlign + 1; ++pad) {
    INFO("pad " << pad);
    std::string bytes(pad, 'x');
    StoreMetaPad(pad, bytes.data());
    pb::MessageMeta only_pad;
    only_pad.set_pad(std::string(pad - 2, '\0'));
    // protobuf leaves an empty bytes field out; any longer one it writes as we do.
    if (pad > 2) CHECK(bytes == only_pad.SerializeAsString());
    pb::MessageMeta back;
    REQUIRE(back.ParseFromString(bytes));
    CHECK(back.pad() == only_pad.pad());
    // The layout peers already parse: tag (field 9, length-delimited), length, zeros.
    std::string golden = "\x4a";
    golden += static_cast<char>(pad - 2);
    golden += std::string(pad - 2, '\0');
    CHECK(bytes == golden);
  }
  std::string untouched = "ab";
  StoreMetaPad(0, untouched.data());
  CHECK(untouched == "ab");
}

TEST_CASE("padded frames decode with their metas intact - every payload 8-byte aligned in the stream",
          "[comm][frame]") {
  std::string stream;
  std::vector<pb::MessageMeta> metas;
  std::vector<std::string> payloads;
  for (int i = 0; i < 64; ++i) {
    pb::MessageMeta m = testing::TestMeta(static_cast<uint64_t>(i + 1));
    m.set_handler(std::string(static_cast<size_t>(i % 13), 'h'));
    const std::string payload(static_cast<size_t>(i % 5 == 0 ? 0 : i * 7 + 1), static_cast<char>('a' + i % 26));
    std::string meta = m.SerializeAsString();
    const size_t pad = payload.empty() ? 0 : MetaPadBytes(stream.size(), meta.size());
    meta.resize(meta.size() + pad);
    StoreMetaPad(pad, meta.data() + meta.size() - pad);
    stream += EncodeHeader(FrameHeader{kMagic, static_cast<uint32_t>(meta.size()), payload.size()}) + meta;
    if (!payload.empty()) CHECK(stream.size() % kPayloadAlign == 0);
    stream += payload;
    metas.push_back(m);
    payloads.push_back(payload);
  }
  FrameDecoder decoder{Limits{}};
  std::vector<Frame> got;
  REQUIRE(decoder.Feed(stream, &got).ok());
  REQUIRE(got.size() == metas.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("frame " << i);
    CHECK(got[i].meta.pad().find_first_not_of('\0') == std::string::npos);
    got[i].meta.clear_pad();
    CHECK(got[i].meta.SerializeAsString() == metas[i].SerializeAsString());
    const std::string payload = got[i].payload ? std::string(got[i].payload->view()) : std::string();
    CHECK(payload == payloads[i]);
  }
}

}  // namespace pscore::comm
