#include "pscore/comm/tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <ctime>

#include <glog/logging.h>

namespace pscore::comm {
namespace {

// The reason of the oldest error OpenSSL queued on this thread (then clears the queue).
std::string TakeSslError() {
  unsigned long first = ERR_get_error();
  ERR_clear_error();
  if (first == 0) return "no OpenSSL error recorded";
  const char* reason = ERR_reason_error_string(first);
  if (reason != nullptr) return reason;
  char buf[256];
  ERR_error_string_n(first, buf, sizeof(buf));
  return buf;
}

// The subject CN of `cert`, or "" when it has none (or an unreadable one).
std::string CommonName(X509* cert) {
  if (cert == nullptr) return "";
  X509_NAME* name = X509_get_subject_name(cert);
  int at = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
  if (at < 0) return "";
  ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, at));
  unsigned char* utf8 = nullptr;
  int len = ASN1_STRING_to_UTF8(&utf8, data);
  if (len < 0) return "";
  std::string cn(reinterpret_cast<char*>(utf8), static_cast<size_t>(len));
  OPENSSL_free(utf8);
  if (cn.find('\0') != std::string::npos) return "";  // an embedded NUL names nobody
  return cn;
}

// Verification as OpenSSL does it, noting the CN of a certificate it refuses: OpenSSL
// keeps no peer certificate after a failed verification, and the log line should name it.
int OnVerify(int preverify_ok, X509_STORE_CTX* store) {
  if (preverify_ok == 1) return 1;
  auto* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* rejected = ssl != nullptr ? static_cast<std::string*>(SSL_get_app_data(ssl)) : nullptr;
  if (rejected != nullptr && rejected->empty()) *rejected = CommonName(X509_STORE_CTX_get0_cert(store));
  return 0;
}

// The write side's BIO: every ciphertext byte OpenSSL writes is appended to the session's
// output string, which the owner then takes whole (TakeCipher swaps it out): no buffer
// in between, so a record is copied once, from OpenSSL's record buffer to the string.
int SinkWrite(BIO* bio, const char* data, int n) {
  static_cast<std::string*>(BIO_get_data(bio))->append(data, static_cast<size_t>(n));
  return n;
}

long SinkCtrl(BIO* /*bio*/, int cmd, long /*num*/, void* /*ptr*/) {
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;  // nothing is ever held back
}

int SinkCreate(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

const BIO_METHOD* SinkMethod() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "pscore ciphertext sink");
    CHECK(m != nullptr) << "BIO_meth_new failed";
    BIO_meth_set_write(m, &SinkWrite);
    BIO_meth_set_ctrl(m, &SinkCtrl);
    BIO_meth_set_create(m, &SinkCreate);
    return m;
  }();
  return method;
}

// The read side's BIO: OpenSSL takes ciphertext straight from the bytes the connection
// read (TlsSession::Lend) or holds (Feed); an empty source says "retry": more may come.
int SourceRead(BIO* bio, char* dst, int cap) {
  BIO_clear_retry_flags(bio);
  if (cap <= 0) return 0;
  const size_t got = static_cast<TlsSession::CipherIn*>(BIO_get_data(bio))->Take(dst, static_cast<size_t>(cap));
  if (got == 0) {
    BIO_set_retry_read(bio);
    return -1;
  }
  return static_cast<int>(got);
}

long SourceCtrl(BIO* bio, int cmd, long /*num*/, void* /*ptr*/) {
  if (cmd == BIO_CTRL_FLUSH) return 1;
  if (cmd == BIO_CTRL_PENDING) {
    const auto* in = static_cast<const TlsSession::CipherIn*>(BIO_get_data(bio));
    const size_t n = in->held.size() - in->held_at + in->lent_len;
    return static_cast<long>(std::min<size_t>(n, LONG_MAX));
  }
  return 0;
}

