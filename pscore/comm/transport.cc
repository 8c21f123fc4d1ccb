#include "pscore/comm/transport.h"

#include <uv.h>

#include <algorithm>
#include <cstring>

#include "pscore/comm/connection.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/uv_status.h"

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

namespace {

// A HELLO carrying a nonce is the accepting side's token challenge (a node's own HELLO
// greeting carries none).
bool IsTokenChallenge(const Buffer& payload) {
  pb::HelloMessage hello;
  return hello.ParseFromArray(payload.data(), static_cast<int>(payload.size())) && !hello.nonce().empty();
}

}  // namespace

// A listening socket. Owned by the Transport until closed; freed in its close callback.
struct Listener {
  uv_tcp_t tcp;
  Transport* transport;
  std::string address;
};

// One outgoing connection attempt sequence (retry with backoff). Owned by the Transport.
struct Dialer {
  Transport* transport;
  sockaddr_storage addr;
  std::string target;
  ConnectOptions options;
  TimePoint deadline;
  Duration backoff;
  std::function<void(Result<ConnId>)> done;
  uv_tcp_t* tcp = nullptr;  // the attempt in flight, if any
  uv_connect_t req;
  TimerId retry_timer = 0;
  TimerId deadline_timer = 0;  // ends an attempt still in flight at the deadline
  bool timed_out = false;
  Status last_error;
  int attempts = 0;
};

