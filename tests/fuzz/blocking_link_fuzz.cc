// libFuzzer target: comm::BlockingLink (PullSync's direct link) reading what a server sends.
// Input: the bytes a peer sends on the link, then it closes. The link dials a listener on
// 127.0.0.1 (bound once, port 0), the peer writes the input and shuts its side down, and
// the link makes calls (request ids 1, 2, ...) until it breaks or has made 8. Each answer
// is kept while the later calls read on: a small aligned answer is handed out as a view of
// the link's input buffer, so a held answer whose bytes change afterwards means the link
// wrote into a buffer it had lent (trap). Answers must respect the limits (trap), and the
// link must end every call (EOF at the end of the input: no call waits for its deadline).
// Small limits keep inputs meaningful: meta <= 512 bytes, message <= 64 KiB (payloads of
// 16 KiB and more take the direct read path).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pscore/comm/blocking_link.h"

namespace {

using pscore::comm::BlockingLink;
using pscore::comm::BlockingLinkOptions;
using pscore::comm::Frame;

constexpr uint64_t kMaxMessage = 64 << 10;
// The peer writes the whole input before the link reads: it must fit the socket buffers
// (the peer's send buffer is raised to hold it), so no writer thread is needed.
constexpr size_t kMaxInput = 80000;

// The listener every input dials (bound once per process, on an ephemeral port).
int Listener(int* port) {
  static int fd = -1;
  static int bound_port = 0;
  if (fd < 0) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 16) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      __builtin_trap();
    }
    bound_port = ntohs(a.sin_port);
  }
  *port = bound_port;
  return fd;
}

bool WriteAll(int fd, const uint8_t* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

struct Held {
  Frame frame;
  std::string bytes;  // the payload as it was when the call returned
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  int port = 0;
  const int listener = Listener(&port);
  BlockingLinkOptions options;
  options.limits.max_meta_bytes = 512;
  options.limits.max_message_bytes = kMaxMessage;
  auto link = BlockingLink::Dial("127.0.0.1", port, options);
  if (!link.ok()) __builtin_trap();  // loopback: the dial itself cannot fail
  const int peer = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (peer < 0) __builtin_trap();
  const int sndbuf = 1 << 20;
  ::setsockopt(peer, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  if (!WriteAll(peer, data, size)) __builtin_trap();
  ::shutdown(peer, SHUT_WR);

  std::vector<Held> held;
  const auto request = pscore::Buffer::FromString("request");
  for (int call = 0; call < 8 && !(*link)->broken(); ++call) {
    pscore::pb::MessageMeta meta;
    meta.set_cmd(pscore::pb::SEND_DATA);
    pscore::Result<Frame> answer = (*link)->Call(meta, request, std::chrono::seconds(10));
    if (!answer.ok()) {
      // The input ends in EOF: a call fails at once, never at its deadline.
      if (answer.status().code() == pscore::Code::kTimeout) __builtin_trap();
      continue;
    }
    if (!answer->meta.is_response() || answer->meta.request_id() != static_cast<uint64_t>(call + 1)) {
      __builtin_trap();
    }
    const size_t n = answer->payload ? answer->payload->size() : 0;
    if (n > kMaxMessage) __builtin_trap();
    Held h;
    h.bytes.assign(n != 0 ? answer->payload->data() : "", n);
    h.frame = std::move(*answer);
    held.push_back(std::move(h));
  }
  for (const Held& h : held) {
    const size_t n = h.frame.payload ? h.frame.payload->size() : 0;
    if (n != h.bytes.size() || (n != 0 && std::memcmp(h.frame.payload->data(), h.bytes.data(), n) != 0)) {
      __builtin_trap();  // written after it was handed out
    }
  }
  ::close(peer);
  return 0;
}
