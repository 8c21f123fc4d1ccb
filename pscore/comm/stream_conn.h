// StreamConn: one TCP stream as bytes, under a protocol that knows what the bytes mean
// (Connection: frames; HttpServer: requests and answers). It owns the uv_tcp_t, reads into
// the protocol's memory, queues writes in batches that go out as one writev each, runs TLS
// under it all (handshake, decryption into the protocol's memory, encryption of the queue a
// chunk at a time), tracks when bytes last arrived, and closes. Internal to comm/.
// Loop thread only. A member of its protocol object, which is freed in OnStreamClosed
// (libuv's close callback); nothing of *this is touched after that call.
#pragma once

#include <uv.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pscore/core/buffer.h"
#include "pscore/core/clock.h"
#include "pscore/core/status.h"

namespace pscore::comm {

class EventLoop;
class StreamConn;
class TlsContext;
class TlsSession;
struct WriteBatch;

// What a StreamConn reports to the protocol on top of it. Loop thread only.
class StreamUser {
 public:
  enum class Failure {
    kRead,          // end of stream or a read error
    kHandshake,     // the TLS handshake failed (its alert, if any, is already written)
    kTlsRead,       // TLS: the session ended or the stream is bad (kUnavailable: peer closed)
    kWrite,         // a write failed
    kTlsWrite,      // TLS could not encrypt the queue
  };
  // Room for the next plaintext bytes (at least one byte).
  virtual char* ReadRegion(size_t* size) = 0;
  // `n` plaintext bytes landed at `data`, the start of the region last handed out;
  // n == 0: nothing came, and the region is released.
  virtual void OnStreamBytes(const char* data, size_t n) = 0;
  // TLS: the handshake finished (the peer's certificate verified).
  virtual void OnStreamTls() = 0;
  // The stream cannot go on; the user closes it (and logs what it wants to).
  virtual void OnStreamFailed(Failure what, const Status& why) = 0;
  // A queued batch left the queue: written whole, or (TLS) encrypted whole.
  virtual void OnBatchDone(const WriteBatch& batch) = 0;
  // A write libuv had queued completed (a batch, or a TLS ciphertext chunk).
  virtual void OnStreamWritten() = 0;
  // libuv let go of the handle: the user may free itself (and *this) now.
  virtual void OnStreamClosed() = 0;

 protected:
  ~StreamUser() = default;
};

// Payloads larger than this go to writev as several iovecs (uv_buf_t's length is an
// unsigned int: a part of 4 GiB or more would be cut short and break the stream).
inline constexpr size_t kMaxIovBytes = size_t{256} << 20;

// The bytes queued on a stream in one go (one loop iteration of frames, one HTTP answer):
// records of owned bytes (`head`, back to back), each followed by a referenced payload
// that is kept alive until the batch is written. Written with one uv_write (writev).
struct WriteBatch {
  // Appends a record: `len` bytes of room in head (returned), then `payload` (may be empty).
  char* Add(size_t len, Payload payload) {
    size_t off = head.size();
    head.resize(off + len);
    head_spans.emplace_back(off, len);
    payloads.push_back(std::move(payload));
    return &head[off];
  }
  uv_write_t req;                      // libuv's request while queued there
  StreamConn* stream = nullptr;
  std::string head;                    // the records' owned bytes, back to back
  std::vector<std::pair<size_t, size_t>> head_spans;  // (offset, len) per record
  std::vector<Payload> payloads;       // per record; empty when none
  std::vector<uv_buf_t> plain;         // TLS: the batch's plaintext, in order
  std::string cipher;                  // TLS chunk: ciphertext (what is written)
  bool tls_chunk = false;              // a TLS ciphertext chunk, not a batch
  // The user's accounting: what the batch holds in all, and of that, in shared payloads.
  uint64_t bytes = 0;
  uint64_t shared_bytes = 0;
  size_t shared_payloads = 0;
};

class StreamConn {
 public:
  struct Options {
    // Write through libuv's queue only, never uv_try_write first: every write then
    // completes in a later callback (OnStreamWritten), never inside Flush.
    bool always_queue = false;
  };
  // Takes an initialised uv_tcp_t (accepted or connected); ownership passes to *this.
  StreamConn(StreamUser* user, EventLoop* loop, uv_tcp_t* tcp, Options options);
  ~StreamConn();
  StreamConn(const StreamConn&) = delete;
  StreamConn& operator=(const StreamConn&) = delete;

