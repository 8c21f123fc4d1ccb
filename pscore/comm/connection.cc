#include "pscore/comm/connection.h"

#include <uv.h>

#include <algorithm>
#include <cstring>

#include "pscore/comm/address.h"
#include "pscore/comm/connection_internal.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/tls.h"
#include "pscore/comm/transport_ledger.h"
#include "pscore/comm/uv_status.h"

namespace pscore::comm {

void ConnectionCallbacks::OnAlloc(uv_handle_t* handle, size_t /*suggested*/, uv_buf_t* buf) {
  auto* self = static_cast<Connection*>(handle->data);
  if (self->tls_) {
    *buf = uv_buf_init(CipherReadBuffer(), static_cast<unsigned>(kCipherReadBytes));
    return;
  }
  size_t size = 0;
  char* region = self->decoder_.ReadRegion(&size);
  // uv_buf_t.len is size_t on Unix; reads of over 1 GiB at once gain nothing.
  *buf = uv_buf_init(region, static_cast<unsigned>(std::min<size_t>(size, 1u << 30)));
}

void ConnectionCallbacks::OnRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* self = static_cast<Connection*>(stream->data);
  if (nread > 0) {
    if (self->tls_) return self->OnCipher(buf->base, static_cast<size_t>(nread));
    if (!self->any_read_ && LooksLikeTls(buf->base, static_cast<size_t>(nread))) {
      Status why(Code::kPermissionDenied, "the peer speaks TLS and this side has no TLS (--tls_cert, --tls_key, --tls_ca)");
      LOG(ERROR) << "conn " << self->id_ << " " << self->peer_ << ": " << why.message();
      self->decoder_.Commit(0, &self->decoded_).IgnoreError();
      return self->Close(why);
    }
    self->any_read_ = true;
    self->OnBytes(static_cast<size_t>(nread));
    return;
  }
  if (nread == 0) {
    if (self->tls_) return;
    // EAGAIN: tell the decoder nothing arrived so the handed-out region is released.
    self->decoder_.Commit(0, &self->decoded_).IgnoreError();
    return;
  }
  Status why = nread == UV_EOF ? Status(Code::kUnavailable, "peer closed the connection")
                               : UvStatus(static_cast<int>(nread), "read");
  if (self->tls_ && !self->tls_->established()) {
    why = Status(why.code(), why.message() + " during the TLS handshake (the peer refused it, or it does not speak TLS)");
    LOG(ERROR) << "conn " << self->id_ << " " << self->peer_ << ": " << why.message();
  } else if (self->decoder_.mid_frame()) {
    why = Status(why.code(), why.message() + " in the middle of a frame");
    LOG(WARNING) << "conn " << self->id_ << " " << self->peer_ << ": " << why;
  }
  self->Close(why);
}

void ConnectionCallbacks::OnWriteDone(uv_write_t* req, int status) {
  std::unique_ptr<WriteBatch> batch(static_cast<WriteBatch*>(req->data));
  Connection* self = batch->conn;
  if (batch->tls_chunk) {
    self->tls_writing_ = false;
    if (status < 0) {
      if (status != UV_ECANCELED) self->Close(UvStatus(status, "write"));
      return;
    }
    self->tls_chunk_ = std::move(batch);
    self->PumpTls();
    return;
  }
  self->DropQueued(batch->bytes, batch->shared_bytes, batch->shared_payloads);
  if (status < 0 && status != UV_ECANCELED) self->Close(UvStatus(status, "write"));
}

void ConnectionCallbacks::OnClosed(uv_handle_t* handle) {
  auto* self = static_cast<Connection*>(handle->data);
  delete self;  // Released from the table at Close(); touch nothing after this line.
}

Connection::Connection(ConnectionOwner* owner, EventLoop* loop, ConnId id, uv_tcp_t* tcp,
                       const TransportOptions& options, bool accepted)
    : owner_(owner),
      ledger_(&owner->ledger()),
      loop_(loop),
      id_(id),
      tcp_(tcp),
      options_(options),
      decoder_(options.limits),
      last_read_(std::chrono::steady_clock::now()),
      opened_(last_read_),
      accepted_(accepted) {
  tcp_->data = this;
  decoder_.set_budget(options.incomplete_frame_budget);
  if (options.tcp_nodelay) uv_tcp_nodelay(tcp_, 1);
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
  peer_ = PeerName(tcp_);
}

Connection::~Connection() { delete tcp_; }

Status Connection::StartReading() {
  DCHECK(loop_->InLoopThread());
  return UvStatus(uv_read_start(reinterpret_cast<uv_stream_t*>(tcp_), &ConnectionCallbacks::OnAlloc,
                                &ConnectionCallbacks::OnRead),
                  "uv_read_start");
}

