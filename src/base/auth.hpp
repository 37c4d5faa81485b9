// Proofs of knowing the job's secret, for the store's handshake and every transport's
// hello: HMAC-SHA-256 (OpenSSL's libcrypto, not a hand-written hash) over what the message
// claims and a fresh random nonce, so that the secret itself never travels and a recorded
// message cannot be replayed (docs/reliability.md, "Threat model").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_set>

namespace braid::base::auth {

constexpr std::size_t kNonceBytes = 16;
constexpr std::size_t kMacBytes = 32;
/// A proof: the nonce, then HMAC-SHA-256(key, context || nonce).
constexpr std::size_t kProofBytes = kNonceBytes + kMacBytes;

/// `n` bytes from the system's cryptographic random source; throws Error(System) when it
/// has none.
std::string random_bytes(std::size_t n);

/// HMAC-SHA-256 of `message` under `key` (kMacBytes bytes).
std::string mac(const std::string& key, const std::string& message);

/// Compares two byte strings in time that depends only on their lengths.
bool equal(const unsigned char* a, std::size_t alen, const unsigned char* b, std::size_t blen);
inline bool equal(const std::string& a, const std::string& b) {
  return equal(reinterpret_cast<const unsigned char*>(a.data()), a.size(),
               reinterpret_cast<const unsigned char*>(b.data()), b.size());
}

/// A fresh proof (kProofBytes) that the sender knows `key`, bound to `context`: the bytes
/// of the message it authenticates, which the receiver has too (a hello's fixed part).
std::string prove(const std::string& key, const std::string& context);

/// Whether `proof` (`n` bytes) is a proof of `key` bound to `context`. Constant time in
/// the proof's bytes.
bool verify(const std::string& key, const std::string& context, const unsigned char* proof, std::size_t n);

/// Remembers the nonces of the proofs a listener accepted, so that a recorded hello sent
/// again is refused. Bounded: beyond `capacity` nonces the oldest are forgotten (a replay
/// would then need that many authentic set-ups in between).
class ReplayGuard {
 public:
  explicit ReplayGuard(std::size_t capacity = 65536) : capacity_(capacity) {}
  /// True the first time the nonce of `proof` (at least kNonceBytes) is seen.
  bool first_use(const unsigned char* proof);

 private:
  std::size_t capacity_;
  std::unordered_set<std::string> seen_;
  std::deque<std::string> order_;
};

}  // namespace braid::base::auth
