// What the verbs transport writes into its peers' memory: the header of a receive slot, a
// clear-to-send (CTS) entry, the 32-bit immediates that announce each write, and the credit
// arithmetic. Pure functions, so the protocol's checks have unit tests and a fuzz target of
// their own (what a peer writes is untrusted input: a header that does not fit its slot
// fails the connection, it is never followed).
//
// Layout (ibv_transport.cpp has the protocol):
//   receive slot   [header 32 | payload slot_bytes - 32]
//   header         kind u32 | chunk u32 | tag u64 | total u64 | offset u64   (little-endian)
//   control area   [credit word u64 | 56 spare | CTS entry * kCtsEntries]
//   CTS entry      addr u64 | rkey u32 | message u32 | bytes u64 | seq u64
//   immediate      kind 4 bits | 28 bits (kind data: none; cts: CTS seq; rndv done: message)
#pragma once

#include "transport/common.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

namespace braid::transport::ibverbs::wire {

/// What a receive slot holds.
enum Kind : std::uint32_t {
  kData = 1,  ///< a chunk of an eager message: `chunk` bytes at `offset` of `total`
  kRts = 2,   ///< request to send: a message of `total` bytes waits for a CTS (rendezvous)
  kBye = 3,   ///< the peer closes after sending `total` messages
  kAbort = 4, ///< the peer failed the connection on its side (a mismatch, a bad write) and closed it
};

constexpr std::size_t kHeaderBytes = 32;
constexpr std::size_t kCtsBytes = 32;
constexpr std::size_t kCtsOffset = 64;  ///< the CTS ring's place in the control area
constexpr std::size_t kCtsEntries = 4;
constexpr std::size_t kControlBytes = kCtsOffset + kCtsEntries * kCtsBytes;

struct SlotHeader {
  std::uint32_t kind = 0;
  std::uint32_t chunk = 0;
  std::uint64_t tag = 0;
  std::uint64_t total = 0;
  std::uint64_t offset = 0;
  auto fields() { return std::tie(kind, chunk, tag, total, offset); }
};

struct Cts {
  std::uint64_t addr = 0;
  std::uint32_t rkey = 0;
  std::uint32_t message = 0;  ///< low 32 bits of the receiver's message number
  std::uint64_t bytes = 0;
  std::uint64_t seq = 0;      ///< 1 + the CTS number: never 0 in a written entry
  auto fields() { return std::tie(addr, rkey, message, bytes, seq); }
};

inline void put_header(unsigned char* p, SlotHeader h) { le::put_fields(p, h.fields()); }

/// Reads the header of a slot of `slot_bytes` bytes; false with *why when a peer could not
/// have written it (unknown kind, a chunk larger than the slot's payload, a chunk past the
/// message's end, a chunk in a bye or a request to send).
inline bool get_header(const unsigned char* p, std::size_t slot_bytes, SlotHeader* h, std::string* why) {
  le::get_fields(p, h->fields());
  const std::uint64_t room = slot_bytes - kHeaderBytes;
  if (h->kind != kData && h->kind != kRts && h->kind != kBye && h->kind != kAbort) {
    *why = "a slot of unknown kind " + std::to_string(h->kind);
    return false;
  }
  if (h->kind != kData && (h->chunk != 0 || h->offset != 0)) {
    *why = "a control slot (kind " + std::to_string(h->kind) + ") carrying data";
    return false;
  }
  if (h->chunk > room || h->offset > h->total || h->total - h->offset < h->chunk) {
    *why = "a chunk of " + std::to_string(h->chunk) + " bytes at " + std::to_string(h->offset) + " of a " +
           std::to_string(h->total) + "-byte message in a slot of " + std::to_string(slot_bytes) + " bytes";
    return false;
  }
  // Every chunk but the last fills its slot, so a message's chunks are found in order.
  if (h->kind == kData && h->chunk != room && h->offset + h->chunk != h->total) {
    *why = "a short chunk (" + std::to_string(h->chunk) + " bytes) before the end of its message";
    return false;
  }
  return true;
}

inline void put_cts(unsigned char* p, Cts c) { le::put_fields(p, c.fields()); }
inline Cts get_cts(const unsigned char* p) {
  Cts c;
  le::get_fields(p, c.fields());
  return c;
}

/// The 32-bit immediate of a write: what it announces.
enum Imm : std::uint32_t {
  kImmData = 1,      ///< the next receive slot was written
  kImmCredit = 2,    ///< the credit word was written
  kImmCts = 3,       ///< a CTS entry was written (low bits: its seq)
  kImmRndvDone = 4,  ///< a rendezvous message is complete in the receiver's buffer
};
inline std::uint32_t imm(Imm kind, std::uint64_t low) {
  return (static_cast<std::uint32_t>(kind) << 28) | static_cast<std::uint32_t>(low & 0x0fffffffu);
}
inline Imm imm_kind(std::uint32_t v) { return static_cast<Imm>(v >> 28); }
inline std::uint32_t imm_low(std::uint32_t v) { return v & 0x0fffffffu; }

/// Slots the sender may still write, from the slots it has written and the count of freed
/// ones the receiver last wrote into its credit word; -1 when that count is impossible (more
/// freed than written, or fewer than `written - slots`), which fails the connection.
inline long long credits(std::uint64_t slots, std::uint64_t written, std::uint64_t freed) {
  if (freed > written || written - freed > slots) return -1;
  return static_cast<long long>(slots - (written - freed));
}

/// Slots an eager message of `bytes` takes (a 0-byte message takes one).
inline std::uint64_t slots_for(std::uint64_t bytes, std::size_t slot_bytes) {
  const std::uint64_t room = slot_bytes - kHeaderBytes;
  return bytes == 0 ? 1 : bytes / room + (bytes % room != 0);  // no overflow near 2^64
}

/// Bytes of the smallest rendezvous stripe: a message shorter than two of them goes whole on
/// the first queue pair.
constexpr std::uint64_t kMinStripe = 64 * 1024;

/// How a rendezvous message of `bytes` is striped over `lanes` queue pairs: the number of
/// stripes (1..lanes; 1 for a 0-byte message) and, in *per, the bytes of every stripe but the
/// last (a multiple of 4 KiB); stripe i covers [i * per, min((i + 1) * per, bytes)). Sender and
/// receiver compute it alike: the receiver completes the message after that many immediates.
inline std::uint64_t stripes(std::uint64_t bytes, std::size_t lanes, std::uint64_t* per) {
  const std::uint64_t want = std::max<std::uint64_t>(1, std::min<std::uint64_t>(lanes, bytes / kMinStripe));
  std::uint64_t p = bytes / want + (bytes % want != 0);
  p = (p + 4095) & ~std::uint64_t{4095};
  *per = p;
  return bytes == 0 ? 1 : bytes / p + (bytes % p != 0);
}

}  // namespace braid::transport::ibverbs::wire