void Connection::OnBytes(size_t n) {
  DCHECK(loop_->InLoopThread());
  last_read_ = std::chrono::steady_clock::now();
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
    return Append(meta, data_len, 0, std::move(payload), &st) != nullptr ? Status::Ok() : st;
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
  return Status::Ok();
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
  if (!pending_) {
    pending_ = spare_ ? std::move(spare_) : std::make_unique<WriteBatch>();
    pending_->conn = this;
  }
  WriteBatch& b = *pending_;
  const size_t head_len = kHeaderBytes + meta_len + inline_bytes;
  size_t off = b.head.size();
  b.head.resize(off + head_len);
  StoreHeader(FrameHeader{kMagic, static_cast<uint32_t>(meta_len), data_len}, &b.head[off]);
  meta.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(&b.head[off + kHeaderBytes]));
  StoreMetaPad(pad_len, &b.head[off + kHeaderBytes + fields_len]);
  b.head_spans.emplace_back(off, head_len);
  out_offset_ += frame_bytes;
  b.payloads.push_back(std::move(payload));
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
  return &b.head[off + kHeaderBytes + meta_len];
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
  if (!pending_ || closing_) return;
  if (tls_ && !tls_->established()) return;  // OnCipher flushes once it is
  std::unique_ptr<WriteBatch> batch = std::move(pending_);
  std::vector<uv_buf_t>& bufs = iov_;  // reused: no allocation per flush
  bufs.clear();
  for (size_t i = 0; i < batch->head_spans.size(); ++i) {
    auto [off, len] = batch->head_spans[i];
    if (!bufs.empty() && bufs.back().base + bufs.back().len == &batch->head[off]) {
      bufs.back().len += len;  // head bytes follow head bytes (no payload between): one iovec
    } else {
      bufs.push_back(uv_buf_init(&batch->head[off], static_cast<unsigned>(len)));
    }
    const Payload& p = batch->payloads[i];
    auto add = [&bufs](const char* data, size_t size) {
      for (size_t at = 0; at < size; at += kMaxIovBytes) {
        bufs.push_back(uv_buf_init(const_cast<char*>(data + at), static_cast<unsigned>(std::min(size - at, kMaxIovBytes))));
      }
    };
    if (p.head) add(p.head->data(), p.head->size());
    for (const Slice& s : p.tail) add(s.data, s.size);
  }
  if (tls_) {
    batch->plain.assign(bufs.begin(), bufs.end());
    tls_plain_.push_back(std::move(batch));
    PumpTls();
    return;
  }
  Write(std::move(batch), bufs);
}

void Connection::Write(std::unique_ptr<WriteBatch> batch, std::vector<uv_buf_t>& bufs) {
  // Write what the socket takes at once; queue only the rest. On an idle socket this
  // saves the write request, its deferred callback and an epoll_ctl per flush.
  auto* stream = reinterpret_cast<uv_stream_t*>(tcp_);
  int n = uv_try_write(stream, bufs.data(), static_cast<unsigned>(bufs.size()));
  if (n < 0 && n != UV_EAGAIN) {
    DropQueued(batch->bytes, batch->shared_bytes, batch->shared_payloads);
    Close(UvStatus(n, "write"));
    return;
  }
  size_t first = 0;
  for (size_t left = n > 0 ? static_cast<size_t>(n) : 0; left > 0;) {
    size_t take = std::min<size_t>(left, bufs[first].len);
    bufs[first].base += take;
    bufs[first].len -= take;
    left -= take;
    if (bufs[first].len == 0) ++first;
  }
  while (first < bufs.size() && bufs[first].len == 0) ++first;
  if (first == bufs.size()) {
    DropQueued(batch->bytes, batch->shared_bytes, batch->shared_payloads);
    Recycle(std::move(batch));
    return;
  }
  batch->req.data = batch.get();
  int rc = uv_write(&batch->req, stream, bufs.data() + first,
                    static_cast<unsigned>(bufs.size() - first), &ConnectionCallbacks::OnWriteDone);
  if (rc < 0) {
    DropQueued(batch->bytes, batch->shared_bytes, batch->shared_payloads);
    Close(UvStatus(rc, "uv_write"));
    return;
  }
  batch.release();  // Freed in OnWriteDone.
}

void Connection::Recycle(std::unique_ptr<WriteBatch> batch) {
  // Drop the payload references, keep the storage.
  batch->head.clear();
  batch->head_spans.clear();
  batch->payloads.clear();
  batch->plain.clear();
  batch->bytes = 0;
  batch->shared_bytes = 0;
  batch->shared_payloads = 0;
  if (batch->head.capacity() <= (1u << 20)) spare_ = std::move(batch);  // Don't hoard big ones.
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
  uv_read_stop(reinterpret_cast<uv_stream_t*>(tcp_));
  if (owner_ != nullptr) owner_->OnClosing(id_, why);  // Table lets go of *this.
  uv_close(reinterpret_cast<uv_handle_t*>(tcp_), &ConnectionCallbacks::OnClosed);
}

}  // namespace pscore::comm
