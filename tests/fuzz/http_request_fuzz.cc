// libFuzzer target: the HTTP request path of comm::HttpServer (http-parser callbacks,
// header/body limits, target and query decoding, pipelining, keep-alive, answers and
// streams). The parser is reachable only through a connection, so the input goes where a
// client's bytes go: one server listens on 127.0.0.1 (ephemeral port) on a shared loop;
// per input a blocking client connects, writes the input, half-closes and reads until the
// server closes (a server that neither answers nor closes within 5 s is a hang: trap).
// The handler answers like the real surfaces do: plain answers, a chunked stream
// (path /stream), a close without answer (path /close). Small limits make the 413/431
// paths reachable. The client closes with a reset, so no TIME_WAIT piles up.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <string>

#include <glog/logging.h>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/http_server.h"

namespace {

using pscore::comm::HttpConnId;
using pscore::comm::HttpRequest;
using pscore::comm::HttpServer;

struct Fixture {
  pscore::comm::EventLoop loop{"fuzz-http"};
  std::unique_ptr<HttpServer> server;
  int port = 0;
};

void Handle(HttpServer* s, HttpConnId id, HttpRequest&& req) {
  if (req.path == "/close") return s->Close(id);
  if (req.path == "/stream") {
    if (!s->StartStream(id, 200, "text/plain").ok()) return;
    auto it = req.query.find("chunk");
    s->SendChunk(id, std::make_shared<const std::string>(it == req.query.end() ? "chunk" : it->second))
        .IgnoreError();
    return s->Close(id);
  }
  std::string body = req.method + " " + req.path + " q=" + std::to_string(req.query.size()) +
                     " h=" + std::to_string(req.headers.size()) + " b=" + std::to_string(req.body.size());
  for (const auto& [k, v] : req.query) body += "\n" + k + "=" + v;
  int status = req.method == "GET" ? 200 : (req.body.empty() ? 400 : 201);
  s->Respond(id, status, "text/plain", body).IgnoreError();
}

Fixture* Shared() {
  static Fixture* f = [] {
    auto* fx = new Fixture;  // lives until exit
    if (!fx->loop.Start().ok()) __builtin_trap();
    std::promise<int> bound;
    fx->loop.Post([fx, &bound] {
      pscore::comm::HttpServerOptions o;
      o.max_header_bytes = 2048;
      o.max_body_bytes = 4096;
      o.request_timeout = std::chrono::seconds(3);
      fx->server = std::make_unique<HttpServer>(&fx->loop, o, [fx](HttpConnId id, HttpRequest&& req) {
        Handle(fx->server.get(), id, std::move(req));
      });
      auto port = fx->server->Listen("127.0.0.1", 0);
      bound.set_value(port.ok() ? *port : -1);
    });
    fx->port = bound.get_future().get();
    if (fx->port <= 0) __builtin_trap();
    return fx;
  }();
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  FLAGS_minloglevel = 3;  // every bad request is logged; keep the fuzzer's output readable
  Shared();
  return 0;
}

// A connected client socket. Thousands of short connections a second leave their
// ports in TIME_WAIT (the client closes second); rotating the source address over
// 127.0.0.0/8 multiplies the ports there are, and a momentary shortage is waited out.
// libFuzzer's -timeout watchdog is a SIGALRM installed without SA_RESTART, so a connect
// that is waiting for the server's accept queue fails with EINTR now and then: retried
// on a fresh socket. Any other failure to connect is the server's fault.
static int ConnectClient(int port) {
  static uint32_t next_source = 0;
  for (int attempt = 0; attempt < 500; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) __builtin_trap();
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(0x7f000000u | (1 + next_source++ % 0xfffe) << 8 | 1);  // 127.a.b.1
    if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) __builtin_trap();
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    const int err = errno;
    close(fd);
    if (err == EINTR) continue;
    if (err != EADDRNOTAVAIL && err != EAGAIN && err != EADDRINUSE) {
      fprintf(stderr, "http_request_fuzz: connect: %s\n", strerror(err));
      __builtin_trap();
    }
    usleep(10000);
  }
  __builtin_trap();  // no port for 5 s
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture* fx = Shared();
  int fd = ConnectClient(fx->port);
  size_t sent = 0;
  while (sent < size) {
    ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server may close early (a bad request): fine
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n > 0) continue;
    if (n == 0 || errno == ECONNRESET) break;
    if (errno == EINTR) continue;
    fprintf(stderr, "http_request_fuzz: recv: %s\n", strerror(errno));
    __builtin_trap();  // EAGAIN after 5 s: the server neither answered nor closed
  }
  linger lg{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(fd);
  return 0;
}
