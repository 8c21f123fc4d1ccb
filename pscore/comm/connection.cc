#include "pscore/comm/connection.h"

#include <uv.h>

#include <algorithm>
#include <cstring>

#include "pscore/comm/address.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/tls.h"
#include "pscore/comm/transport_ledger.h"
#include "pscore/comm/uv_status.h"

namespace pscore::comm {

Connection::Connection(ConnectionOwner* owner, EventLoop* loop, ConnId id, uv_tcp_t* tcp,
                       const TransportOptions& options, bool accepted)
    : owner_(owner),
      ledger_(&owner->ledger()),
      loop_(loop),
      id_(id),
      stream_(this, loop, tcp, StreamConn::Options{}),
      options_(options),
      decoder_(options.limits),
      opened_(stream_.last_read()),
      accepted_(accepted) {
  decoder_.set_budget(options.incomplete_frame_budget);
  if (options.tcp_nodelay) uv_tcp_nodelay(tcp, 1);
  if (owner_->has_sink()) {
    decoder_.set_sink([this](const pb::MessageMeta& meta, uint64_t tail) -> char* {
      return owner_ != nullptr ? owner_->SinkFor(id_, meta, tail) : nullptr;
    });
  }
  if (owner_->has_stream()) {
    decoder_.set_stream([this](const pb::MessageMeta& meta, uint64_t tail) -> std::shared_ptr<TailStream> {
      return owner_ != nullptr ? owner_->StreamFor(id_, meta, tail) : nullptr;
    });
  }
  peer_ = PeerName(tcp);
}

Connection::~Connection() = default;

Status Connection::StartReading() { return stream_.StartReading(); }

void Connection::StartTls() {
  DCHECK(loop_->InLoopThread());
  Status st = stream_.StartTls(options_.tls, /*server=*/accepted_);
  if (!st.ok()) Close(st);
}

const std::string& Connection::peer_identity() const { return stream_.peer_identity(); }

void Connection::OnStreamBytes(const char* data, size_t n) {
  if (n == 0) {
    // Nothing arrived: the decoder's handed-out region is released.
    decoder_.Commit(0, &decoded_).IgnoreError();
    return;
  }
  if (!any_read_ && !stream_.tls() && LooksLikeTls(data, n)) {
    Status why(Code::kPermissionDenied, "the peer speaks TLS and this side has no TLS (--tls_cert, --tls_key, --tls_ca)");
    LOG(ERROR) << "conn " << id_ << " " << peer_ << ": " << why.message();
    decoder_.Commit(0, &decoded_).IgnoreError();
    return Close(why);
  }
  any_read_ = true;
  OnBytes(n);
}

void Connection::OnStreamTls() {
  VLOG(1) << "conn " << id_ << " " << peer_ << ": TLS established with " << stream_.peer_identity();
  if (owner_ != nullptr) owner_->OnTlsEstablished(id_);
}

void Connection::OnStreamFailed(Failure what, const Status& why) {
  switch (what) {
    case Failure::kRead:
      if (stream_.tls() && !stream_.tls_established()) {
        Status st(why.code(), why.message() + " during the TLS handshake (the peer refused it, or it does not speak TLS)");
        LOG(ERROR) << "conn " << id_ << " " << peer_ << ": " << st.message();
        return Close(st);
      }
      if (decoder_.mid_frame()) {
        Status st(why.code(), why.message() + " in the middle of a frame");
        LOG(WARNING) << "conn " << id_ << " " << peer_ << ": " << st;
        return Close(st);
      }
      return Close(why);
    case Failure::kHandshake:
      LOG(ERROR) << "conn " << id_ << " " << peer_ << ": " << why.message();
      return Close(why);
    case Failure::kTlsRead:
      if (why.code() == Code::kUnavailable) {
        VLOG(1) << "conn " << id_ << " " << peer_ << ": " << why;
      } else {
        LOG(ERROR) << "conn " << id_ << " " << peer_ << ": " << why.message();
      }
      return Close(why);
    case Failure::kTlsWrite:
      LOG(ERROR) << "conn " << id_ << " " << peer_ << ": " << why.message();
      return Close(why);
    case Failure::kWrite:
      return Close(why);
  }
}

void Connection::OnBytes(size_t n) {
  DCHECK(loop_->InLoopThread());
  Status st = decoder_.Commit(n, &decoded_);
  for (;;) {
    if (owner_ != nullptr) {
      ledger_->CountIn(n, decoded_.size());
      ledger_->CountCopied(decoder_.copied_payload_bytes() - decoder_copied_);
      decoder_copied_ = decoder_.copied_payload_bytes();
      for (const Frame& f : decoded_) ledger_->CountCommandIn(f.meta.cmd(), f.wire_bytes);
    }
    n = 0;
    if (!decoded_.empty()) heard_ = true;
    // Deliver what decoded before any error: those frames were valid.
    for (size_t i = 0; i < decoded_.size() && !closing_; ++i) {
      if (owner_ != nullptr) owner_->OnFrame(id_, std::move(decoded_[i]));
    }
    decoded_.clear();
    // Stopped in front of a frame that may be streamed: the frames before it are in.
    if (!st.ok() || closing_ || !decoder_.paused()) break;
    st = decoder_.Resume(&decoded_);
  }
  if (!st.ok() && !closing_) {
    if (st.code() == Code::kResourceExhausted) {
      LOG(WARNING) << "conn " << id_ << " " << peer_ << ": frame over the incomplete-frame budget, closing: " << st;
      if (owner_ != nullptr) ledger_->CountIncompleteCapClosed();
    } else {
      LOG(WARNING) << "conn " << id_ << " " << peer_ << ": bad frame, closing: " << st;
      if (owner_ != nullptr) ledger_->CountProtocolError();
    }
    Close(st);
  }
}

Status Connection::Send(const pb::MessageMeta& meta, Payload payload) {
  const uint64_t data_len = payload.size();
  Status st;
  if (data_len > kInlinePayloadBytes) {
    if (Append(meta, data_len, 0, std::move(payload), &st) == nullptr) return st;
    StartFlushIfFull(data_len);
    return Status::Ok();
  }
  char* room = Append(meta, data_len, data_len, Payload(), &st);
  if (room == nullptr) return st;
  if (owner_ != nullptr) ledger_->CountCopied(data_len);
  if (payload.head && payload.head->size() > 0) {
    std::memcpy(room, payload.head->data(), payload.head->size());
    room += payload.head->size();
  }
  for (const Slice& s : payload.tail) {
    if (s.size > 0) std::memcpy(room, s.data, s.size);
    room += s.size;
  }
  StartFlushIfFull(data_len);
  return Status::Ok();
}

void Connection::StartFlushIfFull(uint64_t data_len) {
  if (data_len < kEarlyFlushBytes && stream_.batch().bytes >= kEarlyFlushBytes) stream_.StartFlush();
}

Status Connection::Send(const pb::MessageMeta& meta, const google::protobuf::MessageLite& body) {
  const size_t data_len = body.ByteSizeLong();
  if (data_len > kInlinePayloadBytes) {
    BufferPtr payload = Buffer::Allocate(data_len);
    body.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(payload->data()));
    return Send(meta, std::move(payload));
  }
  Status st;
  char* room = Append(meta, data_len, data_len, nullptr, &st);
  if (room == nullptr) return st;
  body.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(room));
  StartFlushIfFull(data_len);
  return Status::Ok();
}

