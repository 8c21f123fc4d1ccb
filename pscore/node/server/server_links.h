// ServerLinks: how the server's services reach the other servers of the job by rank,
// without knowing the node that carries the links. ServerNode implements it on its
// Node links (dialled on first use, from the current metadata).
#pragma once

#include <functional>

#include "pscore/comm/frame_decoder.h"
#include "pscore/core/buffer.h"
#include "pscore/core/status.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::node {

class ServerLinks {
 public:
  virtual ~ServerLinks() = default;
  // Loop thread. Sends a request of `cmd` to server `rank` with `meta`'s handler, tag and
  // push id (the sender's role and rank are filled in) and the request timeout; `done`
  // runs once, on the loop thread, with the answer or why there is none.
  virtual void CallServer(int rank, pb::MessageMeta meta, BufferPtr payload,
                          std::function<void(Result<comm::Frame>)> done) = 0;
};

}  // namespace pscore::node
