// The shared-memory transport's handshake and ring headers: a hello through the skeleton's
// framing (hello_needs with shm_wire's tail) and its authentication and reason; the
// answer (shm_wire::ack_needs) and its reason; then slot headers as the peer writes them
// into the shared ring, checked against the posted receives (shm_wire::match_slot) before
// their payload is copied out.
#include "fuzz_common.hpp"

#include "transport/shm/shm_wire.hpp"
#include "transport/skeleton.hpp"

#include <vector>

namespace t = braid::transport;
namespace w = braid::transport::shm_wire;

namespace {
constexpr std::uint64_t kComm = 0x0123456789abcdefull;
constexpr int kRank = 2;
const std::string kToken = "job-token";
constexpr std::size_t kSlotBytes = 4 * w::kPage;
constexpr std::size_t kSizes[] = {0, 1, 100, kSlotBytes, kSlotBytes + 1, 5 * kSlotBytes - 3};
constexpr std::size_t kMaxSize = 5 * kSlotBytes;

/// Reads a handshake record of `needs`-framing from `in` as the transport does: never past
/// what needs() asks. Returns the bytes, or false when refused or cut short.
template <class Needs>
bool read_framed(fuzz::Input& in, std::size_t first, std::size_t most, Needs needs, std::vector<unsigned char>* buf) {
  buf->assign(first, 0);
  std::size_t got = 0;
  for (;;) {
    const long need = needs(buf->data(), got);
    if (need < 0) return false;
    FUZZ_CHECK(static_cast<std::size_t>(need) >= got && static_cast<std::size_t>(need) <= most);
    if (static_cast<std::size_t>(need) == got) {
      buf->resize(got);
      return true;
    }
    if (buf->size() < static_cast<std::size_t>(need)) buf->resize(static_cast<std::size_t>(need));
    const std::uint8_t* at = nullptr;
    const std::size_t k = in.take(static_cast<std::size_t>(need) - got, &at);
    if (k == 0) return false;
    std::memcpy(buf->data() + got, at, k);
    got += k;
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const bool as_connector = in.byte() & 1;
  std::vector<unsigned char> buf;

  if (!as_connector) {
    // The accepting (higher) rank reads the hello.
    const t::HelloFormat format{w::kHelloMagic, w::kHelloBytes, &w::hello_tail};
    if (!read_framed(in, format.fixed_bytes, w::kHelloBytes + w::kMaxTokenBytes + w::kMaxReasonBytes,
                     [&](const unsigned char* b, std::size_t got) { return t::hello_needs(format, b, got); }, &buf))
      return 0;
    const w::Hello h = w::decode_hello(buf.data());
    FUZZ_CHECK(buf.size() == w::kHelloBytes + h.token_bytes + h.reason_bytes);
    unsigned char again[w::kHelloBytes];
    w::encode(h, again);
    FUZZ_CHECK(std::memcmp(again, buf.data(), w::kHelloBytes) == 0);
    if (!t::hello_authentic({h.comm_id, h.from_rank, h.to_rank, buf.data() + w::kHelloBytes, h.token_bytes}, kComm,
                            kRank, kToken))
      return 0;
    // As ShmTransport::adopt: the reason follows the token.
    const std::string reason(reinterpret_cast<const char*>(buf.data()) + w::kHelloBytes + h.token_bytes,
                             h.reason_bytes);
    FUZZ_CHECK(reason.size() <= w::kMaxReasonBytes);
  } else {
    // The connecting (lower) rank reads the answer to its hello.
    if (!read_framed(in, w::kAckBytes, w::kAckBytes + w::kMaxReasonBytes, &w::ack_needs, &buf)) return 0;
    const w::Ack a = w::decode_ack(buf.data());
    FUZZ_CHECK(a.magic == w::kAckMagic && buf.size() == w::kAckBytes + a.reason_bytes);
    const std::string reason(reinterpret_cast<const char*>(buf.data()) + w::kAckBytes, a.reason_bytes);
    if (a.status != w::kStatusOk) return 0;
  }

  // The ring: each slot's header is a snapshot of what the peer wrote; only a header that
  // matches lets its payload be copied, so the copy stays inside the receive buffer.
  static std::vector<unsigned char> dest(kMaxSize);
  static std::vector<unsigned char> slot(kSlotBytes, 0x5a);
  for (std::uint64_t seq = 0;; ++seq) {
    const std::size_t bytes = kSizes[seq % (sizeof kSizes / sizeof kSizes[0])];
    const std::uint64_t tag = seq * 31 + 1;
    std::uint64_t got = 0;
    do {
      const std::uint8_t* at = nullptr;
      if (in.take(sizeof(w::SlotHeader), &at) < sizeof(w::SlotHeader)) return 0;
      w::SlotHeader h;
      std::memcpy(&h, at, sizeof h);
      if (w::match_slot(h, seq, tag, bytes, got, kSlotBytes) != w::SlotMatch::ok) return 0;
      FUZZ_CHECK(h.part_bytes <= kSlotBytes && got + h.part_bytes <= bytes);
      if (h.part_bytes > 0) std::memcpy(dest.data() + got, slot.data(), h.part_bytes);
      got += h.part_bytes;
    } while (got < bytes);
  }
}
