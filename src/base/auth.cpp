#include "base/auth.hpp"

#include <braid/error.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace braid::base::auth {

std::string random_bytes(std::size_t n) {
  std::string out(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1)
    throw Error(ErrorCode::System, "cannot draw " + std::to_string(n) +
                                       " random bytes (OpenSSL RAND_bytes failed: is the system's random source "
                                       "available?)");
  return out;
}

std::string mac(const std::string& key, const std::string& message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // A zero-length key is valid HMAC; OpenSSL wants a non-null pointer for it.
  static const unsigned char kEmpty = 0;
  const void* k = key.empty() ? static_cast<const void*>(&kEmpty) : static_cast<const void*>(key.data());
  if (HMAC(EVP_sha256(), k, static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), out, &len) == nullptr ||
      len != kMacBytes)
    throw Error(ErrorCode::Internal, "HMAC-SHA-256 failed (OpenSSL)");
  return std::string(reinterpret_cast<const char*>(out), len);
}

bool equal(const unsigned char* a, std::size_t alen, const unsigned char* b, std::size_t blen) {
  if (alen != blen) return false;
  return alen == 0 || CRYPTO_memcmp(a, b, alen) == 0;
}

std::string prove(const std::string& key, const std::string& context) {
  const std::string nonce = random_bytes(kNonceBytes);
  return nonce + mac(key, context + nonce);
}

bool verify(const std::string& key, const std::string& context, const unsigned char* proof, std::size_t n) {
  if (proof == nullptr || n != kProofBytes) return false;
  const std::string nonce(reinterpret_cast<const char*>(proof), kNonceBytes);
  const std::string want = mac(key, context + nonce);
  return equal(proof + kNonceBytes, kMacBytes, reinterpret_cast<const unsigned char*>(want.data()), want.size());
}

bool ReplayGuard::first_use(const unsigned char* proof) {
  std::string nonce(reinterpret_cast<const char*>(proof), kNonceBytes);
  if (!seen_.insert(nonce).second) return false;
  order_.push_back(std::move(nonce));
  if (order_.size() > capacity_) {
    seen_.erase(order_.front());
    order_.pop_front();
  }
  return true;
}

}  // namespace braid::base::auth
