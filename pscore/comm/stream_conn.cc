#include "pscore/comm/stream_conn.h"

#include <algorithm>

#include "pscore/comm/event_loop.h"
#include "pscore/comm/tls.h"
#include "pscore/comm/uv_status.h"

namespace pscore::comm {

namespace {

// TLS: ciphertext is read into a buffer of this size, one per loop thread (OpenSSL reads
// each read in place during OnCipher, and what it leaves of a partial record is copied
// out), then decrypted straight into the user's region (for frames, a large payload's own
// buffer). Large reads mean few system calls per byte.
constexpr size_t kCipherReadBytes = 256 << 10;
char* CipherReadBuffer() {
  thread_local std::unique_ptr<char[]> buffer(new char[kCipherReadBytes]);
  return buffer.get();
}
// TLS: plaintext encrypted per pass before the ciphertext goes to the socket. While the
// socket keeps up, one buffer of this size serves every pass (no allocation, still in cache
// when the kernel copies it).
constexpr size_t kTlsChunkBytes = 256 << 10;
// TLS: plaintext pieces shorter than this (headers and metas, small payloads) are gathered
// into one record of up to kTlsRecordBytes instead of a record each.
constexpr size_t kTlsSmallPiece = 2 << 10;
constexpr size_t kTlsRecordBytes = 16 << 10;

}  // namespace

struct StreamCallbacks {
  static void OnAlloc(uv_handle_t* handle, size_t /*suggested*/, uv_buf_t* buf) {
    auto* self = static_cast<StreamConn*>(handle->data);
    if (self->tls_) {
      *buf = uv_buf_init(CipherReadBuffer(), static_cast<unsigned>(kCipherReadBytes));
      return;
    }
    size_t size = 0;
    char* region = self->user_->ReadRegion(&size);
    // Reads of over 1 GiB at once gain nothing.
    *buf = uv_buf_init(region, static_cast<unsigned>(std::min<size_t>(size, 1u << 30)));
  }

  static void OnRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
    auto* self = static_cast<StreamConn*>(stream->data);
    if (self->closing_) return;
    if (nread > 0) {
      self->last_read_ = std::chrono::steady_clock::now();
      if (self->tls_) return self->OnCipher(buf->base, static_cast<size_t>(nread));
      self->user_->OnStreamBytes(buf->base, static_cast<size_t>(nread));
      return;
    }
    if (nread == 0) {
      // EAGAIN: nothing arrived, so the handed-out region is released.
      if (!self->tls_) self->user_->OnStreamBytes(buf->base, 0);
      return;
    }
    Status why = nread == UV_EOF ? Status(Code::kUnavailable, "peer closed the connection")
                                 : UvStatus(static_cast<int>(nread), "read");
    self->Fail(StreamUser::Failure::kRead, why);
  }

  static void OnWriteDone(uv_write_t* req, int status) {
    std::unique_ptr<WriteBatch> batch(static_cast<WriteBatch*>(req->data));
    StreamConn* self = batch->stream;
    if (batch->tls_chunk) {
      self->tls_writing_ = false;
      self->cipher_unsent_ = 0;
      if (status < 0) {
        if (status != UV_ECANCELED) self->Fail(StreamUser::Failure::kWrite, UvStatus(status, "write"));
        return;
      }
      self->tls_chunk_ = std::move(batch);
      self->PumpTls();
    } else {
      --self->in_flight_;
      self->user_->OnBatchDone(*batch);
      if (status < 0) {
        if (status != UV_ECANCELED) self->Fail(StreamUser::Failure::kWrite, UvStatus(status, "write"));
        return;
      }
      if (!self->spare_) self->Recycle(std::move(batch));
    }
    if (!self->closing_) self->user_->OnStreamWritten();
  }

  static void OnClosed(uv_handle_t* handle) {
    auto* self = static_cast<StreamConn*>(handle->data);
    self->user_->OnStreamClosed();  // frees *self; touch nothing after this line
  }
};

