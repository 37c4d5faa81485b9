// The UCX transport's control messages (hello, refusal, bye, bye-ack: ucx_wire::
// decode_control and control_authentic, as UcxTransport::on_control uses them) and the
// worker address a peer publishes in the store as hex (base::from_hex_bytes, as
// connect_steps reads it). Needs no UCX: the format is UCX-free.
#include "fuzz_common.hpp"

#include "base/text.hpp"
#include "transport/transport.hpp"
#include "transport/ucx/ucx_wire.hpp"

#include <algorithm>
#include <vector>

namespace w = braid::transport::ucx_wire;

namespace {
constexpr std::uint64_t kComm = 0x0123456789abcdefull;
constexpr int kRank = 3, kSize = 8;
const std::string kToken = "job-token";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  ++data;
  --size;
  if (mode & 1) {
    // The published worker address: hex text from another rank.
    const std::string text(reinterpret_cast<const char*>(data), size);
    std::vector<unsigned char> addr;
    if (braid::base::from_hex_bytes(text, &addr)) {
      FUZZ_CHECK(addr.size() * 2 == text.size());
      FUZZ_CHECK(braid::base::hex_bytes(addr.data(), addr.size()) == text);
    }
    return 0;
  }
  // A control message as it arrived (UCX gives its length).
  w::ControlView v;
  if (!w::decode_control(data, size, &v)) return 0;
  FUZZ_CHECK(w::kControlFixed + std::size_t{v.h.token_bytes} + v.h.addr_bytes == size);
  const std::string token(reinterpret_cast<const char*>(v.token), v.h.token_bytes);
  std::vector<unsigned char> addr;
  if (v.addr != nullptr) addr.assign(v.addr, v.addr + v.h.addr_bytes);
  FUZZ_CHECK((v.addr == nullptr) == (v.h.addr_bytes == 0));
  // A bye's payload read as a failure notice (bounded), and made again the same.
  if (v.addr != nullptr) {
    int blame = 0;
    std::string why;
    if (w::decode_notice(v.addr, v.h.addr_bytes, braid::transport::kMaxNoticeBytes, &blame, &why)) {
      FUZZ_CHECK(why.size() <= braid::transport::kMaxNoticeBytes && why.size() + 4 == v.h.addr_bytes);
      FUZZ_CHECK(w::encode_notice(blame, why) == addr);
    }
  }
  // Encoding what was decoded gives the same fields back (the proof is fresh each time).
  if (v.h.token_bytes == braid::base::auth::kProofBytes) {
    const std::vector<unsigned char> again = w::encode_control(v.h, kToken, addr);
    FUZZ_CHECK(again.size() == size && std::equal(again.begin(), again.begin() + w::kControlFixed, data));
    FUZZ_CHECK(std::equal(again.end() - static_cast<long>(addr.size()), again.end(), addr.begin()));
    w::ControlView mine;
    FUZZ_CHECK(w::decode_control(again.data(), again.size(), &mine));
    // What this rank makes for itself is authentic to itself, whatever the fields.
    if (v.h.comm_id == kComm && v.h.to == kRank && v.h.from >= 0 && v.h.from < kSize && v.h.from != kRank)
      FUZZ_CHECK(w::control_authentic(mine, kComm, kRank, kSize, kToken, v.h.from));
  }
  const std::int64_t tag_rank = mode >> 1 & 7;
  if (w::control_authentic(v, kComm, kRank, kSize, kToken, tag_rank)) {
    // Only a proof of the token passes: the fuzzer cannot forge one (nor the token in clear).
    FUZZ_CHECK(v.h.from >= 0 && v.h.from < kSize && v.h.from != kRank && v.h.from == tag_rank &&
               token.size() == braid::base::auth::kProofBytes && token != kToken);
  }
  return 0;
}
