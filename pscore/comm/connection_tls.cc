#include "pscore/comm/connection.h"

#include <algorithm>

#include "pscore/comm/connection_internal.h"
#include "pscore/comm/event_loop.h"
#include "pscore/comm/tls.h"
#include "pscore/comm/uv_status.h"

// TLS under a Connection's frames: the handshake, decryption into the frame decoder's
// region, and encryption of the write queue a chunk at a time.

namespace pscore::comm {

void Connection::StartTls() {
  DCHECK(loop_->InLoopThread());
  tls_ = std::make_unique<TlsSession>(options_.tls, accepted_);
  if (accepted_) return;  // The dialler speaks first.
  Status st = tls_->Handshake();  // ClientHello
  PumpTls();
  if (!st.ok()) Close(st);
}

const std::string& Connection::peer_identity() const {
  static const std::string kNone;
  return tls_ ? tls_->peer_identity() : kNone;
}

void Connection::OnCipher(const char* data, size_t n) {
  DCHECK(loop_->InLoopThread());
  last_read_ = std::chrono::steady_clock::now();
  any_read_ = true;
  TlsSession::Lent lent = tls_->Lend(data, n);  // read in place; a partial record is kept at the end
  if (!tls_->established()) {
    Status st = tls_->Handshake();
    PumpTls();  // our next handshake flight, or the alert that says why we refuse
    if (!st.ok()) {
      LOG(ERROR) << "conn " << id_ << " " << peer_ << ": " << st.message();
      CloseAfterFlush(st);
      return;
    }
    if (!tls_->established()) return;
    VLOG(1) << "conn " << id_ << " " << peer_ << ": TLS established with " << tls_->peer_identity();
    if (owner_ != nullptr) owner_->OnTlsEstablished(id_);
    if (closing_) return;
    Flush();  // frames queued while the handshake ran
  }
  Decrypt();
}

// Plaintext goes straight from the session into the decoder's region: a large payload's
// bytes land in its own buffer with no copy beyond the decryption.
void Connection::Decrypt() {
  DCHECK(loop_->InLoopThread());
  while (!closing_) {
    size_t size = 0;
    char* region = decoder_.ReadRegion(&size);
    Result<size_t> got = tls_->Read(region, size);
    if (!got.ok() || *got == 0) {
      decoder_.Commit(0, &decoded_).IgnoreError();  // releases the region
      if (!got.ok()) {
        if (got.status().code() == Code::kUnavailable) {
          VLOG(1) << "conn " << id_ << " " << peer_ << ": " << got.status();
        } else {
          LOG(ERROR) << "conn " << id_ << " " << peer_ << ": " << got.status().message();
        }
        PumpTls();
        Close(got.status());
      }
      break;
    }
    OnBytes(*got);
  }
  PumpTls();  // post-handshake messages (key updates)
}

void Connection::PumpTls() {
  DCHECK(loop_->InLoopThread());
  auto* stream = reinterpret_cast<uv_stream_t*>(tcp_);
  while (!closing_ && !tls_writing_) {
    if (!tls_chunk_) {
      tls_chunk_ = std::make_unique<WriteBatch>();
      tls_chunk_->conn = this;
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
    const int n = uv_try_write(stream, &buf, 1);
    if (n < 0 && n != UV_EAGAIN) {
      Close(UvStatus(n, "write"));
      return;
    }
    const size_t took = n > 0 ? static_cast<size_t>(n) : 0;
    if (took == cipher.size()) continue;  // all taken: the same buffer serves the next chunk
    buf.base += took;
    buf.len -= took;
    tls_chunk_->req.data = tls_chunk_.get();
    const int rc = uv_write(&tls_chunk_->req, stream, &buf, 1, &ConnectionCallbacks::OnWriteDone);
    if (rc < 0) {
      Close(UvStatus(rc, "uv_write"));
      return;
    }
    tls_writing_ = true;
    tls_chunk_.release();  // back in OnWriteDone
  }
}

// The queued plaintext (payload buffers referenced, not copied) goes to SSL_write in large
// pieces, so records are cut at 16 KiB; small pieces are gathered first. A batch encrypted
// whole leaves the queue.
bool Connection::EncryptChunk() {
  size_t budget = kTlsChunkBytes;
  tls_->Reserve(budget);
  while (budget > 0 && !tls_plain_.empty()) {
    WriteBatch& b = *tls_plain_.front();
    if (tls_iov_ == b.plain.size()) {
      DropQueued(b.bytes, b.shared_bytes, b.shared_payloads);
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
        LOG(ERROR) << "conn " << id_ << " " << peer_ << ": " << st.message();
        Close(st);
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

bool Connection::WriteStage() {
  if (tls_stage_.empty()) return true;
  Status st = tls_->Write(tls_stage_.data(), tls_stage_.size());
  tls_stage_.clear();
  if (st.ok()) return true;
  LOG(ERROR) << "conn " << id_ << " " << peer_ << ": " << st.message();
  Close(st);
  return false;
}

}  // namespace pscore::comm
