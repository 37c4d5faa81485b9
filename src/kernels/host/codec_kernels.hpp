// braid host codec kernels: the wire formats of docs/codecs.md, encoded from and decoded
// to f32. Depends on nothing but the standard library (and rng.hpp, reduce.hpp).
//
// Every encoder takes `in` and an optional `add` (in[i] + add[i] is the value encoded,
// which is how error feedback adds the residual without an extra pass) and an optional
// `residual` output that receives value - decoded(value) (0 for blocks that are not
// finite, see docs/codecs.md). `residual` may alias `in` or `add` exactly; `out` must not
// overlap any input. Pointers need no particular alignment. Decoders either store or add
// (`accumulate`) into f32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace braid::kernels {

/// Block-scaled formats: the blocks' scales (f32; for the OCP MX formats one E8M0 byte,
/// a power of two) followed by the codes. mxfp8 (E4M3 elements) and mxfp4 (E2M1, two per
/// byte, low nibble first) are OCP Microscaling v1.0 with blocks of 32 (docs/codecs.md).
enum class BlockFormat : std::uint8_t { int8, int4, fp8e4m3, fp8e5m2, sign1, mxfp8, mxfp4 };

/// Parameters of a block-scaled encoder (trivially copyable, passed by value).
struct BlockCodecParams {
  BlockFormat format = BlockFormat::int8;  ///< Wire format.
  std::uint32_t block = 256;               ///< Elements per block: a multiple of 8 in [8, 4096].
  bool stochastic = false;                 ///< int8/int4 only: stochastic instead of nearest-even.
  std::uint64_t seed = 0;                  ///< RNG key (stochastic rounding).
  std::uint64_t step = 0;                  ///< RNG counter, high half (training step).
  std::uint64_t offset = 0;                ///< Global element offset of in[0] (RNG counter, low half).
};

/// Largest block size the block kernels accept.
constexpr std::uint32_t kMaxCodecBlock = 4096;

/// Bytes of a block-format payload of n elements (scales + codes, padded to 4).
std::size_t block_payload_bytes(BlockFormat format, std::uint32_t block, std::size_t n) noexcept;

/// Encodes n values (in[i] + add[i] when add is non-null) into `out`
/// (block_payload_bytes bytes, padding zeroed); writes value - decoded to `residual` if non-null.
void block_encode(const BlockCodecParams& p, const float* in, const float* add, std::size_t n,
                  std::uint8_t* out, float* residual) noexcept;

/// Decodes a block-format payload of n elements into out (store) or out += (accumulate).
void block_decode(BlockFormat format, std::uint32_t block, const std::uint8_t* in, std::size_t n, float* out,
                  bool accumulate) noexcept;

/// 16-bit float formats.
enum class HalfFormat : std::uint8_t { fp16, bf16 };

/// Bytes of an fp16/bf16 payload of n elements (2n, padded to 4).
std::size_t half_payload_bytes(std::size_t n) noexcept;
/// Encodes n values (+ add) to little-endian 16-bit floats, round to nearest even.
void half_encode(HalfFormat f, const float* in, const float* add, std::size_t n, std::uint8_t* out,
                 float* residual) noexcept;
/// half_encode without the payload's padding: exactly 2n bytes, so `out` may be a caller's
/// array of n fp16/bf16 values (the narrowing of a compressed all-reduce's f32 result).
void half_narrow(HalfFormat f, const float* in, const float* add, std::size_t n, std::uint8_t* out,
                 float* residual) noexcept;
/// Decodes (or accumulates) n 16-bit floats (from any 2-byte aligned or unaligned array).
void half_decode(HalfFormat f, const std::uint8_t* in, std::size_t n, float* out, bool accumulate) noexcept;

/// Bytes of a top-k payload with k entries: k u32 indices then k f32 values.
std::size_t topk_payload_bytes(std::size_t k) noexcept;
/// Writes the k entries of largest magnitude of (in + add) (NaN counts as largest; equal
/// magnitudes: the lower index wins), indices ascending. residual = value with the chosen
/// entries zeroed. Requires 1 <= k <= n.
void topk_encode(const float* in, const float* add, std::size_t n, std::size_t k, std::uint8_t* out,
                 float* residual);
/// Scatters (or scatter-adds) a top-k payload into out[0..n). Returns false, having
/// written nothing, when an index is >= n or the indices are not strictly ascending.
bool topk_decode(const std::uint8_t* in, std::size_t n, std::size_t k, float* out, bool accumulate) noexcept;

/// OCP fp8 E4M3 (bias 7, no inf, 0x7f/0xff NaN) / E5M2 (bias 15, IEEE-like) bits of
/// v, round to nearest even, saturating to the largest finite value (448 / 57344;
/// infinities too). NaN gives 0x7f in both formats. Bit for bit CUDA's
/// __nv_cvt_float_to_fp8(v, __NV_SATFINITE, ...) (kernels/host/fp8.hpp).
std::uint8_t float_to_fp8(float v, BlockFormat format) noexcept;
/// The value of fp8 bits (exact).
float fp8_to_float(std::uint8_t bits, BlockFormat format) noexcept;

/// Name of the instruction set the codec loops run with ("avx2" or "baseline").
/// kernels::force_portable_path(true) (reduce.hpp) selects the baseline loops here too.
const char* codec_path() noexcept;

}  // namespace braid::kernels
