// Cluster-token proofs: HMAC-SHA256 of a per-connection nonce, keyed by the token.
// The token itself never crosses the wire. Pure functions; any thread.
#pragma once

#include <string>
#include <string_view>

namespace pscore::comm {

inline constexpr size_t kNonceBytes = 32;

// A fresh random nonce (OpenSSL RAND_bytes).
std::string MakeNonce();
// HMAC-SHA256(token, nonce), 32 raw bytes.
std::string ProveToken(std::string_view token, std::string_view nonce);
// Constant-time comparison of `proof` with the expected proof.
bool VerifyProof(std::string_view token, std::string_view nonce, std::string_view proof);

}  // namespace pscore::comm
