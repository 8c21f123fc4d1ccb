#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include "pscore/comm/frame.h"

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

}  // namespace pscore::comm