StreamConn::StreamConn(StreamUser* user, EventLoop* loop, uv_tcp_t* tcp, Options options)
    : user_(user), loop_(loop), tcp_(tcp), options_(options), last_read_(std::chrono::steady_clock::now()) {
  tcp_->data = this;
}

StreamConn::~StreamConn() { delete tcp_; }

Status StreamConn::StartReading() {
  DCHECK(loop_->InLoopThread());
  return UvStatus(uv_read_start(reinterpret_cast<uv_stream_t*>(tcp_), &StreamCallbacks::OnAlloc,
                                &StreamCallbacks::OnRead),
                  "uv_read_start");
}

void StreamConn::Fail(StreamUser::Failure what, const Status& why) {
  if (closing_) return;
  user_->OnStreamFailed(what, why);
}

// ---- TLS: the handshake and decryption ----

Status StreamConn::StartTls(std::shared_ptr<TlsContext> context, bool server) {
  DCHECK(loop_->InLoopThread());
  tls_ = std::make_unique<TlsSession>(std::move(context), server);
  if (server) return Status::Ok();  // The dialler speaks first.
  Status st = tls_->Handshake();    // ClientHello
  PumpTls();
  return st;
}

bool StreamConn::tls_established() const { return tls_ && tls_->established(); }

const std::string& StreamConn::peer_identity() const {
  static const std::string kNone;
  return tls_ ? tls_->peer_identity() : kNone;
}

void StreamConn::OnCipher(const char* data, size_t n) {
  DCHECK(loop_->InLoopThread());
  TlsSession::Lent lent = tls_->Lend(data, n);  // read in place; a partial record is kept at the end
  if (!tls_->established()) {
    Status st = tls_->Handshake();
    PumpTls();  // our next handshake flight, or the alert that says why we refuse
    if (!st.ok()) return Fail(StreamUser::Failure::kHandshake, st);
    if (!tls_->established()) return;
    user_->OnStreamTls();
    if (closing_) return;
    Flush();  // what was queued while the handshake ran
  }
  Decrypt();
}

// Plaintext goes straight from the session into the user's region: a large payload's
// bytes land in its own buffer with no copy beyond the decryption.
void StreamConn::Decrypt() {
  DCHECK(loop_->InLoopThread());
  while (!closing_) {
    size_t size = 0;
    char* region = user_->ReadRegion(&size);
    Result<size_t> got = tls_->Read(region, size);
    if (!got.ok() || *got == 0) {
      user_->OnStreamBytes(region, 0);  // releases the region
      if (!got.ok()) {
        PumpTls();
        return Fail(StreamUser::Failure::kTlsRead, got.status());
      }
      break;
    }
    user_->OnStreamBytes(region, *got);
  }
  PumpTls();  // post-handshake messages (key updates)
}

// ---- the write queue ----

void StreamConn::NewBatch() {
  pending_ = spare_ ? std::move(spare_) : std::make_unique<WriteBatch>();
  pending_->stream = this;
}

void StreamConn::Flush() {
  DCHECK(loop_->InLoopThread());
  if (!pending_ || closing_) return;
  if (tls_ && !tls_->established()) return;  // OnCipher flushes once it is
  std::unique_ptr<WriteBatch> batch = TakeBatch();
  if (tls_) {
    batch->plain.assign(iov_.begin(), iov_.end());
    tls_plain_.push_back(std::move(batch));
    PumpTls();
    return;
  }
  Write(std::move(batch), iov_, /*fail_now=*/true);
}

void StreamConn::StartFlush() {
  DCHECK(loop_->InLoopThread());
  if (!pending_ || closing_ || tls_) return;
  Write(TakeBatch(), iov_, /*fail_now=*/false);
}

