// Socket addresses: the one parser of "host" and "host:port" in comm. Hosts are numeric
// IPv4/IPv6 addresses or "localhost" (no blocking DNS on a loop thread). Any thread.
#pragma once

#include <string>
#include <string_view>

#include "pscore/core/status.h"

struct sockaddr_storage;
struct uv_tcp_s;

namespace pscore::comm {

// host and port as a socket address: numeric IPv4/IPv6, or "localhost" / "" for 127.0.0.1.
Status ResolveAddress(const std::string& host, int port, ::sockaddr_storage* out);

struct HostPort {
  std::string host;
  int port = 0;
};
// "host:port" split at its last ':' (so "::1:80" is host "::1", port 80). The port must be
// a decimal number in 0..65535; the host is not checked here (ResolveAddress does).
Result<HostPort> ParseHostPort(std::string_view address);
std::string JoinHostPort(const std::string& host, int port);

// The local port a bound socket has (after binding port 0); 0 when unknown.
int BoundPort(const uv_tcp_s* tcp);
// The peer of a connected socket as "ip:port" ("?:0" when unknown).
std::string PeerName(const uv_tcp_s* tcp);

}  // namespace pscore::comm
