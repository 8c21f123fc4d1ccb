// Input format of the dispatch fuzzers (scheduler/server/worker_dispatch_fuzz) and of
// make_corpus: a sequence of records, each one message as a role's handler receives it.
//   | flags u8 | meta_len u16 LE | MessageMeta bytes | payload_len u16 LE | payload bytes |
// flags bits 0-1 pick the connection (ids 1..4); bit 2 means "from the scheduler" for
// workers and servers (a push on the scheduler link). A meta that does not parse, or a
// response (which the messenger hands to its request tracker, never to a role), is
// skipped: the transport would have closed the connection or routed it elsewhere.
// Parsing stops at the first incomplete record.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pscore/comm/frame_decoder.h"
#include "pscore/comm/transport_types.h"
#include "pscore/core/buffer.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::fuzz {

inline constexpr uint8_t kFromScheduler = 4;
inline constexpr size_t kMaxRecords = 32;

struct Record {
  uint8_t flags = 0;
  comm::Frame frame;
  comm::ConnId conn() const { return 1 + (flags & 3); }
  bool from_scheduler() const { return (flags & kFromScheduler) != 0; }
};

inline std::vector<Record> ParseRecords(const uint8_t* data, size_t size) {
  std::vector<Record> out;
  size_t pos = 0;
  auto u16 = [&](size_t at) { return static_cast<size_t>(data[at]) | static_cast<size_t>(data[at + 1]) << 8; };
  while (out.size() < kMaxRecords && pos + 3 <= size) {
    uint8_t flags = data[pos];
    size_t meta_len = u16(pos + 1);
    pos += 3;
    if (meta_len > size - pos) break;
    const uint8_t* meta = data + pos;
    pos += meta_len;
    if (pos + 2 > size) break;
    size_t payload_len = u16(pos);
    pos += 2;
    if (payload_len > size - pos) break;
    Record r;
    r.flags = flags;
    bool parsed = r.frame.meta.ParseFromArray(meta, static_cast<int>(meta_len));
    if (payload_len > 0) r.frame.payload = Buffer::Copy(data + pos, payload_len);
    pos += payload_len;
    if (!parsed || r.frame.meta.is_response()) continue;
    out.push_back(std::move(r));
  }
  return out;
}

inline void AppendU16(std::string* s, size_t v) {
  s->push_back(static_cast<char>(v & 0xff));
  s->push_back(static_cast<char>((v >> 8) & 0xff));
}

inline std::string EncodeRecord(uint8_t flags, const pb::MessageMeta& meta, const std::string& payload) {
  std::string m = meta.SerializeAsString();
  std::string s(1, static_cast<char>(flags));
  AppendU16(&s, m.size());
  s += m;
  AppendU16(&s, payload.size());
  s += payload;
  return s;
}

}  // namespace pscore::fuzz
