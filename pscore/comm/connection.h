// Connection: one TCP stream, its frame decoder and its write queue.
// Internal to comm/: owned by its ConnectionOwner's table (the Transport's) while open, by
// itself while closing (freed in the uv_close callback). Loop thread only. Nobody outside
// comm/ holds one; they hold its ConnId.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/message_lite.h>

#include "pscore/comm/connection_owner.h"
#include "pscore/comm/frame_decoder.h"
#include "pscore/comm/transport_types.h"
#include "pscore/core/buffer.h"
#include "pscore/core/clock.h"

struct uv_tcp_s;
struct uv_buf_t;

namespace pscore::comm {

class EventLoop;
class TlsSession;
class TransportLedger;
struct WriteBatch;

// Payloads up to this size are copied into the write batch (one iovec per run of frames).
inline constexpr uint64_t kInlinePayloadBytes = 512;
// A payload part larger than this goes to writev as several iovecs (uv_buf_t's length is
// an unsigned int: a part of 4 GiB or more would be cut short and break the stream).
inline constexpr size_t kMaxIovBytes = size_t{256} << 20;

class Connection {
 public:
  // Takes an initialised uv_tcp_t (accepted or connected); ownership passes to *this.
  Connection(ConnectionOwner* owner, EventLoop* loop, ConnId id, uv_tcp_s* tcp,
             const TransportOptions& options, bool accepted);
  ~Connection();

  Status StartReading();
  // Puts TLS under the frames (TransportOptions::tls): the handshake starts now (the
  // dialling side speaks first); frames flow once the owner heard OnTlsEstablished.
  void StartTls();
  // The peer certificate's identity once TLS is established ("" without TLS).
  const std::string& peer_identity() const;
  // Queues one frame. A payload of at most kInlinePayloadBytes is copied into the batch;
  // a larger one (head and tail slices) is referenced, not copied, until its write completes.
  Status Send(const pb::MessageMeta& meta, Payload payload);
  // Queues one frame whose payload is `body` serialised (straight into the batch when small).
  Status Send(const pb::MessageMeta& meta, const google::protobuf::MessageLite& body);
  // Idempotent. Does not free: libuv still references the handle until OnClosed runs.
  void Close(const Status& why);
  // Writes what is queued (as far as the socket takes it now), then closes.
  void CloseAfterFlush(const Status& why);

  ConnId id() const { return id_; }
  const std::string& peer() const { return peer_; }
  bool closing() const { return closing_; }
  bool mid_frame() const { return decoder_.mid_frame(); }
  TimePoint last_read() const { return last_read_; }
  bool accepted() const { return accepted_; }
  TimePoint opened() const { return opened_; }
  bool heard() const { return heard_; }  // at least one whole frame decoded
  uint64_t queued_bytes() const { return queued_bytes_; }
  // Of queued_bytes(): the bytes of shared payloads (Payload::shared), which the
  // transport's total counts once per payload, not per connection.
  uint64_t shared_queued_bytes() const { return shared_queued_bytes_; }
  void DropSink(uint64_t request_id) { decoder_.DropSink(request_id); }
  void LimitPayload(uint64_t bytes) { decoder_.set_max_message_bytes(bytes); }
  // Called by the owner when it lets go of *this (closed, or the owner goes away first):
  // what is still queued leaves the ledger's total, shared payloads included, and nothing
  // after this touches the owner or its ledger.
  void Detach();
  // Writes the frames queued since the last flush (the owner calls it before the loop polls).
  void Flush();

 private:
  friend struct ConnectionCallbacks;  // libuv trampolines, defined in connection.cc
  void OnBytes(size_t n);
  // Ciphertext read from the socket: on with the handshake, then plaintext into the decoder.
  void OnCipher(const char* data, size_t n);
  void Decrypt();
  // TLS: writes the ciphertext the session has produced (handshake messages, alerts), then
  // encrypts the queued plaintext a chunk at a time while the socket takes it.
  void PumpTls();
  // TLS: encrypts up to kTlsChunkBytes of the queued plaintext. False when it failed (closed).
  bool EncryptChunk();
  // TLS: the gathered small pieces become one record.
  bool WriteStage();
  // Writes bufs[...] of `batch` (try first, then queue the rest); owns the batch till done.
  void Write(std::unique_ptr<WriteBatch> batch, std::vector<uv_buf_t>& bufs);
  // A batch written (or encrypted) whole: kept for reuse unless it grew big.
  void Recycle(std::unique_ptr<WriteBatch> batch);
  // Checks the limits and appends a frame's header and meta plus `inline_bytes` of room to
  // the pending batch (`payload` is referenced after them when not empty). Returns the room,
  // or null with *st set.
  // `total_bytes`: what the frame adds to the transport's total (less than frame_bytes
  // when its shared payload is already queued on another connection).
  Status CheckQueueCaps(uint64_t frame_bytes, uint64_t total_bytes);
  // queued_bytes_ and the transport's total move together (until Release detaches us);
  // `shared` of the `n` bytes are shared payloads, counted in the total by Transport.
  void AddQueued(uint64_t n, uint64_t shared);
  // A batch's bytes leave the queue, and its `shared_payloads` oldest shared holds.
  void DropQueued(uint64_t n, uint64_t shared, size_t shared_payloads);
  char* Append(const pb::MessageMeta& meta, uint64_t data_len, size_t inline_bytes, Payload payload,
               Status* st);

  ConnectionOwner* owner_;   // null once detached
  TransportLedger* ledger_;  // the owner's; null once detached
  EventLoop* loop_;
  ConnId id_;
  uv_tcp_s* tcp_;
  TransportOptions options_;
  std::string peer_;
  FrameDecoder decoder_;
  uint64_t decoder_copied_ = 0;  // decoder_.copied_payload_bytes() already counted
  std::vector<Frame> decoded_;
  std::unique_ptr<WriteBatch> pending_;  // frames queued this iteration, flushed before poll
  std::unique_ptr<WriteBatch> spare_;    // a written batch kept for reuse (no allocation per flush)
  std::vector<uv_buf_t> iov_;             // scratch scatter/gather list of Flush
  uint64_t queued_bytes_ = 0;            // queued or in flight
  uint64_t shared_queued_bytes_ = 0;     // of which shared payloads
  // The shared payloads queued or in flight, in queue order (batches complete in order):
  // each is one hold on the transport's count of that payload.
  std::deque<const Buffer*> shared_held_;
  uint64_t out_offset_ = 0;              // bytes of frames queued since the connection opened
  bool flush_scheduled_ = false;
  bool closing_ = false;
  Status close_reason_;
  TimePoint last_read_;
  TimePoint opened_;
  bool accepted_;
  bool heard_ = false;
  bool any_read_ = false;  // a byte has arrived
  std::unique_ptr<TlsSession> tls_;
  // TLS: flushed batches waiting to be encrypted (front first); their plaintext is encrypted
  // as the socket drains, so the ciphertext of one chunk at most is waiting in libuv.
  std::deque<std::unique_ptr<WriteBatch>> tls_plain_;
  size_t tls_iov_ = 0;     // the front batch's plaintext iovec reached
  size_t tls_iov_at_ = 0;  // and how far into it
  bool tls_writing_ = false;               // a ciphertext chunk is queued in libuv
  std::unique_ptr<WriteBatch> tls_chunk_;  // the ciphertext buffer while not queued (reused)
  std::string tls_stage_;                  // small plaintext pieces gathered into one record
};

}  // namespace pscore::comm
