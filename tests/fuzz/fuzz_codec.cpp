// Codec payload decoders (compression::decode, decode_accumulate and the framed decoders
// the compressed plans use): the payload is a peer's bytes, with corrupt scales, codes and
// topk indices; the codec, count and frame are the receiver's own (every rank agrees on
// them), so they are chosen from the input's first bytes among valid values. The payload
// sits in a buffer of exactly the size the receiver expects, so any read past it is seen.
#include "fuzz_common.hpp"

#include "compression/codec.hpp"
#include "compression/framed.hpp"

#include <braid/error.hpp>

#include <vector>

namespace cz = braid::compression;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  cz::CodecSpec spec;
  spec.kind = static_cast<cz::CodecKind>(in.byte() % 11);  // none .. topk (auto is never on the wire)
  spec.block = 8 * (1 + in.byte() % 64);                   // 8 .. 512
  if (spec.kind == cz::CodecKind::mxfp8 || spec.kind == cz::CodecKind::mxfp4) spec.block = cz::kMxBlock;
  spec.rounding = (in.byte() & 1) ? cz::Rounding::stochastic : cz::Rounding::nearest;
  spec.topk_ratio = (1 + in.byte()) / 256.0;              // (0, 1]
  const std::uint8_t lo = in.byte(), hi = in.byte();
  const std::size_t count = (std::size_t{hi} << 8 | lo) % 5000;
  const bool framed = in.byte() & 1;

  const std::size_t frame = cz::frame_values(spec, count);
  const std::size_t bytes = framed ? cz::framed_bytes(spec, frame, count) : cz::encoded_bytes(spec, count);
  // The payload: the rest of the input, repeated to the expected length (or zeros).
  std::vector<std::uint8_t> payload(bytes);
  const std::size_t avail = in.left();
  for (std::size_t i = 0; i < bytes && avail > 0; ++i) payload[i] = in.here()[i % avail];
  std::vector<float> out(count), acc(count, 1.0f);
  try {
    if (framed) {
      cz::decode_framed(spec, frame, payload.data(), count, out.data(), (lo & 1) != 0);
      cz::decode_add_framed(spec, frame, payload.data(), count, acc.data());
    } else {
      cz::decode(spec, payload.data(), count, out.data());
      cz::decode_accumulate(spec, payload.data(), count, acc.data());
    }
  } catch (const braid::Error& e) {
    // Only topk can tell a corrupt payload (indices out of range or order); it says so.
    FUZZ_CHECK(spec.kind == cz::CodecKind::topk && e.code() == braid::ErrorCode::Network);
  }
  return 0;
}
