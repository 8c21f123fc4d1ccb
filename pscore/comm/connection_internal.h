// Comm-internal pieces Connection's two sources share (connection.cc: reads, the write
// queue and close; connection_tls.cc: TLS under the frames). Included only by those.
#pragma once

#include <uv.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pscore/comm/connection.h"

namespace pscore::comm {

// TLS: ciphertext is read into a buffer of this size, one per loop thread (OpenSSL reads
// each read in place during OnCipher, and what it leaves of a partial record is copied
// out), then decrypted straight into the frame decoder's region (a large payload's own
// buffer). Large reads mean few system calls per byte.
constexpr size_t kCipherReadBytes = 256 << 10;
inline char* CipherReadBuffer() {
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

// All frames queued in one loop iteration go out in one uv_write (writev): header+meta
// bytes (and payloads of at most kInlinePayloadBytes) are owned here, larger payloads are
// referenced until the write completes.
struct WriteBatch {
  uv_write_t req;
  Connection* conn = nullptr;
  std::string head;                    // headers and metas back to back
  std::vector<std::pair<size_t, size_t>> head_spans;  // (offset, len) per frame, back to back
  std::vector<Payload> payloads;       // per frame; empty when inline or none
  std::vector<uv_buf_t> plain;         // TLS: the frames' plaintext, in order
  std::string cipher;                  // TLS chunk: ciphertext (what is written)
  bool tls_chunk = false;              // a TLS ciphertext chunk, not a batch of frames
  uint64_t bytes = 0;
  uint64_t shared_bytes = 0;           // of bytes: shared payloads
  size_t shared_payloads = 0;          // frames with a shared payload
};

// libuv trampolines (connection.cc).
struct ConnectionCallbacks {
  static void OnAlloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf);
  static void OnRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
  static void OnWriteDone(uv_write_t* req, int status);
  static void OnClosed(uv_handle_t* handle);
};

}  // namespace pscore::comm
