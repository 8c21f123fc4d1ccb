// Transport: the TCP connections and listeners of one EventLoop.
// Owns every Connection (by ConnId) and listener; delivers decoded frames and close
// events to its Handlers. Loop thread only (construct anywhere, then use on the loop).
// Hosts: numeric IPv4/IPv6 addresses or "localhost" (no blocking DNS on the loop).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "pscore/comm/address.h"
#include "pscore/comm/alive.h"
#include "pscore/comm/conn_sweep.h"
#include "pscore/comm/connection_owner.h"
#include "pscore/comm/frame_decoder.h"
#include "pscore/comm/tcp_listener.h"
#include "pscore/comm/transport_ledger.h"
#include "pscore/comm/transport_types.h"
#include "pscore/core/buffer.h"
#include "pscore/core/status.h"

struct uv_tcp_s;

namespace pscore::comm {

class Connection;
class Dialer;
class EventLoop;
class TcpListener;

class Transport final : private ConnectionOwner {
 public:
  struct Handlers {
    std::function<void(ConnId, Frame&&)> on_frame;
    std::function<void(ConnId, bool accepted)> on_open;  // optional
    std::function<void(ConnId, const Status&)> on_close;  // optional
    // Optional: memory for the tail of a frame whose meta names a payload head (see
    // FrameDecoder::SinkFn), or null to receive it as usual.
    std::function<char*(ConnId, const pb::MessageMeta&, uint64_t tail)> sink;
    // Optional: a stream for such a tail when sink gave no memory (FrameDecoder::StreamFn).
    std::function<std::shared_ptr<TailStream>(ConnId, const pb::MessageMeta&, uint64_t tail)> stream;
  };

  Transport(EventLoop* loop, TransportOptions options, Handlers handlers);
  ~Transport();  // Closes everything still open (on the loop thread, or after it stopped).
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Binds and listens; port 0 picks a free port. Returns the bound port.
  Result<int> Listen(const std::string& host, int port);
  // Connects with retry and exponential backoff until options.timeout. The callback runs
  // once, on the loop thread, with the new connection or the last error.
  void Connect(const std::string& host, int port, ConnectOptions options,
               std::function<void(Result<ConnId>)> done);
  Status Send(ConnId id, const pb::MessageMeta& meta, Payload payload);
  Status Send(ConnId id, const pb::MessageMeta& meta, const google::protobuf::MessageLite& body);
  void Close(ConnId id, const Status& why);
  // Writes what is queued for `id` (as far as the socket takes it now), then closes: so a
  // refusal answer reaches the peer before the close.
  void CloseAfterFlush(ConnId id, const Status& why);
  // The frame of `request_id` being received on `id`, if its tail goes to a sink, writes
  // nothing more there (FrameDecoder::DropSink). No-op for a closed connection.
  void DropSink(ConnId id, uint64_t request_id);
  // Calls fn once when connection `id` closes (at once if it is already closed).
  void WatchClose(ConnId id, std::function<void(const Status&)> fn);
  // Closes all listeners and connections and cancels dials. Idempotent.
  void Shutdown();

  bool IsOpen(ConnId id) const { return conns_.count(id) != 0; }
  std::string PeerAddress(ConnId id) const;
  // The identity (certificate CN) the peer of `id` proved in its TLS handshake: "" without
  // TLS or for a closed connection. The certificate was verified against the cluster CA.
  std::string PeerIdentity(ConnId id) const;
  uint64_t QueuedBytes(ConnId id) const;
  size_t num_connections() const { return conns_.size(); }
  const TransportStats& stats() const { return ledger_.stats(); }
  // Payload bytes copied in user space (any thread): small payloads copied into a write
  // batch, and payload bytes FrameDecoder copied out of its read buffers.
  uint64_t payload_bytes_copied() const { return ledger_.payload_bytes_copied(); }
  // Snapshot of the per-command counters: one entry per command number that carried a
  // frame either way, in number order, kOtherCommand (if any) last. Allocates per call
  // (a /metrics scrape), never per frame.
  std::vector<CommandStats> StatsByCommand() const;
  EventLoop* loop() const { return loop_; }
  const TransportOptions& options() const { return options_; }
  // Queued-but-unwritten bytes of all open connections, a shared payload (Payload::shared)
  // once however many connections hold it.
  uint64_t queued_write_bytes() const { return ledger_.queued_write_bytes(); }
  // Distinct shared payloads queued now (tests).
  size_t shared_payloads_queued() const { return ledger_.shared_payloads_queued(); }
  // Payload bytes held now for frames received in part, on every transport sharing the budget.
  uint64_t incomplete_frame_bytes() const { return options_.incomplete_frame_budget->held(); }