const BIO_METHOD* SourceMethod() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "pscore ciphertext source");
    CHECK(m != nullptr) << "BIO_meth_new failed";
    BIO_meth_set_read(m, &SourceRead);
    BIO_meth_set_ctrl(m, &SourceCtrl);
    BIO_meth_set_create(m, &SinkCreate);
    return m;
  }();
  return method;
}

}  // namespace

size_t TlsSession::CipherIn::Take(char* dst, size_t cap) {
  size_t got = 0;
  if (held_at < held.size()) {
    got = std::min(cap, held.size() - held_at);
    std::memcpy(dst, held.data() + held_at, got);
    held_at += got;
    if (held_at == held.size()) {
      held.clear();
      held_at = 0;
    }
  }
  if (got < cap && lent_len > 0) {
    const size_t more = std::min(cap - got, lent_len);
    std::memcpy(dst + got, lent, more);
    lent += more;
    lent_len -= more;
    got += more;
  }
  return got;
}

bool LooksLikeTls(const char* data, size_t n) {
  // A record: content type handshake (0x16) or alert (0x15), then major version 3.
  return n >= 2 && (data[0] == 0x16 || data[0] == 0x15) && data[1] == 0x03;
}

struct TlsContext::Loaded {
  SSL_CTX* ctx = nullptr;
  std::string identity;
  int64_t not_after_unix = 0;
};

Result<TlsContext::Loaded> TlsContext::Read(const TlsFiles& files) {
  if (files.cert.empty() || files.key.empty() || files.ca.empty()) {
    return Status(Code::kInvalidArgument, "TLS needs all of --tls_cert, --tls_key and --tls_ca");
  }
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) return Status(Code::kInternal, "SSL_CTX_new: " + TakeSslError());
  auto fail = [ctx](Status st) {
    SSL_CTX_free(ctx);
    return st;
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
  // AES-128-GCM first (the fastest with AES-NI), then OpenSSL's other TLS 1.3 suites.
  SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
  // No resumption: every connection proves its certificate afresh (and no tickets cross
  // the wire after the handshake).
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert.c_str()) != 1) {
    return fail(Status(Code::kInvalidArgument, "TLS certificate " + files.cert + ": " + TakeSslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    const std::string why = TakeSslError();
    if (why.find("mismatch") != std::string::npos) {
      return fail(Status(Code::kInvalidArgument, "TLS key " + files.key + " does not match certificate " + files.cert));
    }
    return fail(Status(Code::kInvalidArgument, "TLS key " + files.key + ": " + why));
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return fail(Status(Code::kInvalidArgument, "TLS key " + files.key + " does not match certificate " + files.cert));
  }
  if (SSL_CTX_load_verify_locations(ctx, files.ca.c_str(), nullptr) != 1) {
    return fail(Status(Code::kInvalidArgument, "TLS CA " + files.ca + ": " + TakeSslError()));
  }
  // The CA list a server sends in its certificate request: the cluster CA.
  STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.ca.c_str());
  if (names != nullptr) SSL_CTX_set_client_CA_list(ctx, names);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, &OnVerify);
  Loaded out;
  X509* own = SSL_CTX_get0_certificate(ctx);
  out.identity = CommonName(own);
  struct tm tm {};
  if (own != nullptr && ASN1_TIME_to_tm(X509_get0_notAfter(own), &tm) == 1) out.not_after_unix = timegm(&tm);
  if (out.identity.empty()) {
    return fail(Status(Code::kInvalidArgument, "TLS certificate " + files.cert + " has no subject CN (the identity)"));
  }
  const int64_t left = out.not_after_unix - static_cast<int64_t>(std::time(nullptr));
  if (left < 0) {
    LOG(ERROR) << "TLS certificate " << files.cert << " (CN=" << out.identity << ") expired " << -left
               << " s ago: peers will refuse it";
  } else if (left < 7 * 24 * 3600) {
    LOG(WARNING) << "TLS certificate " << files.cert << " (CN=" << out.identity << ") expires in " << left << " s";
  }
  out.ctx = ctx;
  return out;
}

