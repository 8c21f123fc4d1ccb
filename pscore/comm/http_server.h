// HttpServer: a small HTTP/1.1 server on an EventLoop, parsing with Debian's http-parser.
// Serves one request at a time per connection (pipelined requests wait their turn),
// plain responses with keep-alive, and chunked streams. Bounded everywhere: headers,
// body, connections, request time, idle time, queued output. Loop thread only after
// construction; owned by whoever serves HTTP (the scheduler's HTTP layer, tests).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pscore/comm/alive.h"
#include "pscore/comm/conn_sweep.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/tcp_listener.h"
#include "pscore/core/status.h"

struct uv_tcp_s;

namespace pscore::comm {

class TlsContext;

using HttpConnId = uint64_t;
// Extra response header lines (name, value), in order.
using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // without the query
  std::map<std::string, std::string> query;  // percent-decoded; last value wins
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  bool keep_alive = true;
  std::string peer_identity;  // HTTPS: the CN of the client's verified certificate; "" without TLS
};

struct HttpServerOptions {
  size_t max_header_bytes = 16 << 10;  // request line + headers: more is 431
  size_t max_body_bytes = 64 << 10;    // more is 413
  size_t max_connections = 4096;       // more are accepted and closed at once
  // A started request must complete within this, counted from its first byte.
  Duration request_timeout = std::chrono::seconds(10);
  // A connection with no request started is closed this long after it began waiting (its
  // accept or its last answer), whatever stray bytes it sends meanwhile.
  Duration idle_timeout = std::chrono::seconds(60);
  uint64_t max_queued_bytes = 64ull << 20;  // unsent output above this closes the peer
  // HTTPS (pscore/comm/tls.h): TLS 1.3, the client must present a certificate the cluster CA
  // signed. A handshake not done within request_timeout closes the connection. Null: HTTP.
  std::shared_ptr<TlsContext> tls;
};

struct HttpServerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_refused = 0;  // over max_connections
  uint64_t requests = 0;
  uint64_t bad_requests = 0;  // parse errors, oversized, timed out
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
};

class HttpServer {
 public:
  using Handler = std::function<void(HttpConnId, HttpRequest&&)>;

  HttpServer(EventLoop* loop, HttpServerOptions options, Handler handler);
  ~HttpServer();  // Closes everything (on the loop thread or after it stopped).
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens (numeric host or "localhost"); port 0 picks one. Returns the port.
  Result<int> Listen(const std::string& host, int port);
  // Answers the connection's current request. Closes afterwards unless keep-alive.
  Status Respond(HttpConnId id, int status, const std::string& content_type, std::string body);
  // The same with extra header lines (e.g. Allow on a 405). Names and values are the
  // caller's constants: they must not hold CR, LF (or ':' in a name).
  Status Respond(HttpConnId id, int status, const std::string& content_type, std::string body,
                 const HttpHeaders& headers);
  // Starts a chunked response; the connection then only carries chunks until closed.
  // For a HEAD request only the headers go out, the connection closes after them, and
  // the answer is kCancelled (no chunks to send). Respond to a HEAD sends the headers
  // a GET would get (Content-Length of `body`) without the body.
  Status StartStream(HttpConnId id, int status, const std::string& content_type);
  // One chunk; `data` is shared, not copied (many streams may send the same bytes).
  Status SendChunk(HttpConnId id, std::shared_ptr<const std::string> data);
  // Ends a stream: its last (empty) chunk, then the connection closes once the queued
  // output is written.
  Status EndStream(HttpConnId id);
  void Close(HttpConnId id);
  // fn runs once when the connection closes (at once if it is already closed).
  void WatchClose(HttpConnId id, std::function<void()> fn);
  uint64_t QueuedBytes(HttpConnId id) const;
  bool IsOpen(HttpConnId id) const { return conns_.count(id) != 0; }
  size_t num_connections() const { return conns_.size(); }
  const HttpServerStats& stats() const { return stats_; }
  const HttpServerOptions& options() const { return options_; }
  // Closes the listener and every connection. Idempotent.
  void Shutdown();

  // Internal (trampolines in the .cc).
  struct Conn;
  void OnAccept(uv_tcp_s* tcp);
  // Plaintext received (HTTPS: decrypted).
  void OnRead(Conn* c, const char* data, size_t n);
  void OnConnClosed(Conn* c);
  // Some output was written: a connection answered for good closes once all of it is.
  void OnWritten(Conn* c);

 private:
  // Queues head, body (shared, not copied) and tail on the connection's stream and writes.
  Status Write(Conn* c, std::string head, std::shared_ptr<const std::string> body, std::string tail);
  void Feed(Conn* c);
  // Refuses the connection's request: the answer `status`, then the connection closes
  // (after a linger, see Linger); a late answer to the request is dropped.
  void Fail(Conn* c, int status, const std::string& why);
  void Linger(Conn* c);
  void CloseConn(Conn* c);
  void Sweep();
  Conn* Find(HttpConnId id) const;

  EventLoop* loop_;
  HttpServerOptions options_;
  Handler handler_;
  TcpListener* listener_ = nullptr;  // closes itself (Shutdown)
  std::unordered_map<HttpConnId, Conn*> conns_;  // owned; freed in the close callback
  HttpConnId next_id_ = 1;
  ConnSweep sweep_;
  uint64_t stop_hook_ = 0;
  bool shut_down_ = false;
  HttpServerStats stats_;
  AcceptCap accept_cap_{"http", options_.max_connections};
  AliveToken alive_;  // expires at Shutdown
};

// Reason phrase of a status code ("Not Found"), http-parser's; "Unknown" for a code it
// does not know.
const char* HttpReason(int status);

// The JSON body of every pscore HTTP answer: {"code":<pscore::Code number, 0 = ok>,
// "message":M,"data":D} (D null in the first form).
std::string JsonEnvelope(Code code, const std::string& message);
std::string JsonEnvelope(Code code, const std::string& message, const nlohmann::json& data);
// A JSON value as compact text, invalid UTF-8 in its strings replaced rather than thrown on.
std::string JsonText(const nlohmann::json& j);

}  // namespace pscore::comm
