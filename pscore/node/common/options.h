// Plain option structs for the roles. Filled by programs/flags.cc from flags (or by an
// embedding program directly); no other code reads flags or the environment.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pscore/comm/transport_types.h"
#include "pscore/core/clock.h"
#include "pscore/proto/comm.pb.h"

namespace pscore::node {

// Limits on the connections a scheduler or a server accepts (its peers, admin clients and
// strangers). Dialled connections are not subject to them.
struct AcceptLimits {
  size_t max_connections = 10000;  // open at once; more are closed at accept (0: no cap)
  // An accepted connection must deliver one whole frame within this long (0: no deadline).
  Duration first_frame_timeout = std::chrono::seconds(30);
  // A frame begun but not finished, with no byte for this long, is cut off (0: never).
  Duration partial_frame_timeout = std::chrono::seconds(30);
};

struct SchedulerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: pick a free port (read it back with SchedulerNode::port())
  int worker_num = 1;
  int server_num = 1;
  Duration heartbeat_interval = std::chrono::milliseconds(1000);
  Duration heartbeat_timeout = std::chrono::milliseconds(5000);
  // A scale not ended by then is rolled back. Under the members' request_timeout (60 s), so
  // the pushes and pulls a scale holds are released before their deadline.
  Duration scale_timeout = std::chrono::seconds(30);
  // Every member silent at once is taken for the scheduler's own network for this long
  // (core::ClusterConfig::isolation_timeout; the members' default recovery_timeout). 0: off.
  Duration isolation_timeout = std::chrono::seconds(15);
  uint64_t max_message_bytes = 256ull << 20;
  size_t max_kv_value_bytes = 16u << 20;
  // Keys and values the KV store holds at most; a Set past it is kResourceExhausted (0: no cap).
  uint64_t max_kv_total_bytes = 1ull << 30;
  // A connection whose unsent answers pass this is closed (a peer that does not read).
  // The scheduler's answers are small (a KV value is at most 16 MiB): 64 MiB is four of
  // the largest waiting for a peer.
  uint64_t max_queued_write_bytes = 64ull << 20;
  std::string job_id = "default";
  std::string http_host = "127.0.0.1";
  int http_port = -1;  // -1: no HTTP endpoint; 0: a free port
  // Restart recovery: persist membership, state and KV here (empty: nothing persisted).
  std::string state_dir;
  bool state_reset_on_corrupt = false;  // a damaged state file: start fresh, not exit 1
  std::string cluster_token;  // empty: no authentication
  // TLS on the scheduler port and the HTTP port (comm::TlsContext::Load); null: plaintext.
  // A member's REGISTER must then claim the node id its certificate names (docs/security.md).
  std::shared_ptr<comm::TlsContext> tls;
  // With TLS: the certificate CNs whose admin commands are carried out. Any other CA-signed
  // certificate gets only "status" (members ask it while they wait for READY).
  std::vector<std::string> tls_admin_cns = {"admin"};
  AcceptLimits accept;
  // Copies of each server's key range, at most server_num (docs/reliability.md). Members
  // learn it from the metadata.
  int replicas = 1;
  // Roles whose members restart without being recorded in error (core::ClusterConfig).
  std::vector<pb::NodeRole> recoverable_roles;
  // Metadata encoded larger than this reaches workers as their view: servers and totals,
  // no worker entries (pscore/node/scheduler/metadata_cache.h, docs/protocol.md).
  size_t worker_metadata_view_over = 64 * 1024;
  // Metadata encoded larger than this reaches servers as their view: servers and totals,
  // of each worker only its node id and rank (pscore/node/scheduler/metadata_cache.h, docs/protocol.md).
  size_t server_metadata_view_over = 64 * 1024;
};