char* Connection::Append(const pb::MessageMeta& meta, uint64_t data_len, size_t inline_bytes, Payload payload,
                         Status* st) {
  DCHECK(loop_->InLoopThread());
  if (closing_) {
    *st = Status(Code::kUnavailable, "connection " + std::to_string(id_) + " closed");
    return nullptr;
  }
  const size_t fields_len = meta.ByteSizeLong();
  // Padding after the fields so that the payload starts 8-byte aligned in the stream
  // (frame.h): the receiver can then hand a small one out in place.
  const size_t pad_len = data_len > 0 ? MetaPadBytes(out_offset_, fields_len) : 0;
  const size_t meta_len = fields_len + pad_len;
  if (meta_len > options_.limits.max_meta_bytes) {
    *st = Status(Code::kInvalidArgument, "meta of " + std::to_string(meta_len) + " bytes over limit");
    return nullptr;
  }
  if (data_len > options_.limits.max_message_bytes) {
    *st = Status(Code::kInvalidArgument, "payload of " + std::to_string(data_len) + " bytes > max_message_bytes " +
                                             std::to_string(options_.limits.max_message_bytes));
    return nullptr;
  }
  uint64_t frame_bytes = kHeaderBytes + meta_len + data_len;
  // A shared payload (only a referenced head; an inline one is copied) is counted in the
  // transport's total by the transport, once whatever the number of connections.
  const Buffer* shared = payload.shared && payload.head && inline_bytes == 0 ? payload.head.get() : nullptr;
  const uint64_t shared_bytes = shared != nullptr ? shared->size() : 0;
  uint64_t total_bytes = frame_bytes;
  if (shared != nullptr && owner_ != nullptr && ledger_->HoldsShared(shared)) total_bytes -= shared_bytes;
  Status over = CheckQueueCaps(frame_bytes, total_bytes);
  if (!over.ok()) {
    LOG(WARNING) << "conn " << id_ << ": " << over;
    Close(over);
    *st = over;
    return nullptr;
  }
  WriteBatch& b = stream_.batch();
  char* at = b.Add(kHeaderBytes + meta_len + inline_bytes, std::move(payload));
  StoreHeader(FrameHeader{kMagic, static_cast<uint32_t>(meta_len), data_len}, at);
  meta.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(at + kHeaderBytes));
  StoreMetaPad(pad_len, at + kHeaderBytes + fields_len);
  out_offset_ += frame_bytes;
  b.bytes += frame_bytes;
  if (shared != nullptr) {
    b.shared_bytes += shared_bytes;
    ++b.shared_payloads;
    shared_held_.push_back(shared);
    if (owner_ != nullptr) ledger_->HoldShared(shared);
  }
  AddQueued(frame_bytes, shared_bytes);
  if (owner_ != nullptr) ledger_->CountOut(frame_bytes, meta.cmd());
  if (!flush_scheduled_ && owner_ != nullptr) {
    flush_scheduled_ = true;
    owner_->OnFramesQueued(id_);  // one before-poll pass per loop iteration flushes them all
  }
  return at + kHeaderBytes + meta_len;
}

