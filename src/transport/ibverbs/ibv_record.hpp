// The connection record of the verbs transport: what a rank publishes in braid's store for
// one peer so that the peer can bring its RC QP to RTR and write into the rank's memory (the
// QP number and PSN, the port's LID or GID, and the address and rkey of the receive slot
// ring and of the control region: credit word + CTS ring), and the QP numbers of the data
// queue pairs that carry rendezvous stripes (BRAID_IB_QPS_PER_PEER - 1 of them).
//
// Wire format (little-endian, 92 bytes, then 4 per data QP, then the proof; version 2):
//   u32 magic "BIBV" | u16 version | u8 flags (bit 0: Ethernet; others 0) | u8 mtu (1..5)
//   u64 comm_id | i32 from | i32 to | u16 lid | u16 token_bytes (<= 256)
//   u32 qpn | u32 psn (24-bit each) | u64 ring_addr | u32 ring_rkey | u32 slots | u32 slot_bytes
//   u64 ctrl_addr | u32 ctrl_rkey | u32 ctrl_bytes | u16 data_qps (<= 15) | u16 0
//   u8 gid[16] | u32 data qpn * data_qps (24-bit each) | proof (the "token" field: a fresh
//   proof of the job's token bound to the rest of the record, base/auth.hpp; the token itself
//   is never written to the store)
//
// The store is shared and may hold anything (another job, a stale run, a hostile peer): the
// decoder reads only within the bytes it is given, refuses a record that is short, long or
// has a field out of range, and says why; record_authentic then checks who it is for.
// Verbs-free (no verbs.h), so that it builds and is fuzzed everywhere. Thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace braid::transport::ibverbs {

constexpr std::uint32_t kRecordMagic = 0x56424942u;  ///< "BIBV" in memory order
constexpr std::uint16_t kRecordVersion = 2;
constexpr std::size_t kRecordFixedBytes = 92;      ///< the record less its data QPNs and token
constexpr std::size_t kRecordMaxDataQps = 15;      ///< BRAID_IB_QPS_PER_PEER is at most 16
constexpr std::size_t kRecordMaxToken = 256;       ///< bytes
constexpr std::uint32_t kRecordMaxSlots = 4096;
constexpr std::uint32_t kRecordMinSlotBytes = 256;
constexpr std::uint32_t kRecordMaxSlotBytes = 16u << 20;
constexpr std::uint32_t kRecordMinCtrlBytes = 8;
constexpr std::uint32_t kRecordMaxCtrlBytes = 1u << 20;

struct ConnRecord {
  std::uint64_t comm_id = 0;
  std::int32_t from = -1, to = -1;  ///< the publishing rank and the peer it is meant for
  std::string token;                ///< a proof of the per-job token (sign_record; ≤ 256 bytes)
  std::uint16_t lid = 0;
  std::array<std::uint8_t, 16> gid{};
  bool ethernet = false;
  std::uint8_t mtu = 0;           ///< ibv_mtu value 1..5 (the publisher's active MTU)
  std::uint32_t qpn = 0, psn = 0;  ///< 24-bit each; qpn: the control QP (slots, credits, CTS)
  /// The data QPs' numbers (24-bit each, at most 15): rendezvous writes are striped over the
  /// control QP and these; the i-th connects to the peer's i-th. They share `psn`.
  std::vector<std::uint32_t> data_qpns;
  std::uint64_t ring_addr = 0;
  std::uint32_t ring_rkey = 0;  ///< the receive slot ring the peer writes into
  std::uint32_t slots = 0, slot_bytes = 0;  ///< slots 1..4096, slot_bytes 256..16 MiB, power of two
  std::uint64_t ctrl_addr = 0;
  std::uint32_t ctrl_rkey = 0, ctrl_bytes = 0;  ///< credit word + CTS ring (ctrl_bytes 8..1 MiB)
};

/// The record's bytes (the format above). Throws braid::Error (InvalidUsage) for a token
/// longer than 256 bytes, which no peer would accept; other fields are written as they are
/// (the publisher's own values: a wrong one is refused by the reader, with its reason).
std::string encode_record(const ConnRecord& r);

/// Decodes `bytes` into *out (set only on success). false with *why ("truncated: 12 of 88
/// bytes", "qpn 0x1000000 is not 24-bit", ...) on anything wrong: short or trailing bytes,
/// magic, version, unknown flags, a token over 256 bytes, a negative rank, an MTU outside
/// 1..5, a QPN/PSN over 24 bits, more than 15 data QPs, slots/slot_bytes/ctrl_bytes out of range, a null address,
/// or a region that wraps around the address space.
bool decode_record(std::string_view bytes, ConnRecord* out, std::string* why);

/// Sets `r->token` to a fresh proof of `token` bound to every other field of `*r`.
void sign_record(ConnRecord* r, const std::string& token);

/// Built for me (to == me), from `peer` (from == peer), this communicator, signed with this
/// token (sign_record; the proof checked in constant time).
bool record_authentic(const ConnRecord& r, std::uint64_t comm_id, int me, int peer, const std::string& token);

}  // namespace braid::transport::ibverbs
