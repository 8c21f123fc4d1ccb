// Comm-internal: the HTTP server's connection state and request parsing, shared by
// http_server.cc and http_request.cc. Included only by those. A connection's bytes
// (socket, write queue, TLS) are its StreamConn's; the requests and answers are its own.
#pragma once

#include <http_parser.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pscore/comm/http_server.h"
#include "pscore/comm/stream_conn.h"

namespace pscore::comm {

// One accepted connection. Owned by the server through conns_; freed in the close callback.
struct HttpServer::Conn final : StreamUser {
  Conn(HttpServer* owner, EventLoop* loop, uv_tcp_t* tcp);
  // StreamUser (http_server.cc): the stream's reports go to the server while it is there.
  char* ReadRegion(size_t* size) override;
  void OnStreamBytes(const char* data, size_t n) override;
  void OnStreamTls() override {}
  void OnStreamFailed(Failure what, const Status& why) override;
  void OnBatchDone(const WriteBatch& batch) override;
  void OnStreamWritten() override;
  void OnStreamClosed() override;
  // Output not yet written: queued answers, and under TLS the ciphertext in flight.
  uint64_t unsent() const { return queued + stream.cipher_unsent(); }

  StreamConn stream;
  HttpServer* server = nullptr;  // null once the server shut down
  HttpConnId id = 0;
  http_parser parser;
  HttpRequest req;
  std::string url, field, value;
  bool last_was_value = false;
  size_t header_bytes = 0;
  int fail_status = 0;      // set by a callback that refuses the request (413, 431)
  bool in_request = false;  // a request has begun and is not complete
  bool ready = false;       // a complete request waits to be handed out
  bool busy = false;        // the handler holds the current request
  bool streaming = false;
  bool closing = false;
  bool close_after_write = false;
  bool in_feed = false;
  bool head_only = false;   // the current request is a HEAD: answers carry no body
  // The connection's request was refused (Fail): a late answer to it is dropped, and what
  // the client still sends is read and discarded, so the refusal is not lost to a reset.
  bool refused = false;
  bool lingering = false;   // refusal written, write side shut: waiting for the client's end
  TimePoint linger_since;
  TimePoint request_started;  // the current request's first byte (on_message_begin)
  // When the connection began waiting for its next request: accepted, or the previous
  // answer was sent. Bytes that do not start a request (stray CRLFs) do not move it, so
  // they cannot keep an idle connection alive.
  TimePoint awaiting_since;
  std::string pending;  // received bytes not yet parsed
  uint64_t queued = 0;  // answer bytes queued on the stream, not yet written (TLS: encrypted)
  TimePoint write_progress;  // when output last went up from none or some was written
  std::vector<std::function<void()>> watchers;
};

// http-parser's callbacks, filling the Conn a parser's data points to.
const http_parser_settings& HttpSettings();
// Splits the request target into path and percent-decoded query; false when unparsable.
bool ParseTarget(const std::string& url, HttpRequest* req);

}  // namespace pscore::comm
