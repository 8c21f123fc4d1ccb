// TLS 1.3 with mutual authentication, driven on the event loop through BIOs of our own (no socket).
// TlsContext is a process's settings (one SSL_CTX: its certificate and key, the cluster
// CA); it is shared by every transport and HTTP server of the process, any thread
// (Reload swaps the SSL_CTX under a lock; sessions hold a reference to theirs).
// TlsSession is one connection's state; owned by that connection, loop thread only: the
// owner feeds it the ciphertext it reads, takes plaintext out, hands it plaintext to
// encrypt and writes the ciphertext it produces. It never touches a socket, so no call
// blocks and no thread is needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "pscore/core/status.h"

struct ssl_ctx_st;
struct ssl_st;
struct bio_st;

namespace pscore::comm {

struct TlsFiles {
  std::string cert;  // PEM: this process's certificate (it may be followed by intermediates)
  std::string key;   // PEM: its private key
  std::string ca;    // PEM: the cluster CA that signed every peer's certificate
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

class TlsContext {
 public:
  // Loads and checks the files (all three are needed; the key must match the
  // certificate). TLS 1.3 only; every peer must present a certificate the CA signed.
  static Result<std::shared_ptr<TlsContext>> Load(const TlsFiles& files);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // Reads the files again: connections made from now on use them, established ones keep
  // theirs. On an error the old settings stay.
  Status Reload();
  // The current SSL_CTX with a reference taken for the caller (SSL_CTX_free it).
  ssl_ctx_st* AcquireCtx() const;
  // The identity our certificate names (its subject CN).
  std::string identity() const;
  // Seconds from now until our certificate's notAfter (negative: expired).
  int64_t SecondsToExpiry() const;

 private:
  struct Loaded;
  static Result<Loaded> Read(const TlsFiles& files);
  TlsContext() = default;
  TlsFiles files_;
  mutable std::mutex mu_;
  ssl_ctx_st* ctx_ = nullptr;  // guarded by mu_
  std::string identity_;       // guarded by mu_
  int64_t not_after_unix_ = 0;  // guarded by mu_
};

class TlsSession {
 public:
  TlsSession(std::shared_ptr<TlsContext> context, bool server);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // Ciphertext read from the socket, in order; copied (the caller's buffer may go at once).
  void Feed(const char* data, size_t n);
  // Ciphertext read from the socket, not copied: OpenSSL reads it in place during the calls
  // that follow, while the returned guard lives; the guard's end copies what is still unread
  // (a partial record), so `data` need only outlive the guard.
  class Lent {
   public:
    explicit Lent(TlsSession* s) : s_(s) {}
    Lent(Lent&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
    Lent(const Lent&) = delete;
    Lent& operator=(const Lent&) = delete;
    Lent& operator=(Lent&&) = delete;
    ~Lent() {
      if (s_ != nullptr) s_->KeepUnread();
    }

   private:
    TlsSession* s_;
  };
  [[nodiscard]] Lent Lend(const char* data, size_t n);
  // Advances the handshake as far as the bytes fed allow. OK: done, or waiting for more
  // (see established()). An error names the cause in one line (plaintext peer, peer
  // certificate rejected and why, our certificate refused by the peer).
  Status Handshake();
  bool established() const { return established_; }
  // Decrypts up to `cap` bytes into dst. Returns the count (0: nothing more until more
  // ciphertext is fed); an error when the peer closed the session or the stream is bad.
  Result<size_t> Read(char* dst, size_t cap);
  // Encrypts plaintext; the ciphertext waits for TakeCipher. Only once established. Each
  // call ends a record: give it large pieces (records of up to 16 KiB are cut from them).
  Status Write(const char* data, size_t n);
  // Ciphertext produced and not yet taken.
  size_t pending_cipher() const;
  // Appends the ciphertext produced so far to *out (in order); moved, not copied, when
  // *out is empty.
  void TakeCipher(std::string* out);
  // Makes room for the ciphertext of `plaintext` bytes about to be written.
  void Reserve(size_t plaintext);
  // The peer certificate's subject CN (set once established; it passed CA verification).
  const std::string& peer_identity() const { return peer_identity_; }

 private:
  Status Failure(int rc, const char* what);
  void Note(const char* data, size_t n);
  // Copies the unread part of the lent bytes into in_.held.
  void KeepUnread();

 public:
  // The ciphertext fed and not yet read by OpenSSL: the held bytes (copies) come first, then
  // the lent ones. The source BIO reads from here.
  struct CipherIn {
    std::string held;
    size_t held_at = 0;  // held[0, held_at) is read
    const char* lent = nullptr;
    size_t lent_len = 0;
    size_t Take(char* dst, size_t cap);
  };

 private:
  std::shared_ptr<TlsContext> context_;
  ssl_st* ssl_ = nullptr;
  bio_st* rbio_ = nullptr;  // ciphertext in (owned by ssl_): reads in_
  bio_st* wbio_ = nullptr;  // ciphertext out (owned by ssl_): appends to out_
  CipherIn in_;
  std::string out_;         // ciphertext produced, not yet taken
  bool server_;
  bool established_ = false;
  int first_byte_ = -1;  // the first byte the peer sent (a TLS record starts with 0x16)
  uint64_t fed_ = 0;
  std::string peer_identity_;
  std::string rejected_cn_;  // the CN of the certificate verification refused, if any
};

// True when `data` starts like a TLS record (a plaintext side's hint that the peer speaks TLS).
bool LooksLikeTls(const char* data, size_t n);

}  // namespace pscore::comm