  Status StartReading();
  // Puts TLS under the stream; the handshake starts now on the dialling side (`server`
  // false). An error: the first handshake message could not be made (the user closes).
  Status StartTls(std::shared_ptr<TlsContext> context, bool server);
  bool tls() const { return tls_ != nullptr; }
  bool tls_established() const;
  // The peer certificate's identity once TLS is established ("" without TLS).
  const std::string& peer_identity() const;

  // The batch queued since the last Flush (made on first use).
  WriteBatch& batch() {
    if (!pending_) NewBatch();
    return *pending_;
  }
  bool has_batch() const { return pending_ != nullptr; }
  // Writes the queued batch (as far as the socket takes it now; the rest through libuv).
  // Under TLS nothing goes out before the handshake finished: it flushes then.
  void Flush();
  // Writes the queued batch as Flush does (plaintext only: under TLS it stays queued for
  // Flush), but a failed write is reported from libuv's callback on a later turn, so a
  // frame's sender is not re-entered by a close.
  void StartFlush();
  // Nothing queued, nothing being encrypted, nothing waiting in libuv.
  bool drained() const { return !pending_ && tls_plain_.empty() && !tls_writing_ && in_flight_ == 0; }
  // TLS: ciphertext handed to libuv and not yet written.
  uint64_t cipher_unsent() const { return tls_writing_ ? cipher_unsent_ : 0; }
  // Writes `data` now if the socket takes it at once (encrypted under established TLS);
  // otherwise it is dropped. For a last word right before Close.
  void TryWriteNow(const char* data, size_t n);
  // Shuts the write side once what libuv holds is written. False when it cannot.
  bool ShutdownWrite();
  // Idempotent. Stops reading and closes; OnStreamClosed follows from libuv.
  void Close();
  bool closing() const { return closing_; }

  uv_tcp_t* tcp() const { return tcp_; }
  TimePoint last_read() const { return last_read_; }  // bytes last arrived (or accept)

 private:
  friend struct StreamCallbacks;  // libuv trampolines, in stream_conn.cc
  void NewBatch();
  // Ciphertext read from the socket: on with the handshake, then plaintext to the user.
  void OnCipher(const char* data, size_t n);
  void Decrypt();
  // TLS: writes the ciphertext the session produced (handshake messages, alerts), then
  // encrypts the queued plaintext a chunk at a time while the socket takes it.
  void PumpTls();
  // TLS: encrypts up to kTlsChunkBytes of the queued plaintext. False when it failed.
  bool EncryptChunk();
  // TLS: the gathered small pieces become one record.
  bool WriteStage();
  // The queued batch as iovecs (into iov_), and the batch taken out of pending_.
  std::unique_ptr<WriteBatch> TakeBatch();
  // Writes bufs of `batch` (try first, then queue the rest); owns the batch till done.
  // Without `fail_now` a failed write is left to libuv's callback, on a later turn (short
  // of libuv failing to allocate for the rest of a batch the socket took in part).
  void Write(std::unique_ptr<WriteBatch> batch, std::vector<uv_buf_t>& bufs, bool fail_now);
  // A batch written (or encrypted) whole: kept for reuse unless it grew big.
  void Recycle(std::unique_ptr<WriteBatch> batch);
  void Fail(StreamUser::Failure what, const Status& why);

  StreamUser* user_;
  EventLoop* loop_;
  uv_tcp_t* tcp_;
  Options options_;
  bool closing_ = false;
  TimePoint last_read_;
  std::unique_ptr<WriteBatch> pending_;  // queued since the last Flush
  std::unique_ptr<WriteBatch> spare_;    // a written batch kept for reuse (no allocation per flush)
  std::vector<uv_buf_t> iov_;            // scratch scatter/gather list of Flush
  size_t in_flight_ = 0;                 // batches queued in libuv
  std::unique_ptr<TlsSession> tls_;
  // TLS: flushed batches waiting to be encrypted (front first); their plaintext is encrypted
  // as the socket drains, so the ciphertext of one chunk at most is waiting in libuv.
  std::deque<std::unique_ptr<WriteBatch>> tls_plain_;
  size_t tls_iov_ = 0;     // the front batch's plaintext iovec reached
  size_t tls_iov_at_ = 0;  // and how far into it
  bool tls_writing_ = false;               // a ciphertext chunk is queued in libuv
  uint64_t cipher_unsent_ = 0;             // its bytes
  std::unique_ptr<WriteBatch> tls_chunk_;  // the ciphertext buffer while not queued (reused)
  std::string tls_stage_;                  // small plaintext pieces gathered into one record
};

}  // namespace pscore::comm