// The per-connection cap, then the transport's total: past the total, only a connection
// holding more than a fair share (total cap / open connections) is closed, so one slow
// peer cannot get others closed, and closing never cascades to peers under their share.
Status Connection::CheckQueueCaps(uint64_t frame_bytes, uint64_t total_bytes) {
  if (queued_bytes_ + frame_bytes > options_.max_queued_write_bytes) {
    if (owner_ != nullptr) ledger_->CountQueuedCapClosed(/*total=*/false);
    return Status(Code::kResourceExhausted, "peer " + peer_ + " is not reading: " + std::to_string(queued_bytes_) +
                                                " bytes queued, cap " + std::to_string(options_.max_queued_write_bytes));
  }
  const uint64_t cap = options_.max_total_queued_write_bytes;
  if (cap == 0 || owner_ == nullptr) return Status::Ok();
  const uint64_t total = ledger_->queued_write_bytes();
  if (total + total_bytes <= cap) return Status::Ok();
  const uint64_t fair = cap / std::max<size_t>(1, ledger_->open_connections);
  if (queued_bytes_ + frame_bytes <= fair) return Status::Ok();
  ledger_->CountQueuedCapClosed(/*total=*/true);
  return Status(Code::kResourceExhausted,
                "peer " + peer_ + " is not reading: " + std::to_string(queued_bytes_) + " bytes queued, over its fair share " +
                    std::to_string(fair) + " while all connections hold " + std::to_string(total) + " bytes, cap " +
                    std::to_string(cap));
}

void Connection::AddQueued(uint64_t n, uint64_t shared) {
  queued_bytes_ += n;
  shared_queued_bytes_ += shared;
  if (owner_ != nullptr) ledger_->AddQueuedTotal(n - shared);
}

void Connection::DropQueued(uint64_t n, uint64_t shared, size_t shared_payloads) {
  queued_bytes_ -= n;
  shared_queued_bytes_ -= shared;
  for (size_t i = 0; i < shared_payloads && !shared_held_.empty(); ++i) {
    if (owner_ != nullptr) ledger_->ReleaseShared(shared_held_.front());
    shared_held_.pop_front();
  }
  if (owner_ != nullptr) ledger_->DropQueuedTotal(n - shared);
}

void Connection::Detach() {
  if (owner_ == nullptr) return;
  ledger_->DropQueuedTotal(queued_bytes_ - shared_queued_bytes_);
  for (const Buffer* b : shared_held_) ledger_->ReleaseShared(b);
  // The batches still in flight pop their holds when they complete; the transport no
  // longer counts them.
  owner_ = nullptr;
  ledger_ = nullptr;
}

void Connection::Flush() {
  DCHECK(loop_->InLoopThread());
  flush_scheduled_ = false;
  if (closing_) return;
  stream_.Flush();
}

void Connection::CloseAfterFlush(const Status& why) {
  DCHECK(loop_->InLoopThread());
  if (!closing_) Flush();
  Close(why);
}

void Connection::Close(const Status& why) {
  DCHECK(loop_->InLoopThread());
  if (closing_) return;
  closing_ = true;
  close_reason_ = why;
  VLOG(1) << "conn " << id_ << " " << peer_ << " closing: " << why;
  if (owner_ != nullptr) owner_->OnClosing(id_, why);  // Table lets go of *this.
  stream_.Close();  // OnStreamClosed frees *this
}

}  // namespace pscore::comm
