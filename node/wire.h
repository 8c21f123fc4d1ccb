// Small helpers to put protobuf messages into payload Buffers and read them back.
// Parsing is bounded by the frame limits already checked by the decoder.
#pragma once

#include <string>

#include <google/protobuf/message_lite.h>

#include "comm/frame_decoder.h"
#include "core/buffer.h"
#include "core/status.h"
#include "proto/comm.pb.h"

namespace pscore::node {

inline BufferPtr ToBuffer(const google::protobuf::MessageLite& msg) {
  auto buf = Buffer::Allocate(msg.ByteSizeLong());
  msg.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(buf->data()));
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

inline std::string RoleLabel(pb::NodeRole role) {
  switch (role) {
    case pb::SERVER: return "server";
    case pb::WORKER: return "worker";
    case pb::SCHEDULER: return "scheduler";
    default: return "admin";
  }
}

}  // namespace pscore::node
