// A server's request handlers: the request a handler gets (DataRequest), the handle it
// answers through (Responder), and the reserved names of the built-in ones.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "pscore/comm/alive.h"
#include "pscore/comm/event_loop.h"
#include "pscore/core/buffer.h"
#include "pscore/core/push_dedup.h"
#include "pscore/core/status.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::node {

struct DataRequest {
  pb::NodeRole from_role = pb::WORKER;
  int from_rank = -1;
  int user_cmd = 0;
  std::string handler;  // empty when addressed by user_cmd
  BufferPtr payload;    // may be null (empty request)
  std::optional<core::PushId> push_id;  // a built-in push's id, as the wire gave it (unchecked)
};

// Answers one request exactly once; copyable handle, any thread. Dropping every copy
// without answering answers kInternal "handler did not answer".
class Responder {
 public:
  // The answer's bytes: a Buffer, or a head with zero-copy tail slices (pscore/core/buffer.h)
  // whose owners keep the memory alive and unchanged until the answer is written.
  void Reply(Payload payload = nullptr) const;
  void Fail(const Status& status) const;

  // For whoever hosts handlers (ServerNode; a test driving a service directly): `send`
  // runs on `loop`'s thread, once, unless `alive` has expired by then.
  static Responder Make(comm::EventLoop* loop, comm::AliveToken::Watch alive,
                        std::function<void(const Status&, Payload)> send);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

using DataHandler = std::function<void(const DataRequest&, Responder)>;

// Reserved handler names of the built-in parameter store (kPushHandler, kPullHandler) are
// in wire.h: workers send them.
inline constexpr char kMigrateHandler[] = "pscore.migrate";  // server to server, during scaling
// During scaling, with the entries: the sender's push-id window, merged by the receiver.
inline constexpr char kMigrateWindowHandler[] = "pscore.migrate_window";
// A push forwarded by its range's primary to a backup (same payload and push id).
inline constexpr char kReplicateHandler[] = "pscore.replicate";
// A resyncing server fetches a chunk of a range's snapshot from the range's primary.
inline constexpr char kResyncHandler[] = "pscore.resync";

// The push id a request's meta carries, if any.
inline std::optional<core::PushId> PushIdOf(const pb::MessageMeta& meta) {
  if (!meta.has_push_id()) return std::nullopt;
  return core::PushId{meta.push_id().writer(), meta.push_id().incarnation(), meta.push_id().seq(),
                      meta.push_id().origin_seq()};
}

}  // namespace pscore::node