 private:
  // Token handshake state of a connection that may not carry frames yet.
  struct PendingAuth {
    bool accepted;
    std::string nonce;  // accepting side: the challenge sent
    std::function<void(Result<ConnId>)> ready;
    uint64_t timer = 0;  // TimerId of the handshake deadline
  };
  // ConnectionOwner: what the connections report.
  TransportLedger& ledger() override { return ledger_; }
  bool has_sink() const override { return static_cast<bool>(handlers_.sink); }
  char* SinkFor(ConnId id, const pb::MessageMeta& meta, uint64_t tail) override {
    return handlers_.sink(id, meta, tail);
  }
  bool has_stream() const override { return static_cast<bool>(handlers_.stream); }
  std::shared_ptr<TailStream> StreamFor(ConnId id, const pb::MessageMeta& meta, uint64_t tail) override {
    return handlers_.stream(id, meta, tail);
  }
  void OnTlsEstablished(ConnId id) override;
  void OnFrame(ConnId id, Frame&& frame) override;
  void OnFramesQueued(ConnId id) override;
  void OnClosing(ConnId id, const Status& why) override;

  Connection* Lookup(ConnId id) const;
  // The open connection `id`, or kUnavailable naming why it closed (when still known).
  Result<Connection*> Open(ConnId id) const;
  // Takes an initialised, connected handle. `ready` (dialled connections) runs once the
  // connection may carry frames: at once, or after the token handshake.
  ConnId Adopt(uv_tcp_s* tcp, bool accepted, std::function<void(Result<ConnId>)> ready = nullptr);
  void FlushQueued();
  void SweepStalled();
  // The sweep period for the timeouts set, or zero when none is.
  Duration SweepPeriod() const;
  void StartAuth(ConnId id, bool accepted, std::function<void(Result<ConnId>)> ready);
  void OnAuthFrame(ConnId id, Frame&& frame);
  void AuthDone(ConnId id, const Status& st);
  void Opened(ConnId id, bool accepted, std::function<void(Result<ConnId>)> ready);
  std::unordered_map<ConnId, PendingAuth> pending_auth_;
  // Connections in their TLS handshake (same fields; nonce unused).
  std::unordered_map<ConnId, PendingAuth> pending_tls_;
  void StartTls(ConnId id, bool accepted, std::function<void(Result<ConnId>)> ready);
  void AfterTls(ConnId id, bool accepted, std::function<void(Result<ConnId>)> ready);
  // Why recently closed connections closed, so a late Send can say why (bounded).
  std::map<ConnId, std::string> recent_close_reasons_;

  EventLoop* loop_;
  TransportOptions options_;
  Handlers handlers_;
  std::unordered_map<ConnId, std::unique_ptr<Connection>> conns_;
  mutable ConnId cached_id_ = 0;               // Lookup's one-entry cache (loop thread)
  mutable Connection* cached_conn_ = nullptr;  // reset when cached_id_ is released
  std::unordered_multimap<ConnId, std::function<void(const Status&)>> close_watchers_;
  std::vector<TcpListener*> listeners_;
  std::vector<Dialer*> dialers_;
  ConnId next_id_ = 1;
  std::vector<ConnId> to_flush_;   // connections with queued frames, in order of first Send
  std::vector<ConnId> flushing_;   // the list being flushed (swapped, so no allocation per pass)
  bool flush_queued_ = false;      // a before-poll pass is scheduled
  size_t num_accepted_ = 0;  // open accepted connections (against max_accepted_connections)
  AcceptCap accept_cap_;
  uint64_t stop_hook_ = 0;
  ConnSweep sweep_;
  bool shut_down_ = false;
  TransportLedger ledger_;
  AliveToken alive_;
};

}  // namespace pscore::comm
