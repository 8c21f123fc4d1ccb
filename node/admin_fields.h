// Which AdminRequest fields each admin operation takes. The scheduler refuses a request
// carrying a field its operation does not take, whoever sent it (native ADMIN or HTTP).
#pragma once

#include "core/status.h"
#include "proto/comm.pb.h"

namespace pscore::node {

// kInvalidArgument naming the first field set (non-zero, non-empty) that `req.op()` does
// not take: worker_num and server_num belong to scale_out and scale_in, node_ids to
// scale_in and reset. Unknown operations pass (the scheduler refuses them by name).
[[nodiscard]] Status CheckAdminFields(const pb::AdminRequest& req);

}  // namespace pscore::node
