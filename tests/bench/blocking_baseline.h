// The blocking-socket baseline the transport and data-plane benchmarks compare against:
// a connected loopback TCP pair (TCP_NODELAY both ends) and length-prefixed messages
// (an 8-byte length, then the payload) written with writev and read with read. Each
// benchmark times its own loops over these.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include <glog/logging.h>

namespace pscore::bench {

struct SocketPair {
  int client = -1;
  int server = -1;
  void Close() {
    ::close(client);
    ::close(server);
  }
};

inline SocketPair ConnectedPair() {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  CHECK_EQ(::listen(lfd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  SocketPair p;
  p.client = ::socket(AF_INET, SOCK_STREAM, 0);
  CHECK_EQ(::connect(p.client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  p.server = ::accept(lfd, nullptr, nullptr);
  ::close(lfd);
  int one = 1;
  ::setsockopt(p.client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(p.server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return p;
}

// One message: its length, then its bytes, in as few writev calls as the socket allows.
inline void SendMessage(int fd, const char* data, uint64_t size) {
  iovec iov[2] = {{&size, sizeof(size)}, {const_cast<char*>(data), size}};
  iovec* v = iov;
  int n = 2;
  while (n > 0) {
    ssize_t w = ::writev(fd, v, n);
    CHECK_GT(w, 0);
    size_t left = static_cast<size_t>(w);
    while (n > 0 && left >= v->iov_len) {
      left -= v->iov_len;
      ++v;
      --n;
    }
    if (n > 0) {
      v->iov_base = static_cast<char*>(v->iov_base) + left;
      v->iov_len -= left;
    }
  }
}

inline void ReadFull(int fd, char* out, size_t n) {
  while (n > 0) {
    ssize_t r = ::read(fd, out, n);
    CHECK_GT(r, 0);
    out += r;
    n -= static_cast<size_t>(r);
  }
}

// One message into `buf` (grown when needed, never shrunk: reused across calls); its size.
inline uint64_t RecvMessage(int fd, std::vector<char>* buf) {
  uint64_t size = 0;
  ReadFull(fd, reinterpret_cast<char*>(&size), sizeof(size));
  if (buf->size() < size) buf->resize(size);
  ReadFull(fd, buf->data(), size);
  return size;
}

}  // namespace pscore::bench
