// The verbs transport's RDMA-written control bytes, which a peer writes straight into this
// rank's memory: slot headers (wire::get_header), clear-to-send entries (wire::get_cts),
// the credit word (wire::credits), and the sizes both sides derive from a header
// (slots_for, stripes). Verbs-free, as ibv_wire.hpp is.
#include "fuzz_common.hpp"

#include "transport/ibverbs/ibv_wire.hpp"

#include <cstring>

namespace w = braid::transport::ibverbs::wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  // A slot size the transport could have configured: a header plus at least a byte.
  const std::size_t slot_bytes = w::kHeaderBytes + 1 + (std::size_t{in.byte()} << 8 | in.byte());
  unsigned char raw[w::kHeaderBytes + w::kCtsBytes] = {};
  const std::uint8_t* at = nullptr;
  const std::size_t got = in.take(sizeof raw, &at);
  if (got > 0) std::memcpy(raw, at, got);

  // The slot header: accepted only when a peer could have written it.
  w::SlotHeader h;
  std::string why;
  if (w::get_header(raw, slot_bytes, &h, &why)) {
    const std::uint64_t room = slot_bytes - w::kHeaderBytes;
    FUZZ_CHECK(h.kind == w::kData || h.kind == w::kRts || h.kind == w::kBye || h.kind == w::kAbort);
    FUZZ_CHECK(h.chunk <= room && h.offset <= h.total && h.offset + h.chunk <= h.total);
    FUZZ_CHECK(h.kind == w::kData || (h.chunk == 0 && h.offset == 0));
    unsigned char again[w::kHeaderBytes];
    w::put_header(again, h);
    FUZZ_CHECK(std::memcmp(again, raw, w::kHeaderBytes) == 0);
    // What the receiver derives from an accepted header stays in range.
    const std::uint64_t n = w::slots_for(h.total, slot_bytes);
    FUZZ_CHECK(n >= 1 && (h.total == 0 || (n - 1) * room < h.total));
  } else {
    FUZZ_CHECK(!why.empty());
  }

  // A CTS entry decodes to its fields and back.
  const w::Cts c = w::get_cts(raw + w::kHeaderBytes);
  unsigned char cts[w::kCtsBytes];
  w::put_cts(cts, c);
  FUZZ_CHECK(std::memcmp(cts, raw + w::kHeaderBytes, w::kCtsBytes) == 0);

  // The credit word, whatever the peer wrote into it.
  std::uint64_t slots = 0, written = 0, freed = 0;
  std::memcpy(&slots, raw, 8);
  std::memcpy(&written, raw + 8, 8);
  std::memcpy(&freed, raw + 16, 8);
  slots = 1 + slots % 4096;  // the transport's own figure
  const long long credit = w::credits(slots, written, freed);
  FUZZ_CHECK(credit == -1 || (credit >= 0 && static_cast<std::uint64_t>(credit) <= slots));
  if (credit >= 0) FUZZ_CHECK(freed <= written && written - freed <= slots);

  // Striping of a rendezvous message whose size came from an RTS.
  const std::size_t lanes = 1 + in.byte() % 16;
  std::uint64_t per = 0;
  // (The transport stripes only a size it matched against the posted receive: a buffer.)
  const std::uint64_t total = h.total & ((std::uint64_t{1} << 56) - 1);
  const std::uint64_t n = w::stripes(total, lanes, &per);
  FUZZ_CHECK(n >= 1 && n <= lanes && per % 4096 == 0);
  if (total > 0) FUZZ_CHECK(per > 0 && (n - 1) * per < total && n * per >= total);
  return 0;
}