struct NodeOptions {
  pb::NodeRole role = pb::WORKER;
  std::string node_id;  // empty: "<role>-<random>"
  std::string scheduler_host = "127.0.0.1";
  int scheduler_port = 0;
  std::string host = "127.0.0.1";  // address this node listens on and advertises
  int port = 0;                    // 0: a free port
  int rank = -1;                   // -1: any
  Duration heartbeat_interval = std::chrono::milliseconds(1000);
  // The scheduler's heartbeat timeout (the same --heartbeat_timeout_ms): scales the watch below.
  Duration heartbeat_timeout = std::chrono::milliseconds(5000);
  // Scheduler watch: no answer from the scheduler for this long is logged once and the link
  // is closed and redialed (a stopped scheduler keeps its socket open). 0: 2 x heartbeat_timeout.
  int64_t scheduler_timeout_ms = 0;
  // How long a dial keeps trying (refused connects again with backoff; an attempt whose SYNs
  // go unanswered ends here). A worker's key-value parts dial a server for
  // min(connect_timeout, 2 x heartbeat_timeout) and take a dial that gives up as a lost server.
  Duration connect_timeout = std::chrono::seconds(30);
  // A new node refused because its role's quota is full (started before the scale-out that
  // makes room for it was asked) or because a scale-in runs registers again, every second at
  // most, until this long after the first refusal; then the refusal stands (Start() returns it, pscore-node exits
  // 1). 0: the first refusal stands.
  Duration join_timeout = std::chrono::seconds(60);
  Duration request_timeout = std::chrono::seconds(60);
  // A blocking KV request or barrier goes over a link to the scheduler that the calling
  // thread writes and reads itself, when no other thread has it (pscore/node/common/
  // direct_control.h; never with TLS). false: every call goes through the loop thread.
  bool direct_control_calls = true;
  // Worker: how long a push or pull part whose server link was lost is sent again (to the
  // address the metadata gives for its keys' owner) before it fails; 3x the default
  // heartbeat timeout, so a server restarted in that time is waited for. Every member: no
  // answer from the scheduler for this long (at least the scheduler timeout) and the node
  // gives up, terminating with kUnavailable naming the scheduler (pscore-node exits 4).
  Duration recovery_timeout = std::chrono::milliseconds(15000);
  std::vector<pb::Device> devices;
  std::string host_name;
  uint64_t max_message_bytes = 256ull << 20;
  // Worker: a Push that copies its values and has more keys than this goes in slices of
  // this many keys, each a request of its own (pscore/node/worker/push_parts.h); 0: never
  // sliced. A million keys of one float, with their lens, make 16 MB: one pooled size.
  size_t push_slice_keys = 1000000;
  // Server handlers run on this many executor threads (0: on the loop thread).
  int handler_threads = 2;
  // After a lone request of this node goes out, or the last answer comes in, its loop polls
  // without sleeping this long (comm::Messenger::set_poll_spin): lower latency for a
  // caller that waits on one small request at a time, at the price of a core while the
  // window is open. 0: the loop sleeps whenever it has nothing to do.
  Duration poll_spin{0};
  // Server: journal the built-in parameter store here (pscore/node/server/server_journal.h), so a
  // restart with the same directory (and node_id) gets the parameters back. One directory
  // per server. Empty: parameters live in memory only.
  std::string data_dir;
  // Server with data_dir: the journal's newest segment is compacted in the background once
  // it passes max(this, 4x the last compacted file) (pscore/node/server/server_journal.h).
  uint64_t journal_compact_bytes = 64ull << 20;
  std::string cluster_token;  // empty: no authentication
  // TLS on every link of the node (comm::TlsContext::Load); null: plaintext. The
  // certificate's CN must be node_id (the scheduler refuses a REGISTER that differs).
  std::shared_ptr<comm::TlsContext> tls;
  AcceptLimits accept;  // a server's accepted (peer) connections
};

// The transport options every role's messenger starts from.
inline comm::TransportOptions MakeTransportOptions(uint64_t max_message_bytes, const std::string& cluster_token,
                                                   const AcceptLimits& accept,
                                                   std::shared_ptr<comm::TlsContext> tls = nullptr) {
  comm::TransportOptions t;
  t.limits.max_message_bytes = max_message_bytes;
  // Frames received in part may hold 1 GiB in all, and always two of the largest frame the
  // node accepts: a raised --max_message_bytes is not refused by the budget.
  t.max_incomplete_frame_bytes = std::max<uint64_t>(t.max_incomplete_frame_bytes, 2 * max_message_bytes);
  t.auth_token = cluster_token;
  t.tls = std::move(tls);
  t.max_accepted_connections = accept.max_connections;
  t.first_frame_timeout = accept.first_frame_timeout;
  t.partial_frame_timeout = accept.partial_frame_timeout;
  return t;
}

}  // namespace pscore::node
