// braid codecs: names, specs and the wire formats of docs/codecs.md, on f32 input.
//
// A CodecSpec says how one contiguous run of f32 values (a "payload": a shard, a chunk,
// a whole bucket) is encoded. A payload's size in bytes is a pure function of
// (spec, count), so sender and receiver agree on it without a header. Block boundaries
// start at the payload's first element; `offset` (the payload's global element offset)
// only keys the stochastic-rounding RNG.
//
// Thread-safety: every function here is reentrant; encode/decode touch only their
// arguments.
#pragma once

#include "kernels/host/codec_kernels.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace braid::compression {

/// The codec families.
enum class CodecKind : std::uint8_t {
  none,     ///< Raw little-endian f32 (4 bytes per value).
  fp16,     ///< IEEE binary16, round to nearest even.
  bf16,     ///< bfloat16, round to nearest even.
  fp8e4m3,  ///< OCP fp8 E4M3 codes with a per-block f32 scale.
  fp8e5m2,  ///< OCP fp8 E5M2 codes with a per-block f32 scale.
  int8,     ///< Symmetric int8 with a per-block absmax f32 scale.
  int4,     ///< Symmetric int4 (two per byte) with a per-block absmax f32 scale.
  sign1,    ///< One sign bit per value with a per-block f32 scale = mean |x|.
  mxfp8,    ///< OCP MX v1.0 MXFP8: E4M3 elements, an E8M0 (power-of-two) scale per 32.
  mxfp4,    ///< OCP MX v1.0 MXFP4: E2M1 elements (two per byte), an E8M0 scale per 32.
  topk,     ///< The k values of largest magnitude: u32 indices then f32 values.
  automatic ///< "auto": the communicator picks one of the above; not encodable itself.
};

/// Rounding of the int8/int4 quantisers.
enum class Rounding : std::uint8_t {
  nearest,     ///< Round to nearest, ties to even (deterministic, biased per element).
  stochastic   ///< Up with probability equal to the fraction (unbiased), counter-based RNG.
};

/// Values per scale block of the MX formats (OCP MX v1.0's k).
constexpr int kMxBlock = 32;

/// A parsed codec name. Default block 256 (MX: 32); seed keys the stochastic-rounding RNG.
struct CodecSpec {
  CodecKind kind = CodecKind::none;      ///< Family.
  int block = 256;                       ///< Elements per scale block (block formats only).
  Rounding rounding = Rounding::nearest; ///< int8/int4 rounding.
  double topk_ratio = 0.0;               ///< topk only: fraction kept, in (0, 1].
  std::uint64_t seed = 0;                ///< RNG seed for stochastic rounding.
};

/// Parses a codec name (case-insensitive):
///   none | fp16 | bf16 | fp8e4m3 | fp8e5m2 | int8 | int4 | sign1 | mxfp8 | mxfp4 | topk:RATIO | auto
/// followed by optional ":OPTION" suffixes:
///   sr / rn          stochastic / nearest rounding (int8, int4)
///   block=N          scale block size, a multiple of 8 in [8, 4096] (int8, int4, fp8*, sign1)
///   seed=N           RNG seed, decimal (int8:sr, int4:sr)
/// "" means none. RATIO is a decimal in (0, 1]. Throws braid::Error(InvalidUsage) naming
/// the valid names on anything else.
CodecSpec parse_codec(std::string_view text);

/// Canonical name; parse_codec(name(s)) == s. Options at their defaults are left out.
std::string name(const CodecSpec& spec);

/// True for the codecs that need error feedback to converge (sign1, topk).
bool requires_error_feedback(const CodecSpec& spec) noexcept;

/// True when E[decode(encode(x))] != x in general: every lossy codec with deterministic
/// rounding (fp16, bf16, fp8*, int8/int4 nearest, sign1, topk); false for none and
/// stochastically rounded int8/int4.
bool is_biased(const CodecSpec& spec) noexcept;

/// Nominal worst-case |decoded - x| / (absmax of x's block) for finite input, for cost
/// models and error budgets: int8 1/254, int4 1/14, fp8e4m3 2^-4, fp8e5m2 2^-3, mxfp8 2^-3,
/// mxfp4 2^-2 (for blocks whose absmax is at least 2^-119 / 2^-125: E8M0's smallest scale),
/// fp16 2^-11,
/// bf16 2^-8 (stochastic rounding: twice the nearest bound), sign1 and topk 1, none 0.
double error_bound(const CodecSpec& spec) noexcept;

/// Number of values a topk payload of `count` elements carries: max(1, ceil(ratio*count)),
/// at most count; 0 for count 0.
std::size_t topk_k(const CodecSpec& spec, std::size_t count) noexcept;

/// Bytes of the encoded payload of `count` values (always a multiple of 4).
/// Throws InvalidUsage for `auto`.
std::size_t encoded_bytes(const CodecSpec& spec, std::size_t count);

/// Encodes in[0..count) into out[0..encoded_bytes). `step` and `offset` (the global
/// element offset of in[0]) key stochastic rounding; other codecs ignore them.
void encode(const CodecSpec& spec, const float* in, std::size_t count, std::uint8_t* out, std::uint64_t step = 0,
            std::uint64_t offset = 0);

/// Encodes `in` (already x + residual) and writes residual_out = in - decode(encoded) in
/// the same pass. residual_out may equal in.
void encode_with_feedback(const CodecSpec& spec, const float* in, std::size_t count, std::uint8_t* out,
                          float* residual_out, std::uint64_t step = 0, std::uint64_t offset = 0);

/// Error-feedback encode without a staging pass: encodes y = x + residual and replaces
/// residual with y - decode(encoded). This is what a worker or owner does each step.
void encode_add_feedback(const CodecSpec& spec, const float* x, float* residual, std::size_t count,
                         std::uint8_t* out, std::uint64_t step = 0, std::uint64_t offset = 0);

/// Decodes a payload of `count` values into out. Throws braid::Error(Network) when a topk
/// payload's indices are out of range or not ascending (wire data is untrusted).
void decode(const CodecSpec& spec, const std::uint8_t* in, std::size_t count, float* out);

/// acc[i] += decoded[i] in f32 (topk: a sparse add of its k entries only).
void decode_accumulate(const CodecSpec& spec, const std::uint8_t* in, std::size_t count, float* acc);

/// The block kernels' parameters of a block codec (int8, int4, fp8*, sign1) for a payload
/// whose first value has global index `offset`, at training step `step`: what encode()
/// passes to kernels::block_encode, and what the device kernels take.
kernels::BlockCodecParams block_params(const CodecSpec& spec, std::uint64_t step, std::uint64_t offset);

}  // namespace braid::compression