namespace {

void CloseAndFree(uv_tcp_t* tcp) {
  tcp->data = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(tcp),
           [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
}

void Attempt(Dialer* d);
void RetryLater(Dialer* d, Status error);

void Finish(Dialer* d, Result<ConnId> result) {
  auto done = std::move(d->done);
  Transport* t = d->transport;
  if (t != nullptr) t->DialerDone(d);
  delete d;
  if (done) done(std::move(result));
}

void OnConnect(uv_connect_t* req, int status) {
  auto* d = static_cast<Dialer*>(req->data);
  uv_tcp_t* tcp = d->tcp;
  d->tcp = nullptr;
  if (d->deadline_timer != 0 && d->transport != nullptr) d->transport->loop()->CancelTimer(d->deadline_timer);
  d->deadline_timer = 0;
  if (d->timed_out) {
    // The deadline closed the attempt (a peer that drops SYNs would leave it to the
    // kernel's retries, about two minutes).
    Finish(d, Status(Code::kTimeout, "connect to " + d->target + ": no connection within " +
                                         std::to_string(ToMillis(d->options.timeout)) + " ms (" +
                                         std::to_string(d->attempts) + " attempts)"));
    return;
  }
  if (d->transport == nullptr || status == UV_ECANCELED) {
    if (status == 0) CloseAndFree(tcp);
    Finish(d, Status(Code::kCancelled, "connect to " + d->target + " cancelled"));
    return;
  }
  if (status == 0) {
    // The dial ends when the connection reports itself ready (after the token handshake,
    // if any). A peer that closes it during the handshake with no verdict (it refused the
    // connection at accept, or it restarted) is one more failed attempt; a refused proof
    // (kPermissionDenied) ends the dial. On shutdown the close answers it kCancelled.
    d->transport->Adopt(tcp, /*accepted=*/false, [d](Result<ConnId> r) {
      if (r.ok() || d->transport == nullptr || r.status().code() == Code::kPermissionDenied) {
        Finish(d, std::move(r));
        return;
      }
      RetryLater(d, r.status());
    });
    return;
  }
  CloseAndFree(tcp);
  RetryLater(d, UvStatus(status, "connect to " + d->target));
}

// A failed attempt: another after the backoff, or the dial ends if that would pass the
// deadline.
void RetryLater(Dialer* d, Status error) {
  d->last_error = std::move(error);
  TimePoint now = std::chrono::steady_clock::now();
  if (now + d->backoff >= d->deadline) {
    Finish(d, Status(d->last_error.code() == Code::kTimeout ? Code::kTimeout : Code::kUnavailable,
                     d->last_error.message() + " (gave up after " + std::to_string(d->attempts) +
                         " attempts)"));
    return;
  }
  VLOG(1) << d->last_error << "; retrying in " << ToMillis(d->backoff) << " ms";
  Duration wait = d->backoff;
  d->backoff = std::min<Duration>(d->backoff * 2, d->options.max_backoff);
  d->retry_timer = d->transport->loop()->AddTimer(wait, Duration::zero(), [d] {
    d->retry_timer = 0;
    Attempt(d);
  });
}

void Attempt(Dialer* d) {
  ++d->attempts;
  d->tcp = new uv_tcp_t;
  uv_tcp_init(d->transport->loop()->uv_loop(), d->tcp);
  d->req.data = d;
  int rc = uv_tcp_connect(&d->req, d->tcp, reinterpret_cast<const sockaddr*>(&d->addr), &OnConnect);
  if (rc < 0) {
    uv_tcp_t* tcp = d->tcp;
    d->tcp = nullptr;
    CloseAndFree(tcp);
    Finish(d, UvStatus(rc, "connect to " + d->target));
    return;
  }
  const Duration left = std::max<Duration>(Duration::zero(), d->deadline - std::chrono::steady_clock::now());
  d->deadline_timer = d->transport->loop()->AddTimer(left, Duration::zero(), [d] {
    d->deadline_timer = 0;
    if (d->tcp == nullptr) return;
    d->timed_out = true;  // OnConnect runs with UV_ECANCELED and ends the dial
    uv_tcp_t* tcp = d->tcp;
    d->tcp = nullptr;
    CloseAndFree(tcp);
  });
}

}  // namespace

Transport::Transport(EventLoop* loop, TransportOptions options, Handlers handlers)
    : loop_(loop), options_(std::move(options)), handlers_(std::move(handlers)) {
  if (options_.incomplete_frame_budget == nullptr) {
    options_.incomplete_frame_budget = std::make_shared<MemoryBudget>(options_.max_incomplete_frame_bytes);
  }
}

Transport::~Transport() {
  if (!shut_down_) {
    CHECK(loop_->InLoopThread()) << "Transport destroyed off its loop thread while open";
    Shutdown();
  }
}

void Transport::Shutdown() {
  DCHECK(loop_->InLoopThread());
  if (shut_down_) return;
  shut_down_ = true;
  if (stop_hook_ != 0) loop_->RemoveStopHook(stop_hook_);
  if (sweep_timer_ != 0) loop_->CancelTimer(sweep_timer_);
  for (Listener* l : listeners_) {
    uv_close(reinterpret_cast<uv_handle_t*>(&l->tcp),
             [](uv_handle_t* h) { delete static_cast<Listener*>(h->data); });
  }
  listeners_.clear();
  std::vector<Dialer*> dialers;
  dialers.swap(dialers_);
  for (Dialer* d : dialers) {
    d->transport = nullptr;
    if (d->deadline_timer != 0) loop_->CancelTimer(d->deadline_timer);
    d->deadline_timer = 0;
    if (d->retry_timer != 0) {
      loop_->CancelTimer(d->retry_timer);
      Finish(d, Status(Code::kCancelled, "connect to " + d->target + " cancelled"));
    } else if (d->tcp != nullptr) {
      // Answer now, while the owner of the callback is surely alive: it may be destroyed
      // before OnConnect runs (with UV_ECANCELED), which then only frees d.
      auto done = std::move(d->done);
      d->done = nullptr;
      uv_tcp_t* tcp = d->tcp;
      d->tcp = nullptr;
      CloseAndFree(tcp);
      if (done) done(Status(Code::kCancelled, "connect to " + d->target + " cancelled"));
    }
  }
  std::vector<ConnId> ids;
  for (auto& [id, c] : conns_) ids.push_back(id);
  for (ConnId id : ids) Close(id, Status(Code::kCancelled, "transport shut down"));
}

void Transport::DialerDone(Dialer* d) {
  dialers_.erase(std::remove(dialers_.begin(), dialers_.end(), d), dialers_.end());
}

Result<int> Transport::Listen(const std::string& host, int port) {
  DCHECK(loop_->InLoopThread());
  if (shut_down_) return Status(Code::kFailedPrecondition, "transport shut down");
  sockaddr_storage addr;
  PSCORE_RETURN_IF_ERROR(ResolveAddress(host, port, &addr));
  auto* l = new Listener{};
  l->transport = this;
  l->tcp.data = l;
  uv_tcp_init(loop_->uv_loop(), &l->tcp);
  auto fail = [l](Status st) {
    uv_close(reinterpret_cast<uv_handle_t*>(&l->tcp),
             [](uv_handle_t* h) { delete static_cast<Listener*>(h->data); });
    return st;
  };
  std::string where = host + ":" + std::to_string(port);
  int rc = uv_tcp_bind(&l->tcp, reinterpret_cast<const sockaddr*>(&addr), 0);
  if (rc < 0) return fail(UvStatus(rc, "bind " + where));
  rc = uv_listen(reinterpret_cast<uv_stream_t*>(&l->tcp), 1024, [](uv_stream_t* server, int status) {
    auto* listener = static_cast<Listener*>(server->data);
    if (status < 0) {
      LOG(WARNING) << "accept on " << listener->address << ": " << uv_strerror(status);
      return;
    }
    auto* tcp = new uv_tcp_t;
    uv_tcp_init(server->loop, tcp);
    if (uv_accept(server, reinterpret_cast<uv_stream_t*>(tcp)) != 0) {
      CloseAndFree(tcp);
      return;
    }
    if (!listener->transport->AdmitAccepted()) {
      CloseAndFree(tcp);
      return;
    }
    listener->transport->Adopt(tcp, /*accepted=*/true);
  });
  if (rc < 0) return fail(UvStatus(rc, "listen " + where));
  sockaddr_storage bound{};
  int len = sizeof(bound);
  uv_tcp_getsockname(&l->tcp, reinterpret_cast<sockaddr*>(&bound), &len);
  int bound_port = ntohs(bound.ss_family == AF_INET6
                             ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  l->address = host + ":" + std::to_string(bound_port);
  listeners_.push_back(l);
  if (stop_hook_ == 0) stop_hook_ = loop_->AddStopHook([this] { Shutdown(); });
  return bound_port;
}

void Transport::Connect(const std::string& host, int port, ConnectOptions options,
                        std::function<void(Result<ConnId>)> done) {
  DCHECK(loop_->InLoopThread());
  if (shut_down_) {
    done(Status(Code::kFailedPrecondition, "transport shut down"));
    return;
  }
  auto* d = new Dialer{};
  Status st = ResolveAddress(host, port, &d->addr);
  if (!st.ok()) {
    delete d;
    done(st);
    return;
  }
  d->transport = this;
  d->target = host + ":" + std::to_string(port);
  d->options = options;
  d->deadline = std::chrono::steady_clock::now() + options.timeout;
  d->backoff = options.initial_backoff;
  d->done = std::move(done);
  dialers_.push_back(d);
  if (stop_hook_ == 0) stop_hook_ = loop_->AddStopHook([this] { Shutdown(); });
  Attempt(d);
}

ConnId Transport::Adopt(uv_tcp_t* tcp, bool accepted, std::function<void(Result<ConnId>)> ready) {
  ConnId id = next_id_++;
  auto conn = std::make_unique<Connection>(this, loop_, id, tcp, options_, accepted);
  Status st = conn->StartReading();
  if (!st.ok()) {
    LOG(WARNING) << "conn " << id << " " << conn->peer() << ": " << st;
    conns_.emplace(id, std::move(conn));
    if (accepted) ++num_accepted_;  // Close counts it out again
    Close(id, st);
    if (ready) ready(st);
    return kNoConn;
  }
  VLOG(1) << "conn " << id << " " << (accepted ? "accepted from " : "connected to ") << conn->peer();
  conns_.emplace(id, std::move(conn));
  ++stats_.connections_opened;
  if (accepted) ++num_accepted_;
  if (sweep_timer_ == 0 && SweepPeriod().count() > 0) {
    sweep_timer_ = loop_->AddTimer(SweepPeriod(), SweepPeriod(), [this] { SweepStalled(); });
  }
  if (options_.tls != nullptr) {
    StartTls(id, accepted, std::move(ready));
  } else {
    AfterTls(id, accepted, std::move(ready));
  }
  return id;
}

void Transport::AfterTls(ConnId id, bool accepted, std::function<void(Result<ConnId>)> ready) {
  if (!options_.auth_token.empty()) {
    StartAuth(id, accepted, std::move(ready));
  } else {
    Opened(id, accepted, std::move(ready));
  }
}

void Transport::StartTls(ConnId id, bool accepted, std::function<void(Result<ConnId>)> ready) {
  Connection* c = Lookup(id);
  // Until the peer's certificate is verified nothing is decrypted, so no frame arrives.
  PendingAuth& p = pending_tls_[id];
  p.accepted = accepted;
  p.ready = std::move(ready);
  p.timer = loop_->AddTimer(options_.tls_handshake_timeout, Duration::zero(), [this, id] {
    auto it = pending_tls_.find(id);
    if (it == pending_tls_.end()) return;
    it->second.timer = 0;
    Status why(Code::kPermissionDenied, "TLS handshake not finished within " +
                                            std::to_string(ToMillis(options_.tls_handshake_timeout)) + " ms");
    LOG(ERROR) << "conn " << id << " " << PeerAddress(id) << ": " << why.message();
    Close(id, why);
  });
  c->StartTls();
}

void Transport::TlsEstablished(ConnId id) {
  auto it = pending_tls_.find(id);
  if (it == pending_tls_.end()) return;
  PendingAuth p = std::move(it->second);
  pending_tls_.erase(it);
  if (p.timer != 0) loop_->CancelTimer(p.timer);
  ++stats_.tls_handshakes;
  AfterTls(id, p.accepted, std::move(p.ready));
}

std::string Transport::PeerIdentity(ConnId id) const {
  Connection* c = Lookup(id);
  return c == nullptr ? std::string() : c->peer_identity();
}

void Transport::Opened(ConnId id, bool accepted, std::function<void(Result<ConnId>)> ready) {
  if (handlers_.on_open) handlers_.on_open(id, accepted);
  if (ready) ready(id);
}

bool Transport::AdmitAccepted() {
  if (options_.max_accepted_connections == 0 || num_accepted_ < options_.max_accepted_connections) return true;
  ++stats_.connections_refused;
  TimePoint now = std::chrono::steady_clock::now();
  if (now - last_refusal_log_ > std::chrono::seconds(1)) {  // at most one line per second
    last_refusal_log_ = now;
    LOG(WARNING) << "refusing accepted connections: " << num_accepted_ << " open, the cap is "
                 << options_.max_accepted_connections << " (" << stats_.connections_refused << " refused so far)";
  }
  return false;
}

Duration Transport::SweepPeriod() const {
  Duration shortest{0};
  for (Duration d : {options_.partial_frame_timeout, options_.first_frame_timeout}) {
    if (d.count() > 0 && (shortest.count() == 0 || d < shortest)) shortest = d;
  }
  if (shortest.count() == 0) return shortest;
  return std::max<Duration>(shortest / 4, std::chrono::milliseconds(10));
}

void Transport::SweepStalled() {
  TimePoint now = std::chrono::steady_clock::now();
  struct Doomed {
    ConnId id;
    Status why;
    bool stalled_frame;  // a frame begun and stalled (protocol error), else silent since accept
  };
  std::vector<Doomed> doomed;
  bool partial = options_.partial_frame_timeout.count() > 0;
  bool silent = options_.first_frame_timeout.count() > 0;
  for (auto& [id, c] : conns_) {
    if (partial && c->mid_frame() && now - c->last_read() > options_.partial_frame_timeout) {
      doomed.push_back({id, Status(Code::kTimeout, "partial frame stalled for over " +
                                                       std::to_string(ToMillis(options_.partial_frame_timeout)) + " ms"),
                        true});
    } else if (silent && c->accepted() && !c->heard() && now - c->opened() > options_.first_frame_timeout) {
      doomed.push_back({id, Status(Code::kTimeout, "no whole frame within " +
                                                       std::to_string(ToMillis(options_.first_frame_timeout)) +
                                                       " ms of accepting the connection"),
                        false});
    }
  }
  for (const Doomed& d : doomed) {
    Connection* c = Lookup(d.id);
    if (c == nullptr) continue;
    LOG(WARNING) << "conn " << d.id << " " << c->peer() << ": " << d.why << ", closing";
    if (d.stalled_frame) {
      ++stats_.protocol_errors;
    } else {
      ++stats_.silent_closed;
    }
    c->Close(d.why);
  }
}

void Transport::QueueFlush(ConnId id) {
  to_flush_.push_back(id);
  if (flush_queued_) return;
  flush_queued_ = true;
  loop_->RunBeforePoll([alive = alive_token()] {
    auto t = alive.lock();
    if (!t) return;
    Transport* self = *t;
    self->flush_queued_ = false;
    self->flushing_.swap(self->to_flush_);
    for (ConnId c : self->flushing_) {
      // A connection closed since it queued is gone from the table: nothing to write.
      if (Connection* conn = self->Lookup(c)) conn->Flush();
    }
    self->flushing_.clear();
  });
}

Connection* Transport::Lookup(ConnId id) const {
  // An answer usually goes to the connection just looked up (the request's): one entry
  // spares the table lookup and its cache misses.
  if (id == cached_id_ && cached_conn_ != nullptr) return cached_conn_;
  auto it = conns_.find(id);
  if (it == conns_.end()) return nullptr;
  cached_id_ = id;
  cached_conn_ = it->second.get();
  return cached_conn_;
}

void Transport::Release(ConnId id, const Status& why) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  if (it->second->accepted()) --num_accepted_;
  it->second->Detach();  // its writes no longer count
  it->second.release();  // The connection frees itself in its close callback.
  conns_.erase(it);
  if (cached_id_ == id) cached_conn_ = nullptr;
  ++stats_.connections_closed;
  recent_close_reasons_[id] = why.ToString();
  if (recent_close_reasons_.size() > 64) recent_close_reasons_.erase(recent_close_reasons_.begin());
  auto tls = pending_tls_.find(id);
  if (tls != pending_tls_.end()) {
    PendingAuth p = std::move(tls->second);
    pending_tls_.erase(tls);
    ++stats_.tls_failures;
    if (p.timer != 0) loop_->CancelTimer(p.timer);
    if (p.ready) p.ready(Status(why.code(), "connection closed during the TLS handshake: " + why.message()));
    return;  // Never opened: nobody else knows this connection.
  }
  auto auth = pending_auth_.find(id);
  if (auth != pending_auth_.end()) {
    PendingAuth p = std::move(auth->second);
    pending_auth_.erase(auth);
    if (p.timer != 0) loop_->CancelTimer(p.timer);
    if (p.ready) p.ready(Status(why.code(), "connection closed during the token handshake: " + why.message()));
    return;  // Never opened: nobody else knows this connection.
  }
  std::vector<std::function<void(const Status&)>> watchers;
  auto range = close_watchers_.equal_range(id);
  for (auto w = range.first; w != range.second; ++w) watchers.push_back(std::move(w->second));
  close_watchers_.erase(id);
  if (handlers_.on_close) handlers_.on_close(id, why);
  for (auto& w : watchers) w(why);
}

void Transport::WatchClose(ConnId id, std::function<void(const Status&)> fn) {
  if (!IsOpen(id)) {
    fn(Status(Code::kUnavailable, "connection " + std::to_string(id) + " already closed"));
    return;
  }
  close_watchers_.emplace(id, std::move(fn));
}

void Transport::Deliver(ConnId id, Frame&& frame) {
  if (!pending_auth_.empty() && pending_auth_.count(id)) return OnAuthFrame(id, std::move(frame));
  if (options_.auth_token.empty() && frame.meta.cmd() == pb::HELLO && !frame.meta.is_response() &&
      frame.payload && IsTokenChallenge(*frame.payload)) {
    // A token challenge while we have no token: say so instead of a puzzling failure.
    Status why(Code::kPermissionDenied, "peer " + PeerAddress(id) + " requires a cluster token (--cluster_token_file)");
    LOG(ERROR) << "conn " << id << ": " << why;
    return Close(id, why);
  }
  if (handlers_.on_frame) handlers_.on_frame(id, std::move(frame));
}

void Transport::DropSink(ConnId id, uint64_t request_id) {
  DCHECK(loop_->InLoopThread());
  if (Connection* c = Lookup(id)) c->DropSink(request_id);
}

Result<Connection*> Transport::Open(ConnId id) const {
  DCHECK(loop_->InLoopThread());
  Connection* c = Lookup(id);
  if (c != nullptr) return c;
  auto why = recent_close_reasons_.find(id);
  return Status(Code::kUnavailable, "connection " + std::to_string(id) + " is closed" +
                                        (why == recent_close_reasons_.end() ? "" : " (" + why->second + ")"));
}

std::vector<CommandStats> Transport::StatsByCommand() const {
  DCHECK(loop_->InLoopThread());
  std::vector<CommandStats> out;
  for (size_t slot = 0; slot < by_cmd_.size(); ++slot) {
    const CommandStats& c = by_cmd_[slot];
    if (c.frames_in == 0 && c.frames_out == 0) continue;
    out.push_back(c);
    out.back().cmd = slot + 1 == by_cmd_.size() ? kOtherCommand : static_cast<int>(slot);
  }
  return out;
}

Status Transport::Send(ConnId id, const pb::MessageMeta& meta, Payload payload) {
  Result<Connection*> c = Open(id);
  return c.ok() ? (*c)->Send(meta, std::move(payload)) : c.status();
}

Status Transport::Send(ConnId id, const pb::MessageMeta& meta, const google::protobuf::MessageLite& body) {
  Result<Connection*> c = Open(id);
  return c.ok() ? (*c)->Send(meta, body) : c.status();
}

void Transport::Close(ConnId id, const Status& why) {
  DCHECK(loop_->InLoopThread());
  Connection* c = Lookup(id);
  if (c != nullptr) c->Close(why);
}

void Transport::CloseAfterFlush(ConnId id, const Status& why) {
  DCHECK(loop_->InLoopThread());
  Connection* c = Lookup(id);
  if (c != nullptr) c->CloseAfterFlush(why);
}

std::string Transport::PeerAddress(ConnId id) const {
  Connection* c = Lookup(id);
  return c == nullptr ? std::string() : c->peer();
}

void Transport::HoldShared(const Buffer* payload) {
  SharedHold& h = shared_[payload];
  if (h.holders++ == 0) stats_.queued_write_bytes += payload->size();
}

void Transport::ReleaseShared(const Buffer* payload) {
  auto it = shared_.find(payload);
  if (it == shared_.end()) return;
  if (--it->second.holders > 0) return;
  stats_.queued_write_bytes -= payload->size();
  shared_.erase(it);
}

uint64_t Transport::QueuedBytes(ConnId id) const {
  Connection* c = Lookup(id);
  return c == nullptr ? 0 : c->queued_bytes();
}

}  // namespace pscore::comm
