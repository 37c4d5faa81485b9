// The TcpStore protocol's byte format (tcp_store.cpp's opening comment describes it), as
// pure functions: the server's request decoder, the framing both sides use, and the
// client's reply decoders. Everything decoded here came from another process and is
// untrusted: every length is checked against what is left and against the limits below
// before anything is allocated for it. Private to core, its tests and the fuzz targets.
#pragma once

#include "base/auth.hpp"
#include "core/store_limits.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace braid::core::store_wire {

constexpr std::uint32_t kMagic = 0x53445242;  // bytes "BRDS"
constexpr std::uint16_t kVersion = 3;
constexpr std::size_t kHelloSize = 8;
/// Longest token a store may be given (it never travels: only proofs of it do).
constexpr std::size_t kMaxToken = 4096;
constexpr std::size_t kMaxKey = kMaxStoreKey;
constexpr std::size_t kMaxValue = kMaxStoreValue;
constexpr std::size_t kMaxKeysPerRequest = 65536;
constexpr std::size_t kMaxFrame = kMaxValue + kMaxKey + 64;
/// Smallest reply body: status and request id.
constexpr std::size_t kReplyHead = 5;

enum Op : std::uint8_t { kSet = 1, kGet, kAdd, kCheck, kWait, kRemove, kCompareSet };
enum Status : std::uint8_t { kOk = 0, kTimeout = 1, kFailed = 2 };

