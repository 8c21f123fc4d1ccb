#include "pscore/comm/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <glog/logging.h>

namespace pscore::comm {

std::string MakeNonce() {
  std::string nonce(kNonceBytes, '\0');
  CHECK_EQ(RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), kNonceBytes), 1)
      << "OpenSSL RAND_bytes failed";
  return nonce;
}

std::string ProveToken(std::string_view token, std::string_view nonce) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(nonce.data()), nonce.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

bool VerifyProof(std::string_view token, std::string_view nonce, std::string_view proof) {
  std::string expected = ProveToken(token, nonce);
  return proof.size() == expected.size() && CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) == 0;
}

}  // namespace pscore::comm
