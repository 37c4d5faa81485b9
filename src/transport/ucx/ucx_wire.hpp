// braid UCX transport — the control messages' wire format (private to the transport,
// its tests and the fuzz targets; no UCX header needed). See ucx_transport.cpp's opening
// comment for the handshake that uses them.
//
// A control message travels on the control tag: a fixed part of little-endian integers
// {magic "BUCX", kind, comm_id, from, to, session, echo, token_bytes, addr_bytes}, then a
// fresh proof of the job's token bound to the fixed part and the address (base/auth.hpp;
// the token itself never travels) and the sender's UCX worker address. Everything in it is untrusted until the
// hello is authenticated; the worker address is handed to UCX only as the bytes it was.
#pragma once

#include "base/auth.hpp"
#include "transport/common.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace braid::transport::ucx_wire {

constexpr std::uint32_t kMagic = 0x58435542;  // "BUCX"

enum Kind : std::uint32_t { kHello = 1, kRefusal = 2, kBye = 3, kByeAck = 4 };

/// A control message: a fixed part, then the token and a worker address.
struct Control {
  std::uint32_t magic = kMagic, kind = 0;
  std::uint64_t comm_id = 0;
  std::int32_t from = -1, to = -1;
  std::uint32_t session = 0, echo = 0, token_bytes = 0, addr_bytes = 0;
  auto fields() { return std::tie(magic, kind, comm_id, from, to, session, echo, token_bytes, addr_bytes); }
};
constexpr std::size_t kControlFixed = le::Packed<decltype(std::declval<Control&>().fields())>::bytes;
static_assert(kControlFixed == 40, "Control layout");

/// A decoded control message; fixed, token (the proof) and addr point into the bytes it
/// was decoded from (addr is null when the message carries no address).
struct ControlView {
  Control h;
  const unsigned char* fixed = nullptr;
  const unsigned char* token = nullptr;
  const unsigned char* addr = nullptr;
};

/// What a control message's proof is bound to: its fixed part, then the address.
inline std::string signed_bytes(const unsigned char* fixed, const unsigned char* addr, std::size_t addr_bytes) {
  std::string s(reinterpret_cast<const char*>(fixed), kControlFixed);
  if (addr != nullptr) s.append(reinterpret_cast<const char*>(addr), addr_bytes);
  return s;
}

/// The control message `h` (its token_bytes and addr_bytes are set here), with a fresh
/// proof of `token` and the address `addr`, ready to send.
inline std::vector<unsigned char> encode_control(Control h, const std::string& token,
                                                 const std::vector<unsigned char>& addr) {
  h.token_bytes = static_cast<std::uint32_t>(base::auth::kProofBytes);
  h.addr_bytes = static_cast<std::uint32_t>(addr.size());
  std::vector<unsigned char> out(kControlFixed + h.token_bytes + addr.size());
  le::put_fields(out.data(), h.fields());
  const std::string proof = base::auth::prove(token, signed_bytes(out.data(), addr.data(), addr.size()));
  std::copy(proof.begin(), proof.end(), out.begin() + kControlFixed);
  std::copy(addr.begin(), addr.end(), out.begin() + static_cast<std::ptrdiff_t>(kControlFixed + proof.size()));
  return out;
}

/// Decodes the `len` bytes of a received control message into `*out`: false when they are
/// not one of this protocol (too short, another magic, or token and address lengths that
/// do not add up to exactly `len`).
inline bool decode_control(const unsigned char* b, std::size_t len, ControlView* out) {
  if (len < kControlFixed) return false;
  Control h;
  le::get_fields(b, h.fields());
  if (h.magic != kMagic || kControlFixed + std::size_t{h.token_bytes} + h.addr_bytes != len) return false;
  out->h = h;
  out->fixed = b;
  out->token = b + kControlFixed;
  out->addr = h.addr_bytes > 0 ? b + kControlFixed + h.token_bytes : nullptr;
  return true;
}

/// A failure notice rides in a bye's payload (where a hello carries its address): the
/// common body (transport/common.hpp).
using transport::decode_notice;
using transport::encode_notice;

/// An authentic message for rank `rank` of a world of `size` in communicator `comm_id`
/// whose token is `token`: this communicator, addressed to `rank`, from another rank of
/// the world, which is also the rank UCX's tag names as its sender (`tag_rank`), with a
/// valid proof of the token bound to its fields and address (checked in constant time;
/// replays are the receiver's to refuse).
inline bool control_authentic(const ControlView& v, std::uint64_t comm_id, int rank, int size,
                              const std::string& token, std::int64_t tag_rank) {
  const Control& h = v.h;
  const bool proven =
      v.fixed != nullptr &&
      base::auth::verify(token, signed_bytes(v.fixed, v.addr, v.addr != nullptr ? h.addr_bytes : 0), v.token,
                         h.token_bytes);
  return proven && h.comm_id == comm_id && h.to == rank && h.from >= 0 && h.from < size && h.from != rank &&
         h.from == tag_rank;
}

}  // namespace braid::transport::ucx_wire
