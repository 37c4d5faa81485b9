// braid shared-memory transport — segment layout and socket handshake (private to
// the transport and its tests). See docs/transport-shm.md.
//
// Segment of the pair (lo, hi), created by lo, page offsets:
//   0                  SegmentHeader (one page)
//   kPage              ring 0: lo -> hi
//   kPage + ring_bytes ring 1: hi -> lo
// Ring: RingControl (4 lines of 128 bytes), `slots` SlotHeaders of 64 bytes, padding
// to a page, then `slots` payload areas of `slot_bytes` (a multiple of a page).
//
// With GPUs (ShmOptions::gpu at both ends), lo also allocates a device ring: one device
// allocation of 2 x slots x slot_bytes, direction r's slot i at (r * slots + i) *
// slot_bytes, which it exports (gpu::Runtime::ipc_export) into the SegmentHeader; hi maps
// it and says so in its Ack (kAckDeviceRing). A part of a device message then travels in
// the device slot of its index (kind kKindDevice; its header still in the host ring).
//
// Handshake integers are little-endian; the segment uses host order (same host).
#pragma once

#include <atomic>
#include "transport/common.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

namespace braid::transport::shm_wire {

constexpr std::uint32_t kHelloMagic = 0x48535242u;  // "BRSH"
constexpr std::uint32_t kAckMagic = 0x41535242u;    // "BRSA"
constexpr std::uint16_t kVersion = 2;  ///< 2: the device ring (SegmentHeader, Ack flags, kKindDevice)
constexpr std::uint64_t kSegmentMagic = 0x4745534449415242ull;  // "BRAIDSEG"
/// After the handshake the socket carries only this byte: "look at the rings".
constexpr unsigned char kBell = 0xB1;
/// ...or, once, from a rank that failed (Transport::tell_peers), before it closes: this
/// byte, the reason's length (u16) and the rank it blames (i32, -1 for none), little-endian,
/// then the reason (at most kMaxNoticeBytes).
constexpr unsigned char kNotice = 0xB2;
constexpr std::size_t kNoticeHeader = 1 + 2 + 4;

constexpr std::size_t kPage = 4096;
constexpr std::size_t kLine = 128;  // two cache lines: no false sharing via the adjacent-line prefetcher
constexpr std::size_t kMaxTokenBytes = 4096;
constexpr std::size_t kMaxReasonBytes = 4096;
constexpr std::size_t kMinSlotBytes = kPage;
constexpr std::size_t kMaxSlotBytes = std::size_t{1} << 30;
constexpr int kMaxSlots = 4096;

/// Hello status: the connector created and mapped the segment (its fd travels with
/// the hello), or it could not (the reason follows the token).
constexpr std::uint16_t kStatusOk = 0;
constexpr std::uint16_t kStatusFailed = 1;

/// Slot kind: the payload is in the slot.
constexpr std::uint32_t kKindInline = 1;
/// Slot kind: the payload is in the device slot of the same index (a device ring exists).
constexpr std::uint32_t kKindDevice = 2;
/// Ack flag: hi mapped lo's device ring; device messages may use it both ways.
constexpr std::uint16_t kAckDeviceRing = 1;
/// Bytes of an IPC handle the SegmentHeader can carry.
constexpr std::size_t kMaxIpcBytes = 256;

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared-memory rings need lock-free atomics");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "shared-memory rings need lock-free atomics");

struct SegmentHeader {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t slots;
  std::uint64_t slot_bytes;
  std::uint64_t comm_id;
  std::int32_t rank_lo;
  std::int32_t rank_hi;
  std::uint64_t total_bytes;
  // The device ring (all zero without one).
  std::uint64_t device_ring_bytes;   ///< 2 * slots * slot_bytes, or 0: no device ring
  std::uint64_t device_ring_ptr;     ///< its address in lo's process (ranks that are threads of one process use it)
  std::int64_t lo_pid;               ///< lo's process
  std::int32_t device;               ///< lo's GPU
  std::uint32_t ipc_bytes;           ///< bytes of ipc (<= kMaxIpcBytes)
  unsigned char ipc[kMaxIpcBytes];   ///< gpu::IpcHandle::bytes of the allocation
};
static_assert(sizeof(SegmentHeader) <= kPage, "the segment header fits its page");

/// Shared control block of one ring. head and the sleeping flag are written by one
/// side, tail and the waiting flag by the other; each sits on its own line.
struct RingControl {
  /// Slots published by the producer (monotonic; slot index = count % slots).
  alignas(kLine) std::atomic<std::uint64_t> head;
  /// Slots released by the consumer.
  alignas(kLine) std::atomic<std::uint64_t> tail;
  /// 1 while the consumer may block: the producer rings the bell after publishing.
  alignas(kLine) std::atomic<std::uint32_t> consumer_sleeping;
  /// 1 while the producer may block waiting for slots to be released.
  alignas(kLine) std::atomic<std::uint32_t> producer_waiting;
};
static_assert(sizeof(RingControl) == 4 * kLine, "RingControl layout");

/// Written by the producer before it publishes the slot.
struct SlotHeader {
  std::uint64_t seq;         ///< message number (per direction, from 0)
  std::uint64_t tag;
  std::uint64_t msg_bytes;   ///< size of the whole message
  std::uint64_t offset;      ///< of this part within the message
  std::uint64_t part_bytes;  ///< payload bytes in this slot
  std::uint32_t kind;        ///< kKindInline
  std::uint32_t reserved;
  std::uint64_t reserved2[2];
};
static_assert(sizeof(SlotHeader) == 64, "SlotHeader layout");

constexpr std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

struct Layout {
  std::size_t slot_bytes = 0;
  std::size_t slots = 0;
  std::size_t headers_offset = 0;  // within a ring
  std::size_t payload_offset = 0;  // within a ring
  std::size_t ring_bytes = 0;
  std::size_t total_bytes = 0;
  std::size_t ring_offset(int ring) const { return kPage + static_cast<std::size_t>(ring) * ring_bytes; }
};

inline Layout layout(std::size_t slot_bytes, std::size_t slots) {
  Layout l;
  l.slot_bytes = slot_bytes;
  l.slots = slots;
  l.headers_offset = sizeof(RingControl);
  l.payload_offset = round_up(sizeof(RingControl) + slots * sizeof(SlotHeader), kPage);
  l.ring_bytes = l.payload_offset + slots * slot_bytes;
  l.total_bytes = kPage + 2 * l.ring_bytes;
  return l;
}

/// First bytes on a pair's socket, from the lower rank; followed by the token, then
/// (status failed) the reason. With status ok the segment's fd rides along (SCM_RIGHTS).
struct Hello {
  std::uint32_t magic = kHelloMagic;
  std::uint16_t version = kVersion;
  std::uint16_t status = kStatusOk;
  std::uint16_t token_bytes = 0;
  std::uint16_t reason_bytes = 0;
  std::int32_t from_rank = 0;
  std::int32_t to_rank = 0;
  std::uint32_t slots = 0;
  std::uint64_t comm_id = 0;
  std::uint64_t slot_bytes = 0;
};
constexpr std::size_t kHelloBytes = 40;

/// The higher rank's answer; followed by the reason when status is failed. After it
/// the socket carries only doorbell bytes.
struct Ack {
  std::uint32_t magic = kAckMagic;
  std::uint16_t version = kVersion;
  std::uint16_t status = kStatusOk;
  std::uint16_t reason_bytes = 0;
  std::uint16_t flags = 0;  ///< kAckDeviceRing
};
constexpr std::size_t kAckBytes = 12;

/// Hello's fields in wire order (transport/common.hpp, le::put_fields).
template <class H>
auto hello_fields(H& h) {
  return std::tie(h.magic, h.version, h.status, h.token_bytes, h.reason_bytes, h.from_rank, h.to_rank, h.slots,
                  h.comm_id, h.slot_bytes);
}
static_assert(le::Packed<decltype(hello_fields(std::declval<Hello&>()))>::bytes == kHelloBytes, "Hello layout");

/// Ack's fields in wire order.
template <class A>
auto ack_fields(A& a) {
  return std::tie(a.magic, a.version, a.status, a.reason_bytes, a.flags);
}
static_assert(le::Packed<decltype(ack_fields(std::declval<Ack&>()))>::bytes == kAckBytes, "Ack layout");

inline void encode(const Hello& h, unsigned char* out) { le::put_fields(out, hello_fields(h)); }

inline Hello decode_hello(const unsigned char* in) {
  Hello h;
  le::get_fields(in, hello_fields(h));
  return h;
}

/// The bytes after a hello's fixed part `fixed` (kHelloBytes): the token, then the
/// reason; -1 when it is not a hello of this version or either is longer than allowed
/// (the skeleton's HelloFormat::tail_bytes; the magic is checked before).
inline long hello_tail(const unsigned char* fixed) {
  const Hello h = decode_hello(fixed);
  if (h.version != kVersion || h.token_bytes > kMaxTokenBytes || h.reason_bytes > kMaxReasonBytes) return -1;
  return long{h.token_bytes} + h.reason_bytes;
}

/// Hello, token and reason, ready to write.
inline std::string hello_bytes(const Hello& h, const std::string& token, const std::string& reason) {
  std::string out(kHelloBytes, '\0');
  encode(h, reinterpret_cast<unsigned char*>(&out[0]));
  return out + token + reason;
}

inline std::string ack_bytes(const Ack& a, const std::string& reason) {
  std::string out(kAckBytes, '\0');
  le::put_fields(reinterpret_cast<unsigned char*>(&out[0]), ack_fields(a));
  return out + reason;
}

inline Ack decode_ack(const unsigned char* in) {
  Ack a;
  le::get_fields(in, ack_fields(a));
  return a;
}

/// How many bytes in all the answer whose first `got` bytes are `buf` needs (the ack and
/// its reason; the reader reads no further, so it is complete when this equals `got`), or
/// -1 when its fixed part is not an ack of this version or announces too long a reason.
inline long ack_needs(const unsigned char* buf, std::size_t got) {
  if (got < kAckBytes) return static_cast<long>(kAckBytes);
  const Ack a = decode_ack(buf);
  if (a.magic != kAckMagic || a.version != kVersion || a.reason_bytes > kMaxReasonBytes) return -1;
  return static_cast<long>(kAckBytes + a.reason_bytes);
}

/// How a slot header compares with what the receiver expects: the next part of message
/// `seq`, posted with `tag` and `msg_bytes`, of which `got` bytes have arrived.
enum class SlotMatch {
  ok,
  wrong_message,  ///< another message number: the ring is out of step
  mismatch,       ///< another tag or message size than the posted receive
  unknown_kind,   ///< a slot kind this version does not know
  wrong_range,    ///< not the part at `got` of the length both sides derive
};

/// Compares a snapshot `h` of a slot header (the peer writes it: untrusted) with the part
/// expected. Only `ok` lets the receiver copy the payload, whose length is then at most
/// `slot_bytes` and ends within the message.
inline SlotMatch match_slot(const SlotHeader& h, std::uint64_t seq, std::uint64_t tag, std::uint64_t msg_bytes,
                            std::uint64_t got, std::size_t slot_bytes) {
  if (h.seq != seq) return SlotMatch::wrong_message;
  if (h.tag != tag || h.msg_bytes != msg_bytes) return SlotMatch::mismatch;
  if (h.kind != kKindInline && h.kind != kKindDevice) return SlotMatch::unknown_kind;
  const std::uint64_t rest = msg_bytes - got;
  const std::uint64_t want = rest < slot_bytes ? rest : slot_bytes;
  if (h.offset != got || h.part_bytes != want) return SlotMatch::wrong_range;
  return SlotMatch::ok;
}

}  // namespace braid::transport::shm_wire
