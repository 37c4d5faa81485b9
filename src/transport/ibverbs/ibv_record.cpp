// The verbs connection record's codec and authentication (ibv_record.hpp).
#include "transport/ibverbs/ibv_record.hpp"

#include "base/auth.hpp"
#include "transport/common.hpp"

#include <braid/error.hpp>

#include <cstdio>
#include <cstring>
#include <tuple>
#include <utility>

namespace braid::transport::ibverbs {

namespace {

/// The fixed integer fields, in wire order: encoder and decoder walk the same list.
struct Fixed {
  std::uint32_t magic = kRecordMagic;
  std::uint16_t version = kRecordVersion;
  std::uint8_t flags = 0;
  std::uint8_t mtu = 0;
  std::uint64_t comm_id = 0;
  std::int32_t from = -1, to = -1;
  std::uint16_t lid = 0;
  std::uint16_t token_bytes = 0;
  std::uint32_t qpn = 0, psn = 0;
  std::uint64_t ring_addr = 0;
  std::uint32_t ring_rkey = 0, slots = 0, slot_bytes = 0;
  std::uint64_t ctrl_addr = 0;
  std::uint32_t ctrl_rkey = 0, ctrl_bytes = 0;
  std::uint16_t data_qps = 0, reserved = 0;
  auto fields() {
    return std::tie(magic, version, flags, mtu, comm_id, from, to, lid, token_bytes, qpn, psn, ring_addr, ring_rkey,
                    slots, slot_bytes, ctrl_addr, ctrl_rkey, ctrl_bytes, data_qps, reserved);
  }
};
constexpr std::size_t kIntBytes = le::Packed<decltype(std::declval<Fixed&>().fields())>::bytes;
static_assert(kIntBytes + 16 == kRecordFixedBytes, "the wire format's fixed part is 76 bytes of integers + the GID");

constexpr std::uint8_t kFlagEthernet = 1;

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

bool fail(std::string* why, const std::string& text) {
  if (why != nullptr) *why = text;
  return false;
}

bool power_of_two(std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

std::string encode_record(const ConnRecord& r) {
  if (r.token.size() > kRecordMaxToken)
    throw Error(ErrorCode::InvalidUsage, "verbs connection record: the auth token is " + std::to_string(r.token.size()) +
                                             " bytes, more than " + std::to_string(kRecordMaxToken));
  Fixed f;
  f.flags = r.ethernet ? kFlagEthernet : 0;
  f.mtu = r.mtu;
  f.comm_id = r.comm_id;
  f.from = r.from;
  f.to = r.to;
  f.lid = r.lid;
  f.token_bytes = static_cast<std::uint16_t>(r.token.size());
  f.qpn = r.qpn;
  f.psn = r.psn;
  f.ring_addr = r.ring_addr;
  f.ring_rkey = r.ring_rkey;
  f.slots = r.slots;
  f.slot_bytes = r.slot_bytes;
  f.ctrl_addr = r.ctrl_addr;
  f.ctrl_rkey = r.ctrl_rkey;
  f.ctrl_bytes = r.ctrl_bytes;
  if (r.data_qpns.size() > kRecordMaxDataQps)
    throw Error(ErrorCode::InvalidUsage, "verbs connection record: " + std::to_string(r.data_qpns.size()) +
                                             " data queue pairs, more than " + std::to_string(kRecordMaxDataQps));
  f.data_qps = static_cast<std::uint16_t>(r.data_qpns.size());
  const std::size_t qp_bytes = 4 * r.data_qpns.size();
  std::string out(kRecordFixedBytes + qp_bytes + r.token.size(), '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  le::put_fields(p, f.fields());
  std::memcpy(p + kIntBytes, r.gid.data(), 16);
  for (std::size_t i = 0; i < r.data_qpns.size(); ++i) le::put(p + kRecordFixedBytes + 4 * i, r.data_qpns[i], 4);
  if (!r.token.empty()) std::memcpy(p + kRecordFixedBytes + qp_bytes, r.token.data(), r.token.size());
  return out;
}

bool decode_record(std::string_view bytes, ConnRecord* out, std::string* why) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  auto truncated = [&](std::size_t need) {
    return fail(why, "truncated: " + std::to_string(n) + " of " + std::to_string(need) + " bytes");
  };
  // Judge the magic and version as soon as they are there, so that a stranger's value is
  // named as such rather than as a short record.
  if (n < 4) return truncated(kRecordFixedBytes);
  const auto magic = static_cast<std::uint32_t>(le::get(p, 4));
  if (magic != kRecordMagic) return fail(why, "not a braid verbs connection record (magic " + hex(magic) + ")");
  if (n < 6) return truncated(kRecordFixedBytes);
  const auto version = static_cast<std::uint16_t>(le::get(p + 4, 2));
  if (version != kRecordVersion)
    return fail(why, "record version " + std::to_string(version) + "; this build reads version " +
                         std::to_string(kRecordVersion) + " (is every rank running the same braid?)");
  if (n < kRecordFixedBytes) return truncated(kRecordFixedBytes);
  Fixed f;
  le::get_fields(p, f.fields());
  if (f.token_bytes > kRecordMaxToken)
    return fail(why, "token of " + std::to_string(f.token_bytes) + " bytes, more than " +
                         std::to_string(kRecordMaxToken));
  if (f.data_qps > kRecordMaxDataQps)
    return fail(why, std::to_string(f.data_qps) + " data queue pairs, more than " + std::to_string(kRecordMaxDataQps));
  const std::size_t qp_bytes = 4 * std::size_t{f.data_qps};
  const std::size_t total = kRecordFixedBytes + qp_bytes + f.token_bytes;
  if (n < total) return truncated(total);
  if (n > total)
    return fail(why, std::to_string(n - total) + " trailing bytes after the " + std::to_string(total) + "-byte record");
  if ((f.flags & ~kFlagEthernet) != 0) return fail(why, "unknown flags " + hex(f.flags));
  if (f.reserved != 0) return fail(why, "reserved field " + hex(f.reserved) + " is not 0");
  if (f.mtu < 1 || f.mtu > 5) return fail(why, "mtu " + std::to_string(f.mtu) + " is not an ibv_mtu (1..5)");
  if (f.from < 0 || f.to < 0)
    return fail(why, "negative rank (from " + std::to_string(f.from) + ", to " + std::to_string(f.to) + ")");
  if (f.qpn > 0xffffffu) return fail(why, "qpn " + hex(f.qpn) + " is not 24-bit");
  if (f.psn > 0xffffffu) return fail(why, "psn " + hex(f.psn) + " is not 24-bit");
  std::vector<std::uint32_t> data_qpns(f.data_qps);
  for (std::size_t i = 0; i < data_qpns.size(); ++i) {
    data_qpns[i] = static_cast<std::uint32_t>(le::get(p + kRecordFixedBytes + 4 * i, 4));
    if (data_qpns[i] > 0xffffffu) return fail(why, "data qpn " + hex(data_qpns[i]) + " is not 24-bit");
  }
  if (f.slots < 1 || f.slots > kRecordMaxSlots)
    return fail(why, "slots " + std::to_string(f.slots) + " is not in 1.." + std::to_string(kRecordMaxSlots));
  if (f.slot_bytes < kRecordMinSlotBytes || f.slot_bytes > kRecordMaxSlotBytes || !power_of_two(f.slot_bytes))
    return fail(why, "slot_bytes " + std::to_string(f.slot_bytes) + " is not a power of two in 256..16 MiB");
  if (f.ctrl_bytes < kRecordMinCtrlBytes || f.ctrl_bytes > kRecordMaxCtrlBytes)
    return fail(why, "ctrl_bytes " + std::to_string(f.ctrl_bytes) + " is not in 8..1 MiB");
  // A region at 0, or one whose end wraps, is no registered memory: refuse it here rather
  // than let the transport compute remote addresses from it.
  const std::uint64_t ring_bytes = std::uint64_t{f.slots} * f.slot_bytes;
  if (f.ring_addr == 0 || f.ring_addr > ~std::uint64_t{0} - ring_bytes)
    return fail(why, "ring_addr " + hex(f.ring_addr) + " + " + std::to_string(ring_bytes) + " bytes is no address range");
  if (f.ctrl_addr == 0 || f.ctrl_addr > ~std::uint64_t{0} - f.ctrl_bytes)
    return fail(why, "ctrl_addr " + hex(f.ctrl_addr) + " + " + std::to_string(f.ctrl_bytes) +
                         " bytes is no address range");
  ConnRecord r;
  r.comm_id = f.comm_id;
  r.from = f.from;
  r.to = f.to;
  r.token.assign(bytes.data() + kRecordFixedBytes + qp_bytes, f.token_bytes);
  r.data_qpns = std::move(data_qpns);
  r.lid = f.lid;
  std::memcpy(r.gid.data(), p + kIntBytes, 16);
  r.ethernet = (f.flags & kFlagEthernet) != 0;
  r.mtu = f.mtu;
  r.qpn = f.qpn;
  r.psn = f.psn;
  r.ring_addr = f.ring_addr;
  r.ring_rkey = f.ring_rkey;
  r.slots = f.slots;
  r.slot_bytes = f.slot_bytes;
  r.ctrl_addr = f.ctrl_addr;
  r.ctrl_rkey = f.ctrl_rkey;
  r.ctrl_bytes = f.ctrl_bytes;
  *out = std::move(r);
  return true;
}

namespace {
/// What a record's proof is bound to: the record encoded without it.
std::string signed_bytes(ConnRecord r) {
  r.token.clear();
  return encode_record(r);
}
}  // namespace

void sign_record(ConnRecord* r, const std::string& token) { r->token = base::auth::prove(token, signed_bytes(*r)); }

bool record_authentic(const ConnRecord& r, std::uint64_t comm_id, int me, int peer, const std::string& token) {
  // The proof is checked whatever the other fields say, so that its time says nothing.
  const bool proven = base::auth::verify(token, signed_bytes(r), reinterpret_cast<const unsigned char*>(r.token.data()),
                                         r.token.size());
  return proven && r.comm_id == comm_id && r.to == me && r.from == peer && me >= 0 && peer >= 0;
}

}  // namespace braid::transport::ibverbs
