// Types shared by the transport's public and internal classes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "pscore/comm/memory_budget.h"

#include "pscore/comm/frame.h"
#include "pscore/core/clock.h"

namespace pscore::comm {

class TlsContext;

// Identifies a connection for its whole life; never reused (64-bit counter).
using ConnId = uint64_t;
inline constexpr ConnId kNoConn = 0;

struct TransportOptions {
  Limits limits;
  // A peer whose queued-but-unwritten bytes exceed this is closed (kResourceExhausted).
  uint64_t max_queued_write_bytes = 2ull << 30;
  // Queued-but-unwritten bytes of all connections of the transport together: a send that
  // would go past it closes its connection (kResourceExhausted) if that connection holds
  // more than a fair share (this cap / open connections), else it is queued (0: no cap).
  uint64_t max_total_queued_write_bytes = 4ull << 30;
  // Payload memory held for frames received in part, all connections together: a
  // connection whose frame needs more is closed (kResourceExhausted). Drawn from
  // `incomplete_frame_budget` when set (share one among the transports of a process),
  // else from a budget of this many bytes of the transport's own.
  uint64_t max_incomplete_frame_bytes = 1ull << 30;
  std::shared_ptr<MemoryBudget> incomplete_frame_budget;
  // A frame started but not completed, with no byte received for this long, is cut off.
  Duration partial_frame_timeout = std::chrono::seconds(30);
  // An accepted connection that has not delivered one whole frame this long after it was
  // accepted is closed (0: never). Dialled connections are not subject to it.
  Duration first_frame_timeout = std::chrono::seconds(30);
  // Accepted connections beyond this many open at once are closed as soon as they are
  // accepted, with a log line (0: no cap). Dialled connections do not count.
  size_t max_accepted_connections = 10000;
  // Socket options.
  bool tcp_nodelay = true;
  // Cluster token: when set, every connection starts with a challenge (a nonce from the
  // accepting side) and an HMAC proof from the connecting side; nothing else flows
  // until the proof is checked. Empty: no authentication.
  std::string auth_token;
  Duration auth_timeout = std::chrono::seconds(10);
  // TLS 1.3 with mutual authentication under every connection (pscore/comm/tls.h): nothing but
  // the handshake flows until both certificates are verified against the CA, then the
  // token handshake (if any) and frames run inside it. Null: plaintext.
  std::shared_ptr<TlsContext> tls;
  // A TLS handshake not finished this long after the connection opened closes it.
  Duration tls_handshake_timeout = std::chrono::seconds(10);
};

struct ConnectOptions {
  Duration timeout = std::chrono::seconds(10);         // give up after this long
  Duration initial_backoff = std::chrono::milliseconds(20);
  Duration max_backoff = std::chrono::seconds(1);
  // TCP_USER_TIMEOUT on the connection once it is open: data the peer has not acknowledged
  // for this long closes it (kUnavailable), as a peer that went silent (a cut link, a
  // blackholed route) otherwise leaves it open for the kernel's retries, about 15 minutes.
  // Zero: the kernel's default.
  Duration user_timeout = Duration::zero();
};

// Frames and bytes (whole frames: header, meta, payload) of one command number.
struct CommandStats {
  int cmd = 0;  // the NodeCommand number, or kOtherCommand
  uint64_t frames_in = 0;
  uint64_t frames_out = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
};

// The transport counts commands 0 .. kCommandSlots - 2 one by one (the protocol's numbers
// are all below that) and every other number, negative ones included, together as
// kOtherCommand: a peer sending made-up numbers cannot grow the counters.
inline constexpr int kCommandSlots = 64;
inline constexpr int kOtherCommand = -1;

struct TransportStats {
  uint64_t frames_in = 0;
  uint64_t frames_out = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t connections_opened = 0;
  uint64_t connections_closed = 0;
  uint64_t protocol_errors = 0;
  uint64_t connections_refused = 0;  // over max_accepted_connections
  uint64_t silent_closed = 0;        // no whole frame within first_frame_timeout
  uint64_t incomplete_cap_closed = 0;    // a frame needed more than the incomplete-frame budget left
  uint64_t queued_cap_closed = 0;        // over max_queued_write_bytes
  uint64_t total_queued_cap_closed = 0;  // over a fair share when the total queued was at its cap
  uint64_t queued_write_bytes = 0;       // now: queued or in flight, all connections
  uint64_t tls_handshakes = 0;           // TLS handshakes completed
  uint64_t tls_failures = 0;             // connections closed before their TLS handshake completed
};

}  // namespace pscore::comm
