// braid TCP transport — wire format (private to the transport and its tests).
//
// All integers are little-endian. A socket starts with one Hello from the
// connecting (lower) rank; after it, both directions carry message parts, each a
// PartHeader followed by part_bytes of payload. See docs/transport-tcp.md.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdlib>

#include "transport/common.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

namespace braid::transport::tcp_wire {

constexpr std::uint32_t kHelloMagic = 0x48445242u;  // "BRDH"
constexpr std::uint32_t kPartMagic = 0x4d445242u;   // "BRDM"
/// A failure notice (Transport::tell_peers): a part header with this magic, `tag` the rank
/// the sender blames (as a signed 64-bit value, -1 for none), `msg_bytes` = `part_bytes` =
/// the length of its reason (at most kMaxNoticeBytes), then the reason; the sender closes.
constexpr std::uint32_t kNoticeMagic = 0x4e445242u;  // "BRDN"
constexpr std::uint16_t kVersion = 1;

/// Largest auth token a hello may carry; longer ones are refused unread.
constexpr std::size_t kMaxTokenBytes = 4096;
/// Messages are striped in units of this many bytes (at most one part per unit).
constexpr std::size_t kStripeUnit = 64 * 1024;

/// First bytes on every socket, sent by the connecting rank, followed by the token.
struct Hello {
  std::uint32_t magic = kHelloMagic;
  std::uint16_t version = kVersion;
  std::uint16_t socket_index = 0;
  std::uint16_t sockets_per_peer = 1;
  std::uint16_t token_bytes = 0;
  std::int32_t from_rank = 0;
  std::int32_t to_rank = 0;
  std::uint64_t comm_id = 0;
};
constexpr std::size_t kHelloBytes = 28;

/// Precedes every message part.
struct PartHeader {
  std::uint32_t magic = kPartMagic;
  std::uint16_t version = kVersion;
  std::uint16_t part_index = 0;
  std::uint64_t seq = 0;         ///< per-connection, per-direction message counter from 0
  std::uint64_t tag = 0;
  std::uint64_t msg_bytes = 0;   ///< size of the whole message
  std::uint64_t part_bytes = 0;  ///< payload bytes following this header
};
constexpr std::size_t kPartHeaderBytes = 40;

/// Hello's fields in wire order (transport/common.hpp, le::put_fields).
template <class H>
auto hello_fields(H& h) {
  return std::tie(h.magic, h.version, h.socket_index, h.sockets_per_peer, h.token_bytes, h.from_rank, h.to_rank,
                  h.comm_id);
}
static_assert(le::Packed<decltype(hello_fields(std::declval<Hello&>()))>::bytes == kHelloBytes, "Hello layout");

/// PartHeader's fields in wire order.
template <class H>
auto part_fields(H& h) {
  return std::tie(h.magic, h.version, h.part_index, h.seq, h.tag, h.msg_bytes, h.part_bytes);
}
static_assert(le::Packed<decltype(part_fields(std::declval<PartHeader&>()))>::bytes == kPartHeaderBytes,
              "PartHeader layout");

inline void encode(const Hello& h, unsigned char* out) { le::put_fields(out, hello_fields(h)); }

inline Hello decode_hello(const unsigned char* in) {
  Hello h;
  le::get_fields(in, hello_fields(h));
  return h;
}

/// The length of the token after a hello's fixed part `fixed` (kHelloBytes), or -1 when
/// it is not a hello of this version or announces a token longer than kMaxTokenBytes
/// (the skeleton's HelloFormat::tail_bytes; the magic is checked before).
inline long hello_tail(const unsigned char* fixed) {
  const Hello h = decode_hello(fixed);
  if (h.version != kVersion || h.token_bytes > kMaxTokenBytes) return -1;
  return h.token_bytes;
}

/// Hello followed by the token, ready to write.
inline std::string hello_bytes(const Hello& h, const std::string& token) {
  std::string out(kHelloBytes + token.size(), '\0');
  encode(h, reinterpret_cast<unsigned char*>(&out[0]));
  out.replace(kHelloBytes, token.size(), token);
  return out;
}

inline void encode(const PartHeader& h, unsigned char* out) { le::put_fields(out, part_fields(h)); }

inline PartHeader decode_part(const unsigned char* in) {
  PartHeader h;
  le::get_fields(in, part_fields(h));
  return h;
}

/// A part header of this protocol and version (any other is a corrupt stream).
inline bool part_header_valid(const PartHeader& h) { return h.magic == kPartMagic && h.version == kVersion; }

/// A failure notice's header, well formed (its reason follows).
inline bool notice_header_valid(const PartHeader& h, std::size_t max_reason) {
  return h.magic == kNoticeMagic && h.version == kVersion && h.part_bytes == h.msg_bytes && h.part_bytes <= max_reason;
}

/// How a part header compares with the part the receiver expects next on its socket.
enum class PartMatch {
  ok,
  wrong_part,     ///< another message number or part index: the streams are out of step
  wrong_message,  ///< another tag or message size than the posted receive
  wrong_length,   ///< the part's payload length is not the one both sides derive
};

/// Compares `h` with the expected part `index` (payload `part_bytes`) of message `seq`,
/// posted with `tag` and `msg_bytes`. Only `ok` lets the receiver read the payload, so its
/// length always comes from the receiver's own split, never from the wire.
inline PartMatch match_part(const PartHeader& h, std::uint64_t seq, int index, std::uint64_t tag,
                            std::uint64_t msg_bytes, std::size_t part_bytes) {
  if (h.seq != seq || h.part_index != index) return PartMatch::wrong_part;
  if (h.tag != tag || h.msg_bytes != msg_bytes) return PartMatch::wrong_message;
  if (h.part_bytes != part_bytes) return PartMatch::wrong_length;
  return PartMatch::ok;
}

/// Number of parts a message of `bytes` is cut into over `sockets` sockets:
/// min(sockets, max(1, bytes / kStripeUnit)). Both sides compute it.
inline int part_count(std::size_t bytes, int sockets) {
  std::size_t units = bytes / kStripeUnit;
  if (units < 1) units = 1;
  return units < static_cast<std::size_t>(sockets) ? static_cast<int>(units) : sockets;
}

/// Offset and length of part `index` of `parts` equal contiguous parts (the first
/// bytes % parts parts are one byte longer).
inline void part_range(std::size_t bytes, int parts, int index, std::size_t* offset,
                       std::size_t* length) {
  const std::size_t n = static_cast<std::size_t>(parts), i = static_cast<std::size_t>(index);
  const std::size_t base = bytes / n, extra = bytes % n;
  *offset = i * base + (i < extra ? i : extra);
  *length = base + (i < extra ? 1 : 0);
}

/// Socket that carries part `index` of message `seq`: rotating the start spreads
/// small messages over all sockets while keeping each socket FIFO.
inline int part_socket(std::uint64_t seq, int index, int sockets) {
  return static_cast<int>((seq + static_cast<std::uint64_t>(index)) % static_cast<std::uint64_t>(sockets));
}

/// What the acceptor's answer to a hello proves (base::auth::prove): the connector's whole
/// hello (fixed part and proof), so that an answer cannot be replayed to another hello.
inline std::string answer_context(const std::string& hello) { return "braid tcp answer\n" + hello; }

/// A peer's published address ("a.b.c.d:port", from the store: untrusted); false unless it
/// is exactly that, with a port in 1..65535.
inline bool parse_addr(const std::string& text, sockaddr_in* out) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= text.size() || text.size() > 64) {
    return false;
  }
  const std::string ip = text.substr(0, colon), port = text.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return false;
  const long p = std::strtol(port.c_str(), nullptr, 10);
  if (p <= 0 || p > 65535) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(p));
  if (::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) return false;
  *out = a;
  return true;
}

}  // namespace braid::transport::tcp_wire
