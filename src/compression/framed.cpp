// Framed payloads (see framed.hpp).
#include "compression/framed.hpp"

#include <algorithm>

namespace braid::compression {

namespace {
constexpr std::size_t kFrame = 8 * 1024;  // values: a frame's f32 (32 KiB) stays in L1/L2
}  // namespace

std::size_t frame_values(const CodecSpec& spec, std::size_t payload) noexcept {
  if (spec.kind == CodecKind::topk) return std::max<std::size_t>(1, payload);
  const std::size_t unit = static_cast<std::size_t>(std::max(8, spec.block));
  const std::size_t want = std::min(kFrame, std::max<std::size_t>(1, payload));
  return (want + unit - 1) / unit * unit;
}

std::size_t framed_bytes(const CodecSpec& spec, std::size_t frame, std::size_t n) {
  return n / frame * encoded_bytes(spec, frame) + (n % frame ? encoded_bytes(spec, n % frame) : 0);
}

void encode_framed(const CodecSpec& spec, std::size_t frame, const float* x, float* residual, std::size_t n,
                   std::uint8_t* out, std::uint64_t step, std::uint64_t offset) {
  const std::size_t fb = encoded_bytes(spec, frame);
  for (std::size_t b = 0; b < n; b += frame, out += fb) {
    const std::size_t k = std::min(frame, n - b);
    if (residual)
      encode_add_feedback(spec, x + b, residual + b, k, out, step, offset + b);
    else
      encode(spec, x + b, k, out, step, offset + b);
  }
}

void decode_framed(const CodecSpec& spec, std::size_t frame, const std::uint8_t* in, std::size_t n, float* out,
                   bool sum_start) {
  const std::size_t fb = encoded_bytes(spec, frame);
  for (std::size_t b = 0; b < n; b += frame, in += fb) {
    const std::size_t k = std::min(frame, n - b);
    if (sum_start) {
      std::fill(out + b, out + b + k, 0.0f);
      decode_accumulate(spec, in, k, out + b);
    } else {
      decode(spec, in, k, out + b);
    }
  }
}

void decode_add_framed(const CodecSpec& spec, std::size_t frame, const std::uint8_t* in, std::size_t n, float* acc) {
  const std::size_t fb = encoded_bytes(spec, frame);
  for (std::size_t b = 0; b < n; b += frame, in += fb) decode_accumulate(spec, in, std::min(frame, n - b), acc + b);
}

}  // namespace braid::compression
