// The admin operations: an enum, and one table of what each is called on the wire
// (AdminRequest.op), on the command line (pscore-admin) and over HTTP (POST /v1/<op>),
// which request fields it takes and who may run it. Names are parsed and printed only
// through the table; the scheduler, pscore-admin and the HTTP surface decide on the enum,
// so an operation is added in one place.
#pragma once

#include <string_view>
#include <vector>

#include "pscore/core/status.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::node {

enum class AdminOp { kStatus, kNodes, kScaleOut, kScaleIn, kNewInstance, kEnable, kDisable, kReset, kStop, kBarriers };

struct AdminOpInfo {
  AdminOp op;
  const char* wire;     // AdminRequest.op, and the HTTP path /v1/<wire>
  const char* command;  // pscore-admin's command
  bool takes_totals;    // worker_num, server_num
  bool takes_ids;       // node_ids
  bool http_post;       // offered as POST /v1/<wire> (the reads are GET /v1/cluster, /v1/nodes)
  bool any_certificate; // with TLS, any CA-signed peer may run it (members poll it while
                        // they wait for READY); the others need a CN of --tls_admin_cns
};

// Every operation, in the order help texts list them.
const std::vector<AdminOpInfo>& AdminOps();
// The operation of a wire name or of a pscore-admin command; null when there is none.
const AdminOpInfo* FindAdminOp(std::string_view wire);
const AdminOpInfo* FindAdminCommand(std::string_view command);
const AdminOpInfo& Info(AdminOp op);
// The wire name of `op` (what AdminRequest.op carries).
const char* AdminOpName(AdminOp op);

// kInvalidArgument naming the first field set (non-zero, non-empty) that `req.op()` does
// not take: worker_num and server_num belong to scale_out and scale_in, node_ids to
// scale_in and reset. Unknown operations pass (the scheduler refuses them by name).
[[nodiscard]] Status CheckAdminFields(const pb::AdminRequest& req);

}  // namespace pscore::node