std::unique_ptr<WriteBatch> StreamConn::TakeBatch() {
  std::unique_ptr<WriteBatch> batch = std::move(pending_);
  std::vector<uv_buf_t>& bufs = iov_;  // reused: no allocation per flush
  bufs.clear();
  auto add = [&bufs](const char* data, size_t size) {
    for (size_t at = 0; at < size; at += kMaxIovBytes) {
      bufs.push_back(uv_buf_init(const_cast<char*>(data + at), static_cast<unsigned>(std::min(size - at, kMaxIovBytes))));
    }
  };
  for (size_t i = 0; i < batch->head_spans.size(); ++i) {
    auto [off, len] = batch->head_spans[i];
    if (len > 0) {
      if (!bufs.empty() && bufs.back().base + bufs.back().len == &batch->head[off]) {
        bufs.back().len += len;  // owned bytes follow owned bytes (no payload between): one iovec
      } else {
        bufs.push_back(uv_buf_init(&batch->head[off], static_cast<unsigned>(len)));
      }
    }
    const Payload& p = batch->payloads[i];
    if (p.head) add(p.head->data(), p.head->size());
    for (const Slice& s : p.tail) add(s.data, s.size);
  }
  return batch;
}

void StreamConn::Write(std::unique_ptr<WriteBatch> batch, std::vector<uv_buf_t>& bufs, bool fail_now) {
  // Write what the socket takes at once; queue only the rest. On an idle socket this
  // saves the write request, its deferred callback and an epoll_ctl per flush.
  auto* stream = reinterpret_cast<uv_stream_t*>(tcp_);
  int n = 0;
  if (!options_.always_queue) {
    n = uv_try_write(stream, bufs.data(), static_cast<unsigned>(bufs.size()));
    if (n < 0 && n != UV_EAGAIN) {
      if (fail_now) {
        user_->OnBatchDone(*batch);
        return Fail(StreamUser::Failure::kWrite, UvStatus(n, "write"));
      }
      n = 0;  // uv_write below meets the same error, and reports it from its callback
    }
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
  if (first == bufs.size() && (!options_.always_queue || bufs.empty())) {
    user_->OnBatchDone(*batch);
    Recycle(std::move(batch));
    return;
  }
  batch->req.data = batch.get();
  int rc = uv_write(&batch->req, stream, bufs.data() + first, static_cast<unsigned>(bufs.size() - first),
                    &StreamCallbacks::OnWriteDone);
  if (rc < 0) {
    if (!fail_now && n == 0) {
      pending_ = std::move(batch);  // refused before a byte went out: the next Flush meets it
      return;
    }
    user_->OnBatchDone(*batch);
    return Fail(StreamUser::Failure::kWrite, UvStatus(rc, "uv_write"));
  }
  ++in_flight_;
  batch.release();  // Freed, or kept for reuse, in OnWriteDone.
}

void StreamConn::Recycle(std::unique_ptr<WriteBatch> batch) {
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

// ---- TLS: encryption of the queue ----

void StreamConn::PumpTls() {
  DCHECK(loop_->InLoopThread());
  auto* stream = reinterpret_cast<uv_stream_t*>(tcp_);
  while (!closing_ && !tls_writing_) {
    if (!tls_chunk_) {
      tls_chunk_ = std::make_unique<WriteBatch>();
      tls_chunk_->stream = this;
      tls_chunk_->tls_chunk = true;
    }
    std::string& cipher = tls_chunk_->cipher;
    cipher.clear();
    tls_->TakeCipher(&cipher);  // handshake and post-handshake messages first
    if (tls_->established() && !tls_plain_.empty()) {
      if (!EncryptChunk()) return;
      tls_->TakeCipher(&cipher);
    }
    if (cipher.empty()) return;
    uv_buf_t buf = uv_buf_init(cipher.data(), static_cast<unsigned>(cipher.size()));
    int n = 0;
    if (!options_.always_queue) {
      n = uv_try_write(stream, &buf, 1);
      if (n < 0 && n != UV_EAGAIN) return Fail(StreamUser::Failure::kWrite, UvStatus(n, "write"));
    }
    const size_t took = n > 0 ? static_cast<size_t>(n) : 0;
    if (took == cipher.size()) continue;  // all taken: the same buffer serves the next chunk
    buf.base += took;
    buf.len -= took;
    tls_chunk_->req.data = tls_chunk_.get();
    const int rc = uv_write(&tls_chunk_->req, stream, &buf, 1, &StreamCallbacks::OnWriteDone);
    if (rc < 0) return Fail(StreamUser::Failure::kWrite, UvStatus(rc, "uv_write"));
    tls_writing_ = true;
    cipher_unsent_ = buf.len;
    tls_chunk_.release();  // back in OnWriteDone
  }
}

// The queued plaintext (payload buffers referenced, not copied) goes to SSL_write in large
// pieces, so records are cut at 16 KiB; small pieces are gathered first. A batch encrypted
// whole leaves the queue.
bool StreamConn::EncryptChunk() {
  size_t budget = kTlsChunkBytes;
  tls_->Reserve(budget);
  while (budget > 0 && !tls_plain_.empty()) {
    WriteBatch& b = *tls_plain_.front();
    if (tls_iov_ == b.plain.size()) {
      user_->OnBatchDone(b);
      std::unique_ptr<WriteBatch> done = std::move(tls_plain_.front());
      tls_plain_.pop_front();
      tls_iov_ = 0;
      tls_iov_at_ = 0;
      Recycle(std::move(done));
      continue;
    }
    const uv_buf_t& v = b.plain[tls_iov_];
    const char* from = v.base + tls_iov_at_;
    const size_t left = v.len - tls_iov_at_;
    size_t take = std::min(left, budget);
    if (left < kTlsSmallPiece) {
      take = left;
      tls_stage_.append(from, take);
      if (tls_stage_.size() + kTlsSmallPiece > kTlsRecordBytes && !WriteStage()) return false;
    } else {
      if (!WriteStage()) return false;
      Status st = tls_->Write(from, take);
      if (!st.ok()) {
        Fail(StreamUser::Failure::kTlsWrite, st);
        return false;
      }
    }
    budget -= std::min(budget, take);
    tls_iov_at_ += take;
    if (tls_iov_at_ == v.len) {
      ++tls_iov_;
      tls_iov_at_ = 0;
    }
  }
  return WriteStage();
}

bool StreamConn::WriteStage() {
  if (tls_stage_.empty()) return true;
  Status st = tls_->Write(tls_stage_.data(), tls_stage_.size());
  tls_stage_.clear();
  if (st.ok()) return true;
  Fail(StreamUser::Failure::kTlsWrite, st);
  return false;
}

// ---- the end ----

void StreamConn::TryWriteNow(const char* data, size_t n) {
  DCHECK(loop_->InLoopThread());
  if (closing_) return;
  std::string cipher;
  uv_buf_t buf = uv_buf_init(const_cast<char*>(data), static_cast<unsigned>(n));
  if (tls_) {
    if (!tls_->established() || !tls_->Write(data, n).ok()) return;
    tls_->TakeCipher(&cipher);
    buf = uv_buf_init(cipher.data(), static_cast<unsigned>(cipher.size()));
  }
  uv_try_write(reinterpret_cast<uv_stream_t*>(tcp_), &buf, 1);
}

bool StreamConn::ShutdownWrite() {
  DCHECK(loop_->InLoopThread());
  if (closing_) return false;
  auto* req = new uv_shutdown_t;
  int rc = uv_shutdown(req, reinterpret_cast<uv_stream_t*>(tcp_), [](uv_shutdown_t* r, int) { delete r; });
  if (rc == 0) return true;
  delete req;
  return false;
}

void StreamConn::Close() {
  DCHECK(loop_->InLoopThread());
  if (closing_) return;
  closing_ = true;
  uv_read_stop(reinterpret_cast<uv_stream_t*>(tcp_));
  uv_close(reinterpret_cast<uv_handle_t*>(tcp_), &StreamCallbacks::OnClosed);
}

}  // namespace pscore::comm