Result<std::shared_ptr<TlsContext>> TlsContext::Load(const TlsFiles& files) {
  Result<Loaded> loaded = Read(files);
  if (!loaded.ok()) return loaded.status();
  std::shared_ptr<TlsContext> c(new TlsContext());
  c->files_ = files;
  c->ctx_ = loaded->ctx;
  c->identity_ = loaded->identity;
  c->not_after_unix_ = loaded->not_after_unix;
  return c;
}

Status TlsContext::Reload() {
  Result<Loaded> loaded = Read(files_);
  if (!loaded.ok()) return loaded.status();
  SSL_CTX* old = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = ctx_;
    ctx_ = loaded->ctx;
    identity_ = loaded->identity;
    not_after_unix_ = loaded->not_after_unix;
  }
  SSL_CTX_free(old);  // sessions made from it hold their own references
  LOG(INFO) << "TLS certificate " << files_.cert << " (CN=" << loaded->identity << ") loaded again; it expires in "
            << SecondsToExpiry() << " s";
  return Status::Ok();
}

TlsContext::~TlsContext() {
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
}

SSL_CTX* TlsContext::AcquireCtx() const {
  std::lock_guard<std::mutex> lock(mu_);
  SSL_CTX_up_ref(ctx_);
  return ctx_;
}

std::string TlsContext::identity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return identity_;
}

int64_t TlsContext::SecondsToExpiry() const {
  std::lock_guard<std::mutex> lock(mu_);
  return not_after_unix_ - static_cast<int64_t>(std::time(nullptr));
}

TlsSession::TlsSession(std::shared_ptr<TlsContext> context, bool server)
    : context_(std::move(context)), server_(server) {
  SSL_CTX* ctx = context_->AcquireCtx();
  ssl_ = SSL_new(ctx);  // takes its own reference
  SSL_CTX_free(ctx);
  CHECK(ssl_ != nullptr) << "SSL_new: " << TakeSslError();
  rbio_ = BIO_new(SourceMethod());
  wbio_ = BIO_new(SinkMethod());
  CHECK(rbio_ != nullptr && wbio_ != nullptr) << "BIO_new failed";
  BIO_set_data(rbio_, &in_);
  BIO_set_data(wbio_, &out_);
  SSL_set_bio(ssl_, rbio_, wbio_);  // ssl_ owns both now
  SSL_set_app_data(ssl_, &rejected_cn_);  // OnVerify notes a refused certificate's CN
  if (server_) {
    SSL_set_accept_state(ssl_);
  } else {
    SSL_set_connect_state(ssl_);
  }
}

TlsSession::~TlsSession() { SSL_free(ssl_); }

void TlsSession::Note(const char* data, size_t n) {
  if (fed_ == 0) first_byte_ = static_cast<unsigned char>(data[0]);
  fed_ += n;
}

void TlsSession::Feed(const char* data, size_t n) {
  if (n == 0) return;
  Note(data, n);
  KeepUnread();  // lent bytes still unread come first
  if (in_.held_at > 0 && in_.held_at >= in_.held.size() / 2) {
    in_.held.erase(0, in_.held_at);
    in_.held_at = 0;
  }
  in_.held.append(data, n);
}

TlsSession::Lent TlsSession::Lend(const char* data, size_t n) {
  KeepUnread();
  if (n > 0) {
    Note(data, n);
    in_.lent = data;
    in_.lent_len = n;
  }
  return Lent(this);
}

void TlsSession::KeepUnread() {
  if (in_.lent_len > 0) {
    if (in_.held_at > 0) {
      in_.held.erase(0, in_.held_at);
      in_.held_at = 0;
    }
    in_.held.append(in_.lent, in_.lent_len);
  }
  in_.lent = nullptr;
  in_.lent_len = 0;
}

