// A throwaway certificate authority for TLS tests: a CA and leaf certificates made with
// the OpenSSL API into a temporary directory (removed with the object). Leaves may be
// made expired or not yet valid. Test-only; one thread at a time.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "pscore/comm/tls.h"

namespace pscore::comm::testing {

class TestPki {
 public:
  // A CA named `ca_name`, its files under a new temporary directory.
  explicit TestPki(const std::string& ca_name = "pscore-test-ca") {
    char tmpl[] = "/tmp/pscore_tls_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    ca_key_ = NewKey();
    ca_ = MakeCert(ca_name, ca_key_, nullptr, nullptr, -3600, 30L * 86400, /*ca=*/true);
    ca_file_ = dir_ + "/ca.crt";
    WriteCert(ca_file_, ca_);
  }
  ~TestPki() {
    X509_free(ca_);
    EVP_PKEY_free(ca_key_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TestPki(const TestPki&) = delete;
  TestPki& operator=(const TestPki&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& ca_file() const { return ca_file_; }

  // A certificate with subject CN=`cn` signed by this CA, valid from now+not_before_s to
  // now+not_after_s (seconds; negative is the past), written as `file`.crt/.key.
  // Returned with this CA as the trust anchor.
  TlsFiles Issue(const std::string& file, const std::string& cn, long not_before_s = -3600,
                 long not_after_s = 30L * 86400) {
    EVP_PKEY* key = NewKey();
    X509* cert = MakeCert(cn, key, ca_, ca_key_, not_before_s, not_after_s, /*ca=*/false);
    TlsFiles f;
    f.cert = dir_ + "/" + file + ".crt";
    f.key = dir_ + "/" + file + ".key";
    f.ca = ca_file_;
    WriteCert(f.cert, cert);
    FILE* out = std::fopen(f.key.c_str(), "w");
    if (out == nullptr || PEM_write_PrivateKey(out, key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
      throw std::runtime_error("cannot write " + f.key);
    }
    std::fclose(out);
    X509_free(cert);
    EVP_PKEY_free(key);
    return f;
  }

  std::shared_ptr<TlsContext> Context(const std::string& file, const std::string& cn) {
    Result<std::shared_ptr<TlsContext>> c = TlsContext::Load(Issue(file, cn));
    if (!c.ok()) throw std::runtime_error(c.status().ToString());
    return *c;
  }

 private:
  static EVP_PKEY* NewKey() {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    if (key == nullptr) throw std::runtime_error("EVP_EC_gen failed");
    return key;
  }

  static void AddExt(X509* cert, X509* issuer, int nid, const char* value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer != nullptr ? issuer : cert, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (ext == nullptr) throw std::runtime_error("bad extension");
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  }

  X509* MakeCert(const std::string& cn, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key, long not_before_s,
                 long not_after_s, bool ca) {
    X509* cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), ++serial_);
    X509_gmtime_adj(X509_getm_notBefore(cert), not_before_s);
    X509_gmtime_adj(X509_getm_notAfter(cert), not_after_s);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                               0);
    X509_set_issuer_name(cert, issuer != nullptr ? X509_get_subject_name(issuer) : name);
    AddExt(cert, issuer, NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
    if (ca) AddExt(cert, issuer, NID_key_usage, "critical,keyCertSign,cRLSign");
    if (!ca) AddExt(cert, issuer, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1");
    if (X509_sign(cert, issuer_key != nullptr ? issuer_key : key, EVP_sha256()) == 0) {
      throw std::runtime_error("X509_sign failed");
    }
    return cert;
  }

  static void WriteCert(const std::string& path, X509* cert) {
    FILE* out = std::fopen(path.c_str(), "w");
    if (out == nullptr || PEM_write_X509(out, cert) != 1) throw std::runtime_error("cannot write " + path);
    std::fclose(out);
  }

  std::string dir_;
  std::string ca_file_;
  EVP_PKEY* ca_key_ = nullptr;
  X509* ca_ = nullptr;
  long serial_ = 0;
};

}  // namespace pscore::comm::testing