inline std::uint64_t load_le(const char* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

/// Builds one frame: u32 length placeholder, then the body.
class Encoder {
 public:
  Encoder() : buf_(4, '\0') {}
  void u8(std::uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void u16(std::uint16_t v) { put(v, 2); }
  void u32(std::uint32_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void str(const std::string& s) {
    u32(static_cast<std::uint32_t>(s.size()));
    buf_.append(s);
  }
  void patch_u32(std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }
  std::size_t size() const { return buf_.size(); }
  std::string finish() {
    patch_u32(0, static_cast<std::uint32_t>(buf_.size() - 4));
    return std::move(buf_);
  }

 private:
  void put(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string buf_;
};

/// Reads fields from an untrusted buffer; any underflow or oversize marks it bad.
class Decoder {
 public:
  Decoder(const char* p, std::size_t n) : p_(p), n_(n) {}
  bool ok() const { return ok_; }
  bool at_end() const { return ok_ && n_ == 0; }
  std::uint8_t u8() { return static_cast<std::uint8_t>(take(1)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(take(4)); }
  std::uint64_t u64() { return take(8); }
  std::string str(std::size_t max) {
    std::uint32_t len = u32();
    if (!ok_ || len > max || len > n_) {
      ok_ = false;
      return {};
    }
    std::string s(p_, len);
    p_ += len;
    n_ -= len;
    return s;
  }
  std::vector<std::string> keys() {
    std::uint32_t n = u32();
    std::vector<std::string> out;
    // Each key needs at least 4 bytes, so n is bounded by what is left.
    if (!ok_ || n > kMaxKeysPerRequest || n > n_ / 4) {
      ok_ = false;
      return out;
    }
    out.reserve(n);
    for (std::uint32_t i = 0; i < n && ok_; ++i) out.push_back(str(kMaxKey));
    return out;
  }

 private:
  std::uint64_t take(int n) {
    if (!ok_ || n_ < static_cast<std::size_t>(n)) {
      ok_ = false;
      return 0;
    }
    std::uint64_t v = load_le(p_, n);
    p_ += n;
    n_ -= static_cast<std::size_t>(n);
    return v;
  }
  const char* p_;
  std::size_t n_;
  bool ok_ = true;
};

/// The u16 after magic and version in the client's hello.
enum HelloFlags : std::uint16_t { kHasToken = 1 };
/// The server's answer to a hello (the u16 after magic and version). kTlsRequired is the
/// one answer sent in plaintext by a server that uses TLS, to a client whose first bytes
/// were a plaintext hello, so that the client can say why before the server closes.
enum HelloAnswer : std::uint16_t { kAccepted = 0, kRefused = 1, kChallenge = 2, kTlsRequired = 3 };

/// The client's hello: the 8-byte head with its HelloFlags, then its nonce.
constexpr std::size_t kClientHelloSize = kHelloSize + base::auth::kNonceBytes;
/// The server's challenge: the 8-byte head with kChallenge, its nonce, its proof.
constexpr std::size_t kChallengeSize = kHelloSize + base::auth::kNonceBytes + base::auth::kMacBytes;
/// The client's answer to a challenge: its proof.
constexpr std::size_t kClientProofSize = base::auth::kMacBytes;

/// 8 bytes: magic, version, then `last` (the client's HelloFlags, or the server's
/// HelloAnswer).
inline std::string hello_head(std::uint16_t last) {
  std::string h(kHelloSize, '\0');
  for (int i = 0; i < 4; ++i) h[i] = static_cast<char>((kMagic >> (8 * i)) & 0xff);
  h[4] = static_cast<char>(kVersion & 0xff);
  h[5] = static_cast<char>(kVersion >> 8);
  h[6] = static_cast<char>(last & 0xff);
  h[7] = static_cast<char>(last >> 8);
  return h;
}

/// The client's hello: whether it has a token, and its fresh nonce (kNonceBytes).
inline std::string hello_bytes(bool has_token, const std::string& nonce) {
  return hello_head(has_token ? kHasToken : 0) + nonce;
}

/// The server's answer: the 8-byte head with a HelloAnswer.
inline std::string answer_bytes(HelloAnswer a) { return hello_head(a); }

/// The proofs of the handshake: each side's HMAC of both nonces under the token, with
/// the side's role in it, so that neither can be passed off as the other's.
inline std::string server_proof(const std::string& token, const std::string& client_nonce,
                                const std::string& server_nonce) {
  return base::auth::mac(token, "braid store server\n" + client_nonce + server_nonce);
}
inline std::string client_proof(const std::string& token, const std::string& client_nonce,
                                const std::string& server_nonce) {
  return base::auth::mac(token, "braid store client\n" + client_nonce + server_nonce);
}

enum class Hello {
  more,         ///< not all there yet
  not_a_store,  ///< wrong magic
  version,      ///< another protocol version (in *version)
  bad_flags,    ///< flags this version does not define
  ok            ///< *has_token, *nonce and *used are set
};

/// Parses a client's hello at the start of `p` (`avail` bytes). Untrusted input.
Hello parse_hello(const char* p, std::size_t avail, bool* has_token, std::string* nonce, std::size_t* used,
                  unsigned* version);

enum class Frame {
  more,      ///< the frame is not all there yet
  bad,       ///< its length is out of range: close the connection
  complete,  ///< the body is there
};

/// The frame at `p` (`avail` bytes received from there): a u32 body length in
/// [min_body, kMaxFrame], then the body. Sets `*body` once the length is known. A bad
/// length is reported as soon as its 4 bytes are in, so nothing is buffered for it.
inline Frame frame_at(const char* p, std::size_t avail, std::size_t min_body, std::uint64_t* body) {
  if (avail < 4) return Frame::more;
  *body = load_le(p, 4);
  if (*body < min_body || *body > kMaxFrame) return Frame::bad;
  return avail - 4 < *body ? Frame::more : Frame::complete;
}

/// A request as the server reads it; the fields its op does not carry stay empty.
struct Request {
  std::uint8_t op = 0;
  std::uint32_t id = 0;
  std::string key;
  std::string value;     ///< set's value; compare_set's desired one
  std::string expected;  ///< compare_set's expected value
  std::vector<std::string> keys;
  std::uint64_t timeout_ms = 0;
  std::int64_t delta = 0;
};

/// Decodes a request body of `n` bytes; false when it is malformed (an unknown op, a
/// field that does not fit, oversized keys or values, bytes left over).
bool decode_request(const char* p, std::size_t n, Request* out);

/// A reply as the client reads it: status and the payload after the request id.
struct Reply {
  bool done = false;
  std::uint8_t status = 0;
  std::string payload;
};

/// Takes the complete reply frames at the start of `in`, appending (request id, reply) to
/// `*got`; returns the bytes they used. A frame length out of range sets `*err` (the
/// connection is then unusable) and stops.
std::size_t take_replies(const std::string& in, std::vector<std::pair<std::uint32_t, Reply>>* got,
                         std::string* err);

// The payloads of successful replies, per request; each is false when the payload is not
// exactly what the request's reply carries.
/// GET: the value.
bool reply_value(const std::string& payload, std::string* value);
/// ADD: the new value.
bool reply_int(const std::string& payload, std::int64_t* value);
/// CHECK and REMOVE: one byte, true when non-zero.
bool reply_flag(const std::string& payload, bool* flag);
/// WAIT that timed out: the keys still missing.
bool reply_missing(const std::string& payload, std::vector<std::string>* keys);
/// ERROR: the server's message (empty when there is none that can be read).
std::string reply_error(const std::string& payload);

}  // namespace braid::core::store_wire
