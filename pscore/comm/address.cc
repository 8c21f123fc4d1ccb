#include "pscore/comm/address.h"

#include <uv.h>

#include <cstring>

namespace pscore::comm {

Status ResolveAddress(const std::string& host, int port, sockaddr_storage* out) {
  std::string h = host.empty() || host == "localhost" ? "127.0.0.1" : host;
  if (port < 0 || port > 65535) {
    return Status(Code::kInvalidArgument, "port " + std::to_string(port) + " out of range");
  }
  std::memset(out, 0, sizeof(*out));
  if (uv_ip4_addr(h.c_str(), port, reinterpret_cast<sockaddr_in*>(out)) == 0) return Status::Ok();
  if (uv_ip6_addr(h.c_str(), port, reinterpret_cast<sockaddr_in6*>(out)) == 0) return Status::Ok();
  return Status(Code::kInvalidArgument,
                "host '" + host + "' is not a numeric IP address (or localhost)");
}

Result<HostPort> ParseHostPort(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) {
    return Status(Code::kInvalidArgument, "address '" + std::string(address) + "' has no ':port'");
  }
  std::string_view digits = address.substr(colon + 1);
  if (digits.empty() || digits.size() > 5) {
    return Status(Code::kInvalidArgument, "address '" + std::string(address) + "' has no valid port");
  }
  int port = 0;
  for (char ch : digits) {
    if (ch < '0' || ch > '9') {
      return Status(Code::kInvalidArgument, "address '" + std::string(address) + "' has no valid port");
    }
    port = port * 10 + (ch - '0');
  }
  if (port > 65535) {
    return Status(Code::kInvalidArgument, "port " + std::to_string(port) + " out of range");
  }
  return HostPort{std::string(address.substr(0, colon)), port};
}

std::string JoinHostPort(const std::string& host, int port) { return host + ":" + std::to_string(port); }

int BoundPort(const uv_tcp_t* tcp) {
  sockaddr_storage bound{};
  int len = sizeof(bound);
  if (uv_tcp_getsockname(tcp, reinterpret_cast<sockaddr*>(&bound), &len) != 0) return 0;
  if (bound.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  if (bound.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return 0;
}

std::string PeerName(const uv_tcp_t* tcp) {
  sockaddr_storage addr{};
  int len = sizeof(addr);
  char ip[64] = "?";
  int port = 0;
  if (uv_tcp_getpeername(tcp, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    if (addr.ss_family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      uv_ip4_name(a, ip, sizeof(ip));
      port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      uv_ip6_name(a, ip, sizeof(ip));
      port = ntohs(a->sin6_port);
    }
  }
  return JoinHostPort(ip, port);
}

}  // namespace pscore::comm
