// Small helpers to put protobuf messages into payload Buffers and read them back.
// Parsing is bounded by the frame limits already checked by the decoder.
#pragma once

#include <cstring>
#include <string>
#include <string_view>

#include <google/protobuf/message_lite.h>

#include "pscore/comm/frame_decoder.h"
#include "pscore/core/buffer.h"
#include "pscore/core/clock.h"
#include "pscore/core/role_names.h"
#include "pscore/core/status.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::node {

// A timeout in milliseconds from the wire (any int64): `if_unset` when <= 0, and at most
// 2^42 ms (about 139 years), so turning it into nanoseconds (x 10^6), or adding it to the
// steady clock's now, cannot overflow int64 (scheduler_dispatch_fuzz: a barrier with
// timeout_ms 4.8e14 overflowed the conversion).
// Flags in milliseconds are refused above the same bound (programs/flags.cc).
inline constexpr int64_t kMaxTimeoutMs = int64_t{1} << 42;
static_assert(kMaxTimeoutMs * 2 < Duration::max().count() / 1000000, "the cap and now must fit in Duration");
inline Duration WireMillis(int64_t ms, Duration if_unset = Duration::zero()) {
  if (ms <= 0) return if_unset;
  return std::chrono::milliseconds(ms < kMaxTimeoutMs ? ms : kMaxTimeoutMs);
}

inline BufferPtr ToBuffer(const google::protobuf::MessageLite& msg) {
  auto buf = Buffer::Allocate(msg.ByteSizeLong());
  msg.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(buf->data()));
  return buf;
}

// `head` serialised, then a length-delimited field `field` holding `bytes`, copied once
// straight into the payload (the wire format lets a parser take fields in any order; `head`
// must leave that field unset). For the large values of KV calls and answers.
inline BufferPtr ToBufferWithBytes(const google::protobuf::MessageLite& head, int field, std::string_view bytes) {
  const size_t head_size = head.ByteSizeLong();
  uint8_t tag[1 + 5 + 10];  // a tag up to field 2^29, then the length's varint
  size_t tag_size = 0;
  for (uint64_t n = (static_cast<uint64_t>(field) << 3) | 2;; n >>= 7) {  // wire type 2
    tag[tag_size++] = static_cast<uint8_t>(n < 0x80 ? n : (n & 0x7f) | 0x80);
    if (n < 0x80) break;
  }
  for (uint64_t n = bytes.size();; n >>= 7) {
    tag[tag_size++] = static_cast<uint8_t>(n < 0x80 ? n : (n & 0x7f) | 0x80);
    if (n < 0x80) break;
  }
  BufferPtr buf = Buffer::Allocate(head_size + tag_size + bytes.size());
  uint8_t* out = reinterpret_cast<uint8_t*>(buf->data());
  head.SerializeWithCachedSizesToArray(out);
  std::memcpy(out + head_size, tag, tag_size);
  if (!bytes.empty()) std::memcpy(out + head_size + tag_size, bytes.data(), bytes.size());
  return buf;
}

template <typename T>
Status ParsePayload(const comm::Frame& frame, T* out) {
  const char* data = frame.payload ? frame.payload->data() : "";
  size_t size = frame.payload ? frame.payload->size() : 0;
  if (!out->ParseFromArray(data, static_cast<int>(size))) {
    return Status(Code::kProtocol, "unparsable " + out->GetTypeName() + " in " +
                                       pb::NodeCommand_Name(frame.meta.cmd()));
  }
  return Status::Ok();
}

inline pb::MessageMeta MakeMeta(pb::NodeCommand cmd, pb::NodeRole role, int rank) {
  pb::MessageMeta meta;
  meta.set_cmd(cmd);
  meta.set_role(role);
  meta.set_rank_id(rank);
  return meta;
}

// Roles are named as core names them (core/role_names.h) in logs, /metrics and JSON.
using core::RoleLabel;

// The control protocol's version a member sends in REGISTER; the scheduler refuses another
// (kInvalidArgument naming both) rather than misreading it.
inline constexpr uint32_t kProtocolVersion = 2;

// A command a native port does not serve, named with its number ("SCALE_OUT (command 7)",
// "command 999"): a peer of another version may send numbers this build has no name for.
inline std::string UnservedCommandName(int cmd) {
  const std::string name = pb::NodeCommand_IsValid(cmd) ? pb::NodeCommand_Name(static_cast<pb::NodeCommand>(cmd)) : "";
  return name.empty() ? "command " + std::to_string(cmd) : name + " (command " + std::to_string(cmd) + ")";
}

// A peer that sends this many commands a port does not serve is disconnected: it is not
// speaking this protocol, and answering it forever costs the port.
inline constexpr int kMaxUnservedCommands = 16;

// The built-in parameter store's handler names (SEND_DATA's MessageMeta.handler): a
// worker's Push and Pull parts, served by the server's store.
inline constexpr char kPushHandler[] = "pscore.push";
inline constexpr char kPullHandler[] = "pscore.pull";

}  // namespace pscore::node
