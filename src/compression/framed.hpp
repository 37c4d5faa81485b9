// Framed payloads: how a compressed plan lays encoded values out in bytes.
//
// A compressed plan (collectives/compressed.cpp) addresses its encoded data as logical
// values of a `packed` buffer, not as bytes, so that the verifier and the builder's
// dependency tracking treat it like any other buffer. A payload of n values starting at
// packed value v (v a multiple of the frame) is encoded frame by frame: frame k holds
// values [k*frame, (k+1)*frame) of the payload, encoded as a payload of its own (block
// boundaries start at the frame's start; the stochastic-rounding RNG is keyed on the
// global offset), at byte (v + k*frame) / frame * frame_bytes of the buffer. A frame is
// a whole number of scale blocks, so a framed payload decodes to exactly what one whole
// payload would, and the owner of a shard can decode, sum and re-encode one cache-sized
// frame at a time. topk is never cut: its frame is the whole payload.
#pragma once

#include "compression/codec.hpp"

#include <cstddef>
#include <cstdint>

namespace braid::compression {

/// Values per frame of `spec`'s payloads of up to `payload` values: about 8 Ki values,
/// fewer when the payloads are smaller (a multiple of the scale block, at least 8), for
/// block codecs; `payload` (the whole payload, at least 1) for topk.
std::size_t frame_values(const CodecSpec& spec, std::size_t payload) noexcept;

/// Bytes of a framed payload of `n` values: whole frames of encoded_bytes(spec, frame)
/// each, then encoded_bytes(spec, n % frame) for a shorter last one.
std::size_t framed_bytes(const CodecSpec& spec, std::size_t frame, std::size_t n);

/// Byte offset of packed value `v` (a multiple of `frame`).
inline std::size_t framed_offset(const CodecSpec& spec, std::size_t frame, std::size_t v) {
  return v / frame * encoded_bytes(spec, frame);
}

/// Encodes x[0, n) frame by frame into out. With `residual` (n values), encodes
/// x + residual and leaves residual = (x + residual) - decoded (error feedback).
/// `step` and `offset` (the global index of x[0]) key stochastic rounding.
void encode_framed(const CodecSpec& spec, std::size_t frame, const float* x, float* residual, std::size_t n,
                   std::uint8_t* out, std::uint64_t step, std::uint64_t offset);

/// out[0, n) = decoded values; with `sum_start`, +0.0f + decoded (the first term of a
/// sum that starts from +0, so that the signs of zero match such a fold).
void decode_framed(const CodecSpec& spec, std::size_t frame, const std::uint8_t* in, std::size_t n, float* out,
                   bool sum_start);

/// acc[0, n) += decoded values (f32).
void decode_add_framed(const CodecSpec& spec, std::size_t frame, const std::uint8_t* in, std::size_t n, float* acc);

}  // namespace braid::compression
