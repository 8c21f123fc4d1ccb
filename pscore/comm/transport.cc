#include "pscore/comm/transport.h"

#include <uv.h>

#include <algorithm>
#include <cstring>

#include "pscore/comm/connection.h"
#include "pscore/comm/dialer.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/uv_status.h"

namespace pscore::comm {

namespace {

// A HELLO carrying a nonce is the accepting side's token challenge (a node's own HELLO
// greeting carries none).
bool IsTokenChallenge(const Buffer& payload) {
  pb::HelloMessage hello;
  return hello.ParseFromArray(payload.data(), static_cast<int>(payload.size())) && !hello.nonce().empty();
}

}  // namespace

Transport::Transport(EventLoop* loop, TransportOptions options, Handlers handlers)
    : loop_(loop),
      options_(std::move(options)),
      handlers_(std::move(handlers)),
      accept_cap_("transport", options_.max_accepted_connections) {
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
  sweep_.Stop();
  for (TcpListener* l : listeners_) l->Close();
  listeners_.clear();
  std::vector<Dialer*> dialers;
  dialers.swap(dialers_);
  for (Dialer* d : dialers) d->Cancel();
  std::vector<ConnId> ids;
  for (auto& [id, c] : conns_) ids.push_back(id);
  for (ConnId id : ids) Close(id, Status(Code::kCancelled, "transport shut down"));
}

Result<int> Transport::Listen(const std::string& host, int port) {
  DCHECK(loop_->InLoopThread());
  if (shut_down_) return Status(Code::kFailedPrecondition, "transport shut down");
  TcpListener::Callbacks cb;
  cb.admit = [this] {
    if (accept_cap_.Admit(num_accepted_)) return true;
    ++ledger_.stats().connections_refused;
    return false;
  };
  cb.accepted = [this](uv_tcp_s* tcp) { Adopt(tcp, /*accepted=*/true); };
  Result<TcpListener*> l = TcpListener::Open(loop_, host, port, "transport", std::move(cb));
  if (!l.ok()) return l.status();
  listeners_.push_back(*l);
  if (stop_hook_ == 0) stop_hook_ = loop_->AddStopHook([this] { Shutdown(); });
  return (*l)->port();
}

void Transport::Connect(const std::string& host, int port, ConnectOptions options,
                        std::function<void(Result<ConnId>)> done) {
  DCHECK(loop_->InLoopThread());
  if (shut_down_) {
    done(Status(Code::kFailedPrecondition, "transport shut down"));
    return;
  }
  sockaddr_storage addr;
  Status st = ResolveAddress(host, port, &addr);
  if (!st.ok()) {
    done(st);
    return;
  }
  auto adopt = [this](uv_tcp_s* tcp, Dialer::DoneFn ready) { Adopt(tcp, /*accepted=*/false, std::move(ready)); };
  auto finished = [this](Dialer* d) { dialers_.erase(std::remove(dialers_.begin(), dialers_.end(), d), dialers_.end()); };
  auto* d = new Dialer(loop_, addr, JoinHostPort(host, port), options, std::move(adopt), std::move(finished),
                       std::move(done));
  dialers_.push_back(d);
  if (stop_hook_ == 0) stop_hook_ = loop_->AddStopHook([this] { Shutdown(); });
  d->Start();
}

ConnId Transport::Adopt(uv_tcp_t* tcp, bool accepted, std::function<void(Result<ConnId>)> ready) {
  DCHECK(loop_->InLoopThread());
  ConnId id = next_id_++;
  auto conn = std::make_unique<Connection>(static_cast<ConnectionOwner*>(this), loop_, id, tcp, options_, accepted);
  Status st = conn->StartReading();
  if (!st.ok()) {
    LOG(WARNING) << "conn " << id << " " << conn->peer() << ": " << st;
    conns_.emplace(id, std::move(conn));
    ledger_.open_connections = conns_.size();
    if (accepted) ++num_accepted_;  // Close counts it out again
    Close(id, st);
    if (ready) ready(st);
    return kNoConn;
  }
  VLOG(1) << "conn " << id << " " << (accepted ? "accepted from " : "connected to ") << conn->peer();
  conns_.emplace(id, std::move(conn));
  ledger_.open_connections = conns_.size();
  ++ledger_.stats().connections_opened;
  if (accepted) ++num_accepted_;
  if (!sweep_.running() && SweepPeriod().count() > 0) sweep_.Start(loop_, SweepPeriod(), [this] { SweepStalled(); });
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

void Transport::OnTlsEstablished(ConnId id) {
  DCHECK(loop_->InLoopThread());
  auto it = pending_tls_.find(id);
  if (it == pending_tls_.end()) return;
  PendingAuth p = std::move(it->second);
  pending_tls_.erase(it);
  if (p.timer != 0) loop_->CancelTimer(p.timer);
  ++ledger_.stats().tls_handshakes;
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

Duration Transport::SweepPeriod() const {
  Duration shortest{0};
  for (Duration d : {options_.partial_frame_timeout, options_.first_frame_timeout}) {
    if (d.count() > 0 && (shortest.count() == 0 || d < shortest)) shortest = d;
  }
  if (shortest.count() == 0) return shortest;
  return ConnSweep::Period(shortest);
}

void Transport::SweepStalled() {
  DCHECK(loop_->InLoopThread());
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
      ledger_.CountProtocolError();
    } else {
      ++ledger_.stats().silent_closed;
    }
    c->Close(d.why);
  }
}

void Transport::OnFramesQueued(ConnId id) {
  DCHECK(loop_->InLoopThread());
  to_flush_.push_back(id);
  if (flush_queued_) return;
  flush_queued_ = true;
  loop_->RunBeforePoll([this, alive = alive_.watch()] {
    if (alive) FlushQueued();
  });
}

void Transport::FlushQueued() {
  DCHECK(loop_->InLoopThread());
  flush_queued_ = false;
  flushing_.swap(to_flush_);
  for (ConnId c : flushing_) {
    // A connection closed since it queued is gone from the table: nothing to write.
    if (Connection* conn = Lookup(c)) conn->Flush();
  }
  flushing_.clear();
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

void Transport::OnClosing(ConnId id, const Status& why) {
  DCHECK(loop_->InLoopThread());
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  if (it->second->accepted()) --num_accepted_;
  it->second->Detach();  // its writes no longer count
  it->second.release();  // The connection frees itself in its close callback.
  conns_.erase(it);
  ledger_.open_connections = conns_.size();
  if (cached_id_ == id) cached_conn_ = nullptr;
  ++ledger_.stats().connections_closed;
  recent_close_reasons_[id] = why.ToString();
  if (recent_close_reasons_.size() > 64) recent_close_reasons_.erase(recent_close_reasons_.begin());
  auto tls = pending_tls_.find(id);
  if (tls != pending_tls_.end()) {
    PendingAuth p = std::move(tls->second);
    pending_tls_.erase(tls);
    ++ledger_.stats().tls_failures;
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
  DCHECK(loop_->InLoopThread());
  if (!IsOpen(id)) {
    fn(Status(Code::kUnavailable, "connection " + std::to_string(id) + " already closed"));
    return;
  }
  close_watchers_.emplace(id, std::move(fn));
}

void Transport::OnFrame(ConnId id, Frame&& frame) {
  DCHECK(loop_->InLoopThread());
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
  return ledger_.StatsByCommand();
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

uint64_t Transport::QueuedBytes(ConnId id) const {
  Connection* c = Lookup(id);
  return c == nullptr ? 0 : c->queued_bytes();
}

}  // namespace pscore::comm
