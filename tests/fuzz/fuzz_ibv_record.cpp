// The verbs transport's connection record (ibverbs::decode_record and record_authentic), as
// a rank reads it from braid's store, where another job or a hostile peer may have put any
// bytes. Needs no verbs: the record is verbs-free.
#include "fuzz_common.hpp"

#include "base/auth.hpp"

#include "transport/ibverbs/ibv_record.hpp"

#include <string_view>

namespace ib = braid::transport::ibverbs;

namespace {
constexpr std::uint64_t kComm = 0x0123456789abcdefull;
const std::string kToken = "job-token";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ib::ConnRecord r;
  r.qpn = 0x5a5a5a;
  std::string why;
  if (!ib::decode_record(std::string_view(reinterpret_cast<const char*>(data), size), &r, &why)) {
    FUZZ_CHECK(!why.empty());
    FUZZ_CHECK(r.qpn == 0x5a5a5a);  // untouched on refusal
    return 0;
  }
  FUZZ_CHECK(r.token.size() <= ib::kRecordMaxToken && r.data_qpns.size() <= ib::kRecordMaxDataQps &&
             size == ib::kRecordFixedBytes + 4 * r.data_qpns.size() + r.token.size());
  FUZZ_CHECK(r.from >= 0 && r.to >= 0 && r.mtu >= 1 && r.mtu <= 5);
  FUZZ_CHECK(r.qpn <= 0xffffffu && r.psn <= 0xffffffu);
  for (const std::uint32_t q : r.data_qpns) FUZZ_CHECK(q <= 0xffffffu);
  FUZZ_CHECK(r.slots >= 1 && r.slots <= ib::kRecordMaxSlots);
  FUZZ_CHECK(r.slot_bytes >= ib::kRecordMinSlotBytes && r.slot_bytes <= ib::kRecordMaxSlotBytes &&
             (r.slot_bytes & (r.slot_bytes - 1)) == 0);
  FUZZ_CHECK(r.ctrl_bytes >= ib::kRecordMinCtrlBytes && r.ctrl_bytes <= ib::kRecordMaxCtrlBytes);
  FUZZ_CHECK(r.ring_addr != 0 && r.ring_addr + std::uint64_t{r.slots} * r.slot_bytes >= r.ring_addr);
  FUZZ_CHECK(r.ctrl_addr != 0 && r.ctrl_addr + r.ctrl_bytes >= r.ctrl_addr);
  // One encoding per record: what was accepted is exactly what the encoder writes.
  const std::string again = ib::encode_record(r);
  FUZZ_CHECK(again.size() == size && std::memcmp(again.data(), data, size) == 0);
  const bool ok = ib::record_authentic(r, kComm, r.to, r.from, kToken);
  // Only a proof bound to these very bytes passes (never the token in clear); what this
  // rank signs itself does.
  if (ok) FUZZ_CHECK(r.comm_id == kComm && r.token.size() == braid::base::auth::kProofBytes);
  FUZZ_CHECK(!(r.token == kToken && ok));
  ib::ConnRecord signed_r = r;
  ib::sign_record(&signed_r, kToken);
  FUZZ_CHECK(ib::record_authentic(signed_r, r.comm_id, r.to, r.from, kToken) == (r.from >= 0 && r.to >= 0));
  FUZZ_CHECK(!ib::record_authentic(signed_r, r.comm_id, r.to, r.from, kToken + "x"));
  return 0;
}
