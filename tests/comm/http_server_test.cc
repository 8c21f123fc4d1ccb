// HttpServer on a real loop with raw loopback clients: a stream's end, refused uploads
// (413 with the limit, delivered, not lost to a reset), and late answers after a refusal.
#include "comm/test_util.h"  // first: sets up Catch's CHECK

#include <poll.h>

#include <atomic>
#include <string>
#include <thread>

#include "pscore/comm/http_server.h"

namespace pscore::comm {
namespace {

using testing::OneShot;
using testing::OnLoop;
using testing::RawSocket;

// An HttpServer on its own loop, listening on 127.0.0.1:0; the handler gets the server.
class TestHttp {
 public:
  using Handler = std::function<void(HttpServer&, HttpConnId, HttpRequest&&)>;
  TestHttp(HttpServerOptions options, Handler handler) : loop_("http"), handler_(std::move(handler)) {
    REQUIRE(loop_.Start().ok());
    Result<int> port = OnLoop(loop_, [&]() -> Result<int> {
      server_ = std::make_unique<HttpServer>(&loop_, options, [this](HttpConnId id, HttpRequest&& req) {
        handler_(*server_, id, std::move(req));
      });
      return server_->Listen("127.0.0.1", 0);
    });
    REQUIRE(port.ok());
    port_ = *port;
  }
  ~TestHttp() { Stop(); }
  void Stop() {
    if (server_ == nullptr) return;
    server_.reset();  // shuts down on the loop
    CHECK(loop_.Stop().ok());
  }
  HttpServer& server() { return *server_; }
  EventLoop& loop() { return loop_; }
  int port() const { return port_; }

 private:
  EventLoop loop_;
  Handler handler_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
};

// Reads until the peer ends the stream (EOF or reset), `want` appears, or the deadline.
std::string ReadUntil(RawSocket& s, const std::string& want = "") {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string all;
  std::vector<char> buf(64 << 10);
  while (std::chrono::steady_clock::now() < end) {
    if (!want.empty() && all.find(want) != std::string::npos) break;
    pollfd p{s.fd(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t r = ::recv(s.fd(), buf.data(), buf.size(), 0);
    if (r <= 0) break;
    all.append(buf.data(), static_cast<size_t>(r));
  }
  return all;
}

bool Contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("http server: a stream ends with its last chunk when the server shuts down - curl exits 0 and not 18",
          "[comm][net][http]") {
  // Catch's assertions are for the test's thread: the handler (loop thread) only records.
  std::atomic<bool> streamed{false};
  TestHttp http(HttpServerOptions(), [&streamed](HttpServer& server, HttpConnId id, HttpRequest&&) {
    streamed = server.StartStream(id, 200, "application/x-ndjson").ok() &&
               server.SendChunk(id, std::make_shared<const std::string>("line\n")).ok();
  });
  RawSocket client;
  REQUIRE(client.Connect(http.port()));
  REQUIRE(client.SendAll("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string got = ReadUntil(client, "line\n\r\n");
  REQUIRE(Contains(got, "Transfer-Encoding: chunked"));
  http.Stop();  // the job ends: the server shuts down with the stream open
  CHECK(streamed);  // read once the loop thread is joined: the handler's calls both succeeded
  got += ReadUntil(client);
  INFO(got);
  CHECK(got.size() >= 12);
  CHECK(got.compare(got.size() - 12, 12, "line\n\r\n0\r\n\r\n") == 0);
}

TEST_CASE("http server: a Content-Length over the body limit gets a clean 413 naming the limit",
          "[comm][net][http]") {
  std::atomic<int> handled{0};
  TestHttp http(HttpServerOptions(), [&](HttpServer&, HttpConnId, HttpRequest&&) { ++handled; });
  RawSocket client;
  REQUIRE(client.Connect(http.port()));
  REQUIRE(client.SendAll("POST /admin/scale_out HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n"));
  std::string got = ReadUntil(client);
  INFO(got);
  CHECK(got.rfind("HTTP/1.1 413 Payload Too Large\r\n", 0) == 0);
  CHECK(Contains(got, "Connection: close"));
  CHECK(Contains(got, "over the limit of 65536 bytes"));
  CHECK_FALSE(Contains(got, "callback failed"));
  CHECK(handled == 0);
}

TEST_CASE("http server: a chunked upload of 100 MB gets 413 naming the limit - delivered, not lost to a reset",
          "[comm][net][http]") {
  std::atomic<int> handled{0};
  TestHttp http(HttpServerOptions(), [&](HttpServer&, HttpConnId, HttpRequest&&) { ++handled; });
  RawSocket client;
  REQUIRE(client.Connect(http.port()));
  REQUIRE(client.SendAll("POST /admin/scale_out HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  // The upload goes on while the answer comes back, as curl's would.
  std::thread upload([fd = client.fd()] {
    const std::string chunk = "100000\r\n" + std::string(1 << 20, 'u') + "\r\n";
    for (int i = 0; i < 100; ++i) {
      if (::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL) <= 0) return;  // refused: stop
    }
    ::send(fd, "0\r\n\r\n", 5, MSG_NOSIGNAL);
  });
  std::string got = ReadUntil(client);
  ::shutdown(client.fd(), SHUT_RDWR);  // ends the upload if it still runs
  upload.join();
  INFO(got.substr(0, 400));
  CHECK(got.rfind("HTTP/1.1 413 Payload Too Large\r\n", 0) == 0);
  CHECK(Contains(got, "over the limit of 65536 bytes"));
  CHECK_FALSE(Contains(got, "callback failed"));
  CHECK(handled == 0);
}

TEST_CASE("http server: a handler's late answer after the connection was refused with 413 is dropped",
          "[comm][net][http]") {
  OneShot<HttpConnId> late;
  std::atomic<bool> big_queued{false};  // recorded on the loop thread, checked on the test's
  TestHttp http(HttpServerOptions(), [&](HttpServer& server, HttpConnId id, HttpRequest&& req) {
    if (req.path == "/big") {
      // 8 MiB the client does not read yet: what follows waits behind it.
      big_queued = server.Respond(id, 200, "text/plain", std::string(8 << 20, 'b')).ok();
    } else {
      late.Set(id);  // answered later, by the test
    }
  });
  RawSocket client;
  REQUIRE(client.Connect(http.port()));
  REQUIRE(client.SendAll("GET /big HTTP/1.1\r\nHost: x\r\n\r\nGET /late HTTP/1.1\r\nHost: x\r\n\r\n"));
  const HttpConnId id = late.Get();
  REQUIRE(big_queued);
  // While the handler holds /late, more input than any request may hold: refused with 413.
  REQUIRE(client.SendAll(std::string(200 << 10, 'j')));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (OnLoop(http.loop(), [&] { return http.server().stats().bad_requests; }) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Status answer = OnLoop(http.loop(), [&] { return http.server().Respond(id, 200, "text/plain", "LATE ANSWER"); });
  INFO(answer);
  CHECK(answer.code() == Code::kCancelled);
  std::string got = ReadUntil(client);
  const size_t refusal = got.find("HTTP/1.1 413 Payload Too Large");
  INFO(got.size() << " bytes read");
  REQUIRE(refusal != std::string::npos);
  CHECK(refusal > (8u << 20));  // after the 8 MiB answer
  CHECK_FALSE(Contains(got.substr(refusal), "LATE ANSWER"));
}

}  // namespace pscore::comm
