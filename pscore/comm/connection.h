// Connection: frames on one TCP stream (StreamConn: the socket, the write queue, TLS): the
// frame decoder, frames encoded into the stream's write batches, the transport's ledger.
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
#include "pscore/comm/stream_conn.h"
#include "pscore/comm/transport_types.h"
#include "pscore/core/buffer.h"
#include "pscore/core/clock.h"

namespace pscore::comm {

class EventLoop;
class TransportLedger;

// Payloads up to this size are copied into the write batch (one iovec per run of frames).
inline constexpr uint64_t kInlinePayloadBytes = 512;
// Frames with smaller payloads, queued faster than the loop turns, go out once their batch
// holds this much: the peer starts on them while the rest are queued (larger frames wait
// for the turn's flush as before).
inline constexpr uint64_t kEarlyFlushBytes = 16 << 10;

class Connection final : private StreamUser {
 public:
  // Takes an initialised uv_tcp_t (accepted or connected); ownership passes to *this.
  Connection(ConnectionOwner* owner, EventLoop* loop, ConnId id, uv_tcp_t* tcp,
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
  TimePoint last_read() const { return stream_.last_read(); }
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
  // StreamUser: what the stream reports.
  char* ReadRegion(size_t* size) override { return decoder_.ReadRegion(size); }
  void OnStreamBytes(const char* data, size_t n) override;
  void OnStreamTls() override;
  void OnStreamFailed(Failure what, const Status& why) override;
  void OnBatchDone(const WriteBatch& batch) override {
    DropQueued(batch.bytes, batch.shared_bytes, batch.shared_payloads);
  }
  void OnStreamWritten() override {}
  void OnStreamClosed() override { delete this; }  // released from the table at Close()
  // Plaintext bytes decoded into frames and delivered.
  void OnBytes(size_t n);
  // A frame with a payload of `data_len` bytes is complete in the batch: a batch of small
  // frames that reached kEarlyFlushBytes starts to go out.
  void StartFlushIfFull(uint64_t data_len);
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
  StreamConn stream_;
  TransportOptions options_;
  std::string peer_;
  FrameDecoder decoder_;
  uint64_t decoder_copied_ = 0;  // decoder_.copied_payload_bytes() already counted
  std::vector<Frame> decoded_;
  uint64_t queued_bytes_ = 0;            // queued or in flight
  uint64_t shared_queued_bytes_ = 0;     // of which shared payloads
  // The shared payloads queued or in flight, in queue order (batches complete in order):
  // each is one hold on the transport's count of that payload.
  std::deque<const Buffer*> shared_held_;
  uint64_t out_offset_ = 0;              // bytes of frames queued since the connection opened
  bool flush_scheduled_ = false;
  bool closing_ = false;
  Status close_reason_;
  TimePoint opened_;
  bool accepted_;
  bool heard_ = false;
  bool any_read_ = false;  // a byte has arrived
};

}  // namespace pscore::comm
