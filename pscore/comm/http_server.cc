#include "pscore/comm/http_server.h"

#include <uv.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "pscore/comm/http_internal.h"
#include "pscore/comm/tcp_listener.h"
#include "pscore/comm/tls.h"
#include "pscore/comm/uv_status.h"

namespace pscore::comm {

namespace {

// After a refusal is written, how long the client may take to stop sending and close.
constexpr Duration kLinger = std::chrono::seconds(2);

// One read buffer for all connections: libuv fills it (HTTPS: the session decrypts into
// it) and OnRead consumes it at once.
thread_local char g_read_buf[64 << 10];

}  // namespace

const char* HttpReason(int status) {
  const char* reason = http_status_str(static_cast<http_status>(status));
  return std::strcmp(reason, "<unknown>") == 0 ? "Unknown" : reason;
}

std::string JsonText(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string JsonEnvelope(Code code, const std::string& message, const nlohmann::json& data) {
  return JsonText({{"code", static_cast<int>(code)}, {"message", message}, {"data", data}});
}

std::string JsonEnvelope(Code code, const std::string& message) { return JsonEnvelope(code, message, nullptr); }

HttpServer::HttpServer(EventLoop* loop, HttpServerOptions options, Handler handler)
    : loop_(loop), options_(options), handler_(std::move(handler)) {}

HttpServer::~HttpServer() {
  loop_->RunAndWait([this] { Shutdown(); });
}

// Every answer is queued through libuv, so it completes in a later callback (OnWritten),
// never inside the Respond that wrote it.
HttpServer::Conn::Conn(HttpServer* owner, EventLoop* loop, uv_tcp_t* tcp)
    : stream(this, loop, tcp, StreamConn::Options{/*always_queue=*/true}), server(owner) {}

char* HttpServer::Conn::ReadRegion(size_t* size) {
  *size = sizeof(g_read_buf);
  return g_read_buf;
}

void HttpServer::Conn::OnStreamBytes(const char* data, size_t n) {
  if (n == 0 || server == nullptr || closing) return;
  server->OnRead(this, data, n);
}

void HttpServer::Conn::OnStreamFailed(Failure what, const Status& why) {
  if (server == nullptr) return stream.Close();
  if (what == Failure::kHandshake) {
    LOG(ERROR) << "https: conn " << id << ": " << why.message();
    ++server->stats_.bad_requests;
  } else if (what == Failure::kTlsRead && why.code() != Code::kUnavailable) {
    LOG(ERROR) << "https: conn " << id << ": " << why.message();
  }
  server->CloseConn(this);
}

void HttpServer::Conn::OnBatchDone(const WriteBatch& batch) {
  queued -= std::min<uint64_t>(queued, batch.bytes);
  write_progress = SteadyClock().Now();
}

void HttpServer::Conn::OnStreamWritten() {
  write_progress = SteadyClock().Now();
  if (server != nullptr) server->OnWritten(this);
}

void HttpServer::Conn::OnStreamClosed() {
  if (server != nullptr) server->OnConnClosed(this);
  delete this;
}

Result<int> HttpServer::Listen(const std::string& host, int port) {
  DCHECK(loop_->InLoopThread());
  if (listener_ != nullptr) return Status(Code::kFailedPrecondition, "http server already listening");
  TcpListener::Callbacks cb;
  cb.admit = [this] {
    if (accept_cap_.Admit(conns_.size())) return true;
    ++stats_.connections_refused;
    return false;
  };
  cb.accepted = [this](uv_tcp_s* tcp) { OnAccept(tcp); };
  Result<TcpListener*> l = TcpListener::Open(loop_, host, port, "http", std::move(cb));
  if (!l.ok()) return Status(l.status().code(), "http: " + l.status().message());
  listener_ = *l;
  sweep_.Start(loop_, ConnSweep::Period(std::min(options_.request_timeout, options_.idle_timeout), std::chrono::seconds(1)),
               [this] { Sweep(); });
  stop_hook_ = loop_->AddStopHook([this] {
    stop_hook_ = 0;
    Shutdown();
  });
  LOG(INFO) << "http listening on " << listener_->address();
  return listener_->port();
}

void HttpServer::OnAccept(uv_tcp_s* tcp) {
  DCHECK(loop_->InLoopThread());
  auto* c = new Conn(this, loop_, tcp);
  c->id = next_id_++;
  c->awaiting_since = SteadyClock().Now();
  http_parser_init(&c->parser, HTTP_REQUEST);
  c->parser.data = c;
  uv_tcp_nodelay(tcp, 1);
  conns_[c->id] = c;
  ++stats_.connections_accepted;
  if (options_.tls != nullptr) c->stream.StartTls(options_.tls, /*server=*/true).IgnoreError();  // server: waits
  Status st = c->stream.StartReading();
  if (!st.ok()) {
    LOG(WARNING) << "http: conn " << c->id << ": " << st;
    CloseConn(c);
  }
}

void HttpServer::OnRead(Conn* c, const char* data, size_t n) {
  DCHECK(loop_->InLoopThread());
  stats_.bytes_in += n;
  if (c->streaming || c->refused) return;  // nothing more to parse here: discarded
  if (c->pending.size() + n > options_.max_header_bytes + options_.max_body_bytes + 4096) {
    return Fail(c, 413, "request over the limit of " + std::to_string(options_.max_body_bytes) +
                            " body bytes (max_body_bytes) and " + std::to_string(options_.max_header_bytes) +
                            " header bytes");
  }
  c->pending.append(data, n);
  Feed(c);
}

// Parses pending input until a complete request is handed out, the input runs dry, or
// the connection fails. Re-entrancy safe: a handler answering inline just continues it.
void HttpServer::Feed(Conn* c) {
  DCHECK(loop_->InLoopThread());
  if (c->in_feed) return;
  c->in_feed = true;
  const HttpConnId id = c->id;
  while (!c->closing && !c->busy && !c->streaming && !c->pending.empty()) {
    size_t used = http_parser_execute(&c->parser, &HttpSettings(), c->pending.data(), c->pending.size());
    http_errno err = HTTP_PARSER_ERRNO(&c->parser);
    if (err == HPE_PAUSED) {
      http_parser_pause(&c->parser, 0);
    } else if (err != HPE_OK) {
      c->in_feed = false;
      if (c->fail_status == 413) {
        return Fail(c, 413, "request body over the limit of " + std::to_string(options_.max_body_bytes) +
                                " bytes (max_body_bytes)");
      }
      if (c->fail_status == 431) {
        return Fail(c, 431, "request line and headers over the limit of " +
                                std::to_string(options_.max_header_bytes) + " bytes (max_header_bytes)");
      }
      return Fail(c, 400, std::string("bad request: ") + http_errno_description(err));
    }
    c->pending.erase(0, used);
    if (!c->ready) break;
    c->ready = false;
    if (!ParseTarget(c->url, &c->req)) {
      c->in_feed = false;
      return Fail(c, 400, "bad request target");
    }
    c->busy = true;
    ++stats_.requests;
    c->req.peer_identity = c->stream.peer_identity();
    handler_(id, std::move(c->req));
    if (Find(id) != c) return;  // closed inside the handler (c is still valid until its close callback)
  }
  c->in_feed = false;
}

Status HttpServer::Write(Conn* c, std::string head, std::shared_ptr<const std::string> body, std::string tail) {
  DCHECK(loop_->InLoopThread());
  if (c->closing) return Status(Code::kUnavailable, "http connection " + std::to_string(c->id) + " is closing");
  if (c->stream.tls() && !c->stream.tls_established()) {
    CloseConn(c);
    return Status(Code::kFailedPrecondition, "https: answer before the TLS handshake");
  }
  WriteBatch& b = c->stream.batch();
  const uint64_t bytes = head.size() + (body ? body->size() : 0) + tail.size();
  Payload payload;
  if (body && !body->empty()) payload.tail.push_back(Slice{body, body->data(), body->size()});
  char* at = b.Add(head.size(), std::move(payload));
  if (!head.empty()) std::memcpy(at, head.data(), head.size());
  if (!tail.empty()) std::memcpy(b.Add(tail.size(), Payload()), tail.data(), tail.size());
  b.bytes += bytes;
  if (c->unsent() == 0) c->write_progress = SteadyClock().Now();
  c->queued += bytes;
  stats_.bytes_out += bytes;
  c->stream.Flush();
  if (c->closing) return Status(Code::kUnavailable, "http connection " + std::to_string(c->id) + " failed writing");
  if (c->unsent() > options_.max_queued_bytes) {
    LOG(WARNING) << "http: conn " << c->id << " has " << c->unsent() << " unsent bytes; closing";
    CloseConn(c);
    return Status(Code::kResourceExhausted, "http peer not reading");
  }
  return Status::Ok();
}

void HttpServer::OnWritten(Conn* c) {
  if (!c->close_after_write || !c->stream.drained() || c->closing) return;
  if (c->refused) return Linger(c);
  CloseConn(c);
}

// A client refused mid-upload is still sending: closing now, with its bytes unread, would
// reset the connection and could destroy the refusal before the client reads it. So the
// write side is shut (the client sees the answer, then end of stream) and its input is
// discarded until it closes, or kLinger passes (Sweep).
void HttpServer::Linger(Conn* c) {
  c->lingering = true;
  c->linger_since = SteadyClock().Now();
  if (!c->stream.ShutdownWrite()) CloseConn(c);
}

Status HttpServer::Respond(HttpConnId id, int status, const std::string& content_type, std::string body) {
  return Respond(id, status, content_type, std::move(body), {});
}

Status HttpServer::Respond(HttpConnId id, int status, const std::string& content_type, std::string body,
                           const HttpHeaders& headers) {
  DCHECK(loop_->InLoopThread());
  Conn* c = Find(id);
  if (c == nullptr) return Status(Code::kNotFound, "http connection " + std::to_string(id) + " is closed");
  if (c->refused) return Status(Code::kCancelled, "http connection " + std::to_string(id) + " was refused: answer dropped");
  if (!c->busy || c->streaming) return Status(Code::kFailedPrecondition, "no request to answer");
  const bool keep = c->parser.http_errno == HPE_OK && c->fail_status == 0 && c->req.keep_alive &&
                    !c->close_after_write;
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + HttpReason(status) +
                     "\r\nContent-Type: " + content_type + "\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\nConnection: " + (keep ? "keep-alive" : "close") +
                     "\r\n";
  for (const auto& [name, value] : headers) {
    // Our own constants, never client input: a CR or LF here would split the response.
    DCHECK(name.find_first_of("\r\n:") == std::string::npos && value.find_first_of("\r\n") == std::string::npos);
    head += name + ": " + value + "\r\n";
  }
  head += "\r\n";
  c->busy = false;
  c->awaiting_since = SteadyClock().Now();
  if (!keep) c->close_after_write = true;
  // RFC 9110 9.3.2: a HEAD answer has the headers a GET would get (Content-Length too), no body.
  if (c->head_only) body.clear();
  PSCORE_RETURN_IF_ERROR(Write(c, std::move(head), std::make_shared<const std::string>(std::move(body)), ""));
  if (!keep || c->pending.empty() || c->in_feed) return Status::Ok();
  // A pipelined request is waiting: parse it on a later turn, never inside the caller.
  loop_->Post([this, id, alive = alive_.watch()] {
    if (!alive) return;
    if (Conn* conn = Find(id)) Feed(conn);
  });
  return Status::Ok();
}

Status HttpServer::StartStream(HttpConnId id, int status, const std::string& content_type) {
  DCHECK(loop_->InLoopThread());
  Conn* c = Find(id);
  if (c == nullptr) return Status(Code::kNotFound, "http connection " + std::to_string(id) + " is closed");
  if (c->refused) return Status(Code::kCancelled, "http connection " + std::to_string(id) + " was refused: no stream");
  if (!c->busy || c->streaming) return Status(Code::kFailedPrecondition, "no request to answer");
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + HttpReason(status) +
                     "\r\nContent-Type: " + content_type + "\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache\r\n";
  if (c->head_only) {
    // The stream's headers and nothing more: the answer ends here, and so does the connection.
    c->close_after_write = true;
    c->pending.clear();
    PSCORE_RETURN_IF_ERROR(Write(c, std::move(head) + "Connection: close\r\n\r\n", nullptr, ""));
    return Status(Code::kCancelled, "HEAD request: headers only, no stream");
  }
  c->streaming = true;
  c->pending.clear();
  return Write(c, std::move(head) + "Connection: keep-alive\r\n\r\n", nullptr, "");
}

Status HttpServer::SendChunk(HttpConnId id, std::shared_ptr<const std::string> data) {
  DCHECK(loop_->InLoopThread());
  Conn* c = Find(id);
  if (c == nullptr) return Status(Code::kNotFound, "http connection " + std::to_string(id) + " is closed");
  if (!c->streaming) return Status(Code::kFailedPrecondition, "connection is not streaming");
  if (!data || data->empty()) return Status::Ok();  // an empty chunk would end the stream
  char size[24];
  snprintf(size, sizeof(size), "%zx\r\n", data->size());
  return Write(c, size, std::move(data), "\r\n");
}

Status HttpServer::EndStream(HttpConnId id) {
  DCHECK(loop_->InLoopThread());
  Conn* c = Find(id);
  if (c == nullptr) return Status(Code::kNotFound, "http connection " + std::to_string(id) + " is closed");
  if (!c->streaming) return Status(Code::kFailedPrecondition, "connection is not streaming");
  if (c->close_after_write) return Status::Ok();  // already ending
  c->close_after_write = true;
  PSCORE_RETURN_IF_ERROR(Write(c, "0\r\n\r\n", nullptr, ""));
  if (c->stream.drained() && !c->closing) CloseConn(c);
  return Status::Ok();
}

void HttpServer::Fail(Conn* c, int status, const std::string& why) {
  DCHECK(loop_->InLoopThread());
  ++stats_.bad_requests;
  VLOG(1) << "http: conn " << c->id << " " << status << " " << why;
  // Same shape as the node layer's answers: code is a pscore::Code number.
  Code code = status == 408 ? Code::kTimeout : status == 400 ? Code::kInvalidArgument : Code::kResourceExhausted;
  std::string text = JsonEnvelope(code, why);
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + HttpReason(status) +
                     "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(text.size()) +
                     "\r\nConnection: close\r\n\r\n";
  c->busy = true;  // nothing more is parsed on this connection
  c->close_after_write = true;
  c->pending.clear();
  if (c->streaming || c->refused) return CloseConn(c);
  c->refused = true;  // and a late answer to its request is dropped
  Write(c, std::move(head), std::make_shared<const std::string>(std::move(text)), "").IgnoreError();  // closes on error
}

void HttpServer::Close(HttpConnId id) {
  DCHECK(loop_->InLoopThread());
  if (Conn* c = Find(id)) CloseConn(c);
}

void HttpServer::CloseConn(Conn* c) {
  DCHECK(loop_->InLoopThread());
  if (c->closing) return;
  c->closing = true;
  c->stream.Close();  // Conn::OnStreamClosed frees c
}

void HttpServer::OnConnClosed(Conn* c) {
  conns_.erase(c->id);
  std::vector<std::function<void()>> watchers;
  watchers.swap(c->watchers);
  for (auto& fn : watchers) fn();
}

void HttpServer::WatchClose(HttpConnId id, std::function<void()> fn) {
  DCHECK(loop_->InLoopThread());
  Conn* c = Find(id);
  if (c == nullptr) return fn();
  c->watchers.push_back(std::move(fn));
}

uint64_t HttpServer::QueuedBytes(HttpConnId id) const {
  Conn* c = Find(id);
  return c == nullptr ? 0 : c->unsent();
}

HttpServer::Conn* HttpServer::Find(HttpConnId id) const {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second;
}

// Cuts off requests that take too long to arrive, keep-alive connections left idle, and
// peers that do not take their answers: output waiting with no answer written for the
// request timeout (a client that pipelines requests and never reads would otherwise hold
// up to max_queued_bytes each, for good; so would one sent a 4xx it never reads).
// Streams are exempt: their subscribers are policed by whoever feeds them.
void HttpServer::Sweep() {
  DCHECK(loop_->InLoopThread());
  TimePoint now = SteadyClock().Now();
  std::vector<Conn*> slow, idle, stalled;
  for (auto& [id, c] : conns_) {
    if (c->closing || c->streaming) continue;
    if (c->stream.tls() && !c->stream.tls_established() && now - c->awaiting_since > options_.request_timeout) {
      LOG(ERROR) << "https: conn " << c->id << ": TLS handshake not finished within "
                 << ToMillis(options_.request_timeout) << " ms";
      idle.push_back(c);
      continue;
    }
    if (c->lingering) {
      if (now - c->linger_since > kLinger) idle.push_back(c);
      continue;
    }
    if (c->unsent() > 0 && now - c->write_progress > options_.request_timeout) {
      stalled.push_back(c);
      continue;
    }
    if (c->busy) continue;
    if (c->in_request) {
      if (now - c->request_started > options_.request_timeout) slow.push_back(c);
    } else if (!c->pending.empty()) {
      // Unparsed input waits only while an answer's write is handed off (Respond posts a
      // Feed); it has the request timeout from the moment the connection began waiting.
      if (now - c->awaiting_since > options_.request_timeout) slow.push_back(c);
    } else if (now - c->awaiting_since > options_.idle_timeout && c->unsent() == 0) {
      idle.push_back(c);
    }
  }
  for (Conn* c : slow) Fail(c, 408, "request not completed within " +
                                         std::to_string(ToMillis(options_.request_timeout)) + " ms");
  for (Conn* c : idle) CloseConn(c);
  for (Conn* c : stalled) {
    LOG(WARNING) << "http: conn " << c->id << " took no answer within " << ToMillis(options_.request_timeout) << " ms ("
                 << c->unsent() << " bytes waiting); closing";
    ++stats_.bad_requests;
    CloseConn(c);
  }
}

void HttpServer::Shutdown() {
  DCHECK(loop_->InLoopThread());
  if (shut_down_) return;
  shut_down_ = true;
  alive_.Expire();
  sweep_.Stop();
  if (stop_hook_ != 0) loop_->RemoveStopHook(stop_hook_);
  stop_hook_ = 0;
  if (listener_ != nullptr) {
    listener_->Close();
    listener_ = nullptr;
  }
  std::unordered_map<HttpConnId, Conn*> conns;
  conns.swap(conns_);
  for (auto& [id, c] : conns) {
    std::vector<std::function<void()>> watchers;
    watchers.swap(c->watchers);
    c->server = nullptr;
    if (c->streaming && c->stream.drained() && !c->closing) {
      // The stream ends here: its last chunk, so a client (curl) sees a complete answer.
      // Written now or never (the connection closes below); a reader that lags behind
      // (output still queued) is cut off.
      static constexpr char kLast[] = "0\r\n\r\n";
      c->stream.TryWriteNow(kLast, sizeof(kLast) - 1);
    }
    CloseConn(c);
    for (auto& fn : watchers) fn();
  }
}

}  // namespace pscore::comm