Status TlsSession::Failure(int rc, const char* what) {
  const int err = SSL_get_error(ssl_, rc);
  if (fed_ > 0 && first_byte_ != 0x16 && first_byte_ != 0x15) {
    ERR_clear_error();
    return Status(Code::kPermissionDenied, std::string(what) +
                                               ": the peer is not speaking TLS (plaintext on a TLS link; give both sides "
                                               "--tls_cert, --tls_key and --tls_ca)");
  }
  const long verify = SSL_get_verify_result(ssl_);
  if (verify != X509_V_OK) {
    X509* peer = SSL_get0_peer_certificate(ssl_);
    const std::string cn = peer != nullptr ? CommonName(peer) : rejected_cn_;
    std::string who = cn.empty() ? "" : " (CN=" + cn + ")";
    ERR_clear_error();
    return Status(Code::kPermissionDenied, std::string(what) + ": peer certificate" + who +
                                               " rejected: " + X509_verify_cert_error_string(verify));
  }
  if (err == SSL_ERROR_ZERO_RETURN) {
    return Status(Code::kUnavailable, "peer closed the TLS session");
  }
  std::string reason = TakeSslError();
  if (reason.find("alert") != std::string::npos) {
    return Status(Code::kPermissionDenied,
                  std::string(what) + ": the peer refused us with a TLS alert: " + reason +
                      " (our certificate is expired, not yet valid, or not signed by its CA?)");
  }
  if (reason.find("peer did not return a certificate") != std::string::npos) {
    return Status(Code::kPermissionDenied, std::string(what) + ": the peer presented no certificate");
  }
  return Status(Code::kPermissionDenied, std::string(what) + ": " + reason);
}

Status TlsSession::Handshake() {
  if (established_) return Status::Ok();
  ERR_clear_error();
  const int rc = SSL_do_handshake(ssl_);
  if (rc == 1) {
    established_ = true;
    X509* peer = SSL_get0_peer_certificate(ssl_);
    peer_identity_ = CommonName(peer);
    if (peer_identity_.empty()) {
      return Status(Code::kPermissionDenied, "TLS handshake: the peer certificate has no subject CN");
    }
    return Status::Ok();
  }
  const int err = SSL_get_error(ssl_, rc);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return Status::Ok();
  return Failure(rc, "TLS handshake failed");
}

Result<size_t> TlsSession::Read(char* dst, size_t cap) {
  ERR_clear_error();
  const int rc = SSL_read(ssl_, dst, static_cast<int>(std::min<size_t>(cap, INT_MAX)));
  if (rc > 0) return static_cast<size_t>(rc);
  const int err = SSL_get_error(ssl_, rc);
  if (err == SSL_ERROR_WANT_READ) return size_t{0};
  return Failure(rc, "TLS");
}

Status TlsSession::Write(const char* data, size_t n) {
  DCHECK(established_);
  while (n > 0) {
    ERR_clear_error();
    const int take = static_cast<int>(std::min<size_t>(n, 1u << 30));
    // The sink BIO never pushes back, so a write is taken whole.
    const int rc = SSL_write(ssl_, data, take);
    if (rc != take) return Failure(rc, "TLS write");
    data += take;
    n -= static_cast<size_t>(take);
  }
  return Status::Ok();
}

size_t TlsSession::pending_cipher() const { return out_.size(); }

void TlsSession::Reserve(size_t plaintext) {
  // A TLS 1.3 record adds 22 bytes to at most 16 KiB of plaintext.
  out_.reserve(out_.size() + plaintext + (plaintext >> 8) + 256);
}

void TlsSession::TakeCipher(std::string* out) {
  if (out->empty()) {
    out->swap(out_);  // the caller's (empty) string comes back as the next output buffer
  } else {
    out->append(out_);
  }
  out_.clear();
}

}  // namespace pscore::comm
