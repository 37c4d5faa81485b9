// Small pieces every transport needs: request bookkeeping, a reusable FIFO, the
// little-endian field codec of the wire formats.
// Header-only; depends only on the public headers and transport.hpp.
#pragma once

#include "base/text.hpp"
#include "transport/transport.hpp"

#include <braid/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace braid::transport {

using base::errno_text;

/// Marks a request as posted.
inline void start_request(Request* req) {
  req->state = Request::State::pending;
  req->error.clear();
  req->failed_peer = -1;
  req->peer_closed = false;
}

/// Fails a request with `msg`, blaming rank `blame`.
inline void fail_request(Request* req, const std::string& msg, int blame, bool closed, bool told = false) {
  req->state = Request::State::failed;
  req->error = msg;
  req->failed_peer = blame;
  req->peer_closed = closed;
  req->peer_told = told;
}

/// Throws InvalidUsage for a null request, or a null buffer with bytes to move.
inline void check_post(const char* transport, const char* what, const void* buf, std::size_t bytes,
                       const Request* req, int peer) {
  if (req == nullptr || (buf == nullptr && bytes > 0)) {
    throw Error(ErrorCode::InvalidUsage, std::string(transport) + " " + what + " to/from rank " +
                                             std::to_string(peer) + ": null " +
                                             (req == nullptr ? "request" : "buffer") + " for " +
                                             std::to_string(bytes) + " bytes");
  }
}

/// A FIFO with O(1) push/pop and index access that reuses its storage, so the
/// steady state of posting and completing messages allocates nothing.
template <class T>
class Fifo {
 public:
  bool empty() const noexcept { return count_ == 0; }
  std::size_t size() const noexcept { return count_; }
  T& front() noexcept { return buf_[head_]; }
  T& operator[](std::size_t i) noexcept { return buf_[(head_ + i) & (buf_.size() - 1)]; }
  void push_back(const T& v) {
    if (count_ == buf_.size()) grow();
    buf_[(head_ + count_) & (buf_.size() - 1)] = v;
    ++count_;
  }
  void pop_front() noexcept {
    head_ = (head_ + 1) & (buf_.size() - 1);
    --count_;
  }
  void clear() noexcept { head_ = count_ = 0; }

 private:
  void grow() {
    std::vector<T> next(buf_.empty() ? 8 : buf_.size() * 2);
    for (std::size_t i = 0; i < count_; ++i) next[i] = (*this)[i];
    buf_.swap(next);
    head_ = 0;
  }
  std::vector<T> buf_;
  std::size_t head_ = 0, count_ = 0;
};

/// Little-endian fields of the wire formats.
namespace le {
inline void put(unsigned char* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline std::uint64_t get(const unsigned char* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  return v;
}

// A fixed-size record (a hello, a part header) lists its integer fields once, in wire
// order, as a tuple of references (std::tie); they are packed back to back, each in
// its own width, signed ones as two's complement. Encoder and decoder walk the same
// list, so they cannot disagree on an offset.

/// Bytes of the packed record whose field list has type `Fields`.
template <class Fields>
struct Packed;
template <class... T>
struct Packed<std::tuple<T&...>> {
  static constexpr std::size_t bytes = (sizeof(T) + ... + 0);
};

/// Writes the fields of `fields` from `out` on.
template <class... T>
void put_fields(unsigned char* out, const std::tuple<T&...>& fields) {
  std::apply(
      [out](const auto&... f) {
        std::size_t at = 0;
        ((put(out + at, static_cast<std::make_unsigned_t<std::decay_t<decltype(f)>>>(f), static_cast<int>(sizeof f)),
          at += sizeof f),
         ...);
      },
      fields);
}

/// Reads the fields of `fields` from `in` on.
template <class... T>
void get_fields(const unsigned char* in, const std::tuple<T&...>& fields) {
  std::apply(
      [in](auto&... f) {
        std::size_t at = 0;
        ((f = static_cast<std::decay_t<decltype(f)>>(static_cast<std::make_unsigned_t<std::decay_t<decltype(f)>>>(
              get(in + at, static_cast<int>(sizeof f)))),
          at += sizeof f),
         ...);
      },
      fields);
}
}  // namespace le

/// A failure notice's body (Transport::tell_peers), as ucx's bye and shm's doorbell carry
/// it: the rank the sender blames (i32, -1 for none, little-endian), then its reason.
inline std::vector<unsigned char> encode_notice(int blame, const std::string& reason) {
  std::vector<unsigned char> out(4 + reason.size());
  le::put(out.data(), static_cast<std::uint32_t>(static_cast<std::int32_t>(blame)), 4);
  std::copy(reason.begin(), reason.end(), out.begin() + 4);
  return out;
}

/// Reads a notice body of `n` bytes; false when it is shorter than its rank or its reason
/// is longer than `max_reason`.
inline bool decode_notice(const unsigned char* p, std::size_t n, std::size_t max_reason, int* blame,
                          std::string* reason) {
  if (n < 4 || n - 4 > max_reason) return false;
  *blame = static_cast<std::int32_t>(static_cast<std::uint32_t>(le::get(p, 4)));
  reason->assign(reinterpret_cast<const char*>(p) + 4, n - 4);
  return true;
}

}  // namespace braid::transport
