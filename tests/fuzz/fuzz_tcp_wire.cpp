// The TCP transport's wire format from the accepting side: a connection's first bytes
// through the skeleton's hello framing (hello_needs with tcp_wire's tail), the hello's
// authentication, then the part headers that precede each payload, checked against the
// receives this rank posted (tcp_wire::part_header_valid, match_part).
#include "fuzz_common.hpp"

#include "transport/skeleton.hpp"
#include "transport/tcp/wire.hpp"

#include <vector>

namespace t = braid::transport;
namespace w = braid::transport::tcp_wire;

namespace {
constexpr std::uint64_t kComm = 0x0123456789abcdefull;
constexpr int kRank = 5;
const std::string kToken = "job-token";
// Sizes of the messages this rank has posted receives for, in turn.
constexpr std::size_t kSizes[] = {0, 1, 7, 4096, w::kStripeUnit, 3 * w::kStripeUnit + 5, 1 << 20};
constexpr std::size_t kMaxSize = 1 << 20;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const int sockets = 1 + in.byte() % 4;

  // The hello, read as Skeleton::read_hello reads it: never past what hello_needs asks.
  const t::HelloFormat format{w::kHelloMagic, w::kHelloBytes, &w::hello_tail};
  std::vector<unsigned char> buf(format.fixed_bytes);
  std::size_t got = 0;
  for (;;) {
    const long need = t::hello_needs(format, buf.data(), got);
    if (need < 0) return 0;  // refused: the socket is closed
    FUZZ_CHECK(static_cast<std::size_t>(need) >= got);
    FUZZ_CHECK(static_cast<std::size_t>(need) <= w::kHelloBytes + w::kMaxTokenBytes);
    if (static_cast<std::size_t>(need) == got) break;
    if (buf.size() < static_cast<std::size_t>(need)) buf.resize(static_cast<std::size_t>(need));
    const std::uint8_t* at = nullptr;
    const std::size_t k = in.take(static_cast<std::size_t>(need) - got, &at);
    if (k == 0) return 0;  // the peer stopped sending: the hello deadline drops it
    std::memcpy(buf.data() + got, at, k);
    got += k;
  }
  const w::Hello h = w::decode_hello(buf.data());
  FUZZ_CHECK(h.magic == w::kHelloMagic && h.version == w::kVersion);
  FUZZ_CHECK(got == w::kHelloBytes + h.token_bytes);
  unsigned char again[w::kHelloBytes];
  w::encode(h, again);
  FUZZ_CHECK(std::memcmp(again, buf.data(), w::kHelloBytes) == 0);
  const bool ok = t::hello_authentic({h.comm_id, h.from_rank, h.to_rank, buf.data() + w::kHelloBytes, h.token_bytes},
                                     kComm, kRank, kToken);
  if (ok) FUZZ_CHECK(h.from_rank >= 0 && h.from_rank < kRank && h.to_rank == kRank);

  // Message parts, in the order the receiver expects them (one stream stands for the
  // sockets; the split is the receiver's own, from its posted sizes).
  static std::vector<unsigned char> dest(kMaxSize);
  for (std::uint64_t seq = 0;; ++seq) {
    const std::size_t bytes = kSizes[seq % (sizeof kSizes / sizeof kSizes[0])];
    const std::uint64_t tag = seq * 977 + 3;
    const int parts = w::part_count(bytes, sockets);
    FUZZ_CHECK(parts >= 1 && parts <= sockets);
    for (int i = 0; i < parts; ++i) {
      std::size_t offset = 0, len = 0;
      w::part_range(bytes, parts, i, &offset, &len);
      FUZZ_CHECK(offset + len <= bytes);
      const int sock = w::part_socket(seq, i, sockets);
      FUZZ_CHECK(sock >= 0 && sock < sockets);
      const std::uint8_t* at = nullptr;
      if (in.take(w::kPartHeaderBytes, &at) < w::kPartHeaderBytes) return 0;
      const w::PartHeader ph = w::decode_part(at);
      unsigned char part[w::kPartHeaderBytes];
      w::encode(ph, part);
      FUZZ_CHECK(std::memcmp(part, at, w::kPartHeaderBytes) == 0);
      if (w::notice_header_valid(ph, braid::transport::kMaxNoticeBytes)) {
        // A failure notice: its reason is read whole (bounded), then the socket ends.
        FUZZ_CHECK(!w::part_header_valid(ph) && ph.part_bytes <= braid::transport::kMaxNoticeBytes);
        return 0;
      }
      if (!w::part_header_valid(ph)) return 0;  // corrupt stream: the connection fails
      if (w::match_part(ph, seq, i, tag, bytes, len) != w::PartMatch::ok) return 0;
      FUZZ_CHECK(ph.part_bytes == len && ph.msg_bytes == bytes);
      // The payload goes straight into the receive buffer: its length is the receiver's.
      const std::size_t k = in.take(len, &at);
      if (k > 0) std::memcpy(dest.data() + offset, at, k);
      if (k < len) return 0;
    }
  }
}
