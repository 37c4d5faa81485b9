// braid CUDA kernels: the device twins of src/kernels/host (reduce.hpp, codec_kernels.hpp).
//
// Internal header: it names no CUDA header (the stream type is CUDA's own opaque
// `CUstream_st*`, which is what cudaStream_t is), so C++ code that does not touch CUDA can
// include it. Built only when BRAID_HAVE_CUDA is 1 (braid/config.hpp).
//
// Contract (docs/kernels.md "CUDA kernels", docs/codecs.md):
// * Every launch wrapper takes a trivially copyable argument struct and a stream, checks its
//   arguments, enqueues its kernels on the stream and returns at once. The returned Status
//   is 0 on success, else a cudaError_t value (status_string() names it); arguments the
//   kernels cannot take give kInvalidValue before anything is launched.
// * All pointers are device pointers (or managed). f32/f64/integer arrays must be naturally
//   aligned; payload byte buffers may have any alignment. 16-byte vector loads and stores
//   are used where the pointers allow it, scalar ones elsewhere: any count, any offset.
// * Results are bit for bit those of the host kernels (codecs: every byte of the payload,
//   the residuals and the decoded values; reductions: every value, except the payload bits
//   of a NaN produced from two NaN inputs), because the kernels use the host's recipes with
//   IEEE f32 operations in the same order and no FMA contraction (compiled with
//   --fmad=false).
// * Aliasing as on the host: dst may equal a or b exactly; an encoder's residual may equal
//   its in/add exactly; out payloads must not overlap inputs.
#pragma once

#include "kernels/host/codec_kernels.hpp"

#include <braid/types.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

struct CUstream_st;

namespace braid::kernels::cuda {

/// A CUDA stream (the same type as cudaStream_t); nullptr is the legacy default stream.
using Stream = CUstream_st*;

/// 0 on success, else a cudaError_t value.
using Status = int;
/// cudaErrorInvalidValue: arguments refused before launching anything.
constexpr Status kInvalidValue = 1;
/// cudaErrorNotSupported: the operation does not exist for this codec.
constexpr Status kNotSupported = 801;

/// Name and description of a status ("cudaErrorInvalidValue: invalid argument").
std::string status_string(Status s);

/// Number of usable CUDA devices. 0 when there is no driver, no device or the runtime
/// cannot start; then *reason (if given) says why, e.g. "CUDA driver not found (this host
/// has no GPU driver): cudaErrorInsufficientDriver", and *absent (if given) is true when
/// the host simply has no GPU (no driver, or no device) and false when a GPU stack is
/// there but failed (which tests must report, not skip). Never throws, never aborts.
int device_count(std::string* reason = nullptr, bool* absent = nullptr) noexcept;

/// Element-wise reduction dst[i] = a[i] (op) b[i], as kernels::reduce (avg reduces as sum).
struct ReduceArgs {
  DataType dtype = DataType::f32;  ///< Element type.
  ReduceOp op = ReduceOp::sum;     ///< Operation.
  void* dst = nullptr;             ///< Output; may equal a or b.
  const void* a = nullptr;         ///< First operand.
  const void* b = nullptr;         ///< Second operand.
  std::size_t n = 0;               ///< Elements.
};
/// Enqueues the reduction.
Status reduce(const ReduceArgs& args, Stream stream) noexcept;

/// buf[i] /= divisor, as kernels::divide (finishes avg).
struct DivideArgs {
  DataType dtype = DataType::f32;  ///< Element type.
  void* buf = nullptr;             ///< Values, in place.
  std::size_t n = 0;               ///< Elements.
  int divisor = 1;                 ///< Divisor (0 and 1 leave integers untouched, as on the host).
};
/// Enqueues the division.
Status divide(const DivideArgs& args, Stream stream) noexcept;

/// dst[i] = src[i] * factor, as kernels::scale (premul_sum's input scaling).
struct ScaleArgs {
  DataType dtype = DataType::f32;  ///< Element type.
  void* dst = nullptr;             ///< Output; may equal src.
  const void* src = nullptr;       ///< Input.
  std::size_t n = 0;               ///< Elements.
  double factor = 1.0;             ///< The factor (integral for integer types).
};
/// Enqueues the scaling.
Status scale(const ScaleArgs& args, Stream stream) noexcept;

/// dst[i] = a[i] + scale(b[i]), as kernels::reduce_scaled (premul_sum's first sum of a
/// rank's own input b). dst may equal a or b.
struct ReduceScaledArgs {
  DataType dtype = DataType::f32;  ///< Element type.
  void* dst = nullptr;             ///< Output.
  const void* a = nullptr;         ///< Operand added as it is.
  const void* b = nullptr;         ///< Operand scaled first.
  std::size_t n = 0;               ///< Elements.
  double factor = 1.0;             ///< The factor (integral for integer types).
};
/// Enqueues the scaled reduction.
Status reduce_scaled(const ReduceScaledArgs& args, Stream stream) noexcept;

/// A codec as the device kernels see it (compression::CodecSpec minus names and topk).
struct DeviceCodec {
  /// Family.
  enum class Kind : std::uint8_t {
    raw,   ///< "none": little-endian f32.
    fp16,  ///< IEEE binary16, RNE.
    bf16,  ///< bfloat16, RNE.
    block  ///< int8/int4/fp8e4m3/fp8e5m2/sign1 with per-block scales (see `block`).
  };
  Kind kind = Kind::raw;    ///< Family.
  BlockCodecParams block;   ///< Block formats: format, block size, rounding, seed, step, offset.
};

/// Payload bytes of n values (block_payload_bytes / half_payload_bytes / 4n).
std::size_t payload_bytes(const DeviceCodec& codec, std::size_t n) noexcept;

/// Encode value = in[i] (+ add[i]) into `out`; residual (optional) = value - decoded.
struct EncodeArgs {
  DeviceCodec codec;             ///< Codec; block.step/offset key stochastic rounding.
  const float* in = nullptr;     ///< Input values.
  const float* add = nullptr;    ///< Optional addend (error feedback residual), or nullptr.
  std::size_t n = 0;             ///< Elements.
  std::uint8_t* out = nullptr;   ///< Payload, payload_bytes(codec, n) bytes (padding zeroed).
  float* residual = nullptr;     ///< Optional residual output; may equal in or add.
  /// Block formats: values per frame of a framed payload (compression::encode_framed's
  /// layout: one payload per `frame` values, end to end, the last one shorter), a multiple
  /// of the block; 0 (or at least n): one payload. One launch encodes every frame, with
  /// the stochastic-rounding keys of the whole range (block.offset + i). Element-wise
  /// formats ignore it (their frames of a multiple of 8 values are one payload).
  std::size_t frame = 0;
};
/// Enqueues the encoder (as compression::encode / encode_add_feedback on the host, or
/// encode_framed with `frame`).
Status encode(const EncodeArgs& args, Stream stream) noexcept;

/// Decode a payload of n values into out (store) or out += decoded (accumulate).
struct DecodeArgs {
  DeviceCodec codec;                 ///< Codec.
  const std::uint8_t* in = nullptr;  ///< Payload.
  std::size_t n = 0;                 ///< Elements.
  float* out = nullptr;              ///< Output.
  bool accumulate = false;           ///< Add into out instead of storing.
  std::size_t frame = 0;             ///< As EncodeArgs::frame: one launch decodes every frame.
};
/// Enqueues the decoder.
Status decode(const DecodeArgs& args, Stream stream) noexcept;

/// One step of a compressed ring: acc = decode(in_payload) + local; with error feedback
/// value = acc + residual, else value = acc; out_payload = encode(value); residual =
/// value - decode(out_payload). Same codec on both sides. Bit for bit the host sequence
/// decode_accumulate(in_payload, acc := copy of local) then encode_add_feedback(acc,
/// residual) (or encode(acc)).
struct DecodeReduceEncodeArgs {
  DeviceCodec codec;                         ///< Codec of both payloads.
  const std::uint8_t* in_payload = nullptr;  ///< Received payload.
  const float* local = nullptr;              ///< This rank's contribution.
  std::size_t n = 0;                         ///< Elements.
  float* acc_out = nullptr;                  ///< Optional: receives acc; may equal local.
  float* residual = nullptr;                 ///< Optional error feedback residual (in/out).
  std::uint8_t* out_payload = nullptr;       ///< Encoded value; must not overlap the rest.
};
/// Enqueues the fused step (one pass over the data per scale block).
Status decode_reduce_encode(const DecodeReduceEncodeArgs& args, Stream stream) noexcept;

/// Scratch bytes topk_encode needs for n values and k entries (0 when the query fails,
/// e.g. without a device).
std::size_t topk_workspace_bytes(std::size_t n, std::size_t k) noexcept;

/// Top-k encode, as kernels::topk_encode: the k entries of largest |bits| of in (+ add),
/// ties to the lower index, indices ascending; residual = value with them zeroed.
/// 1 <= k <= n < 2^31.
struct TopkEncodeArgs {
  const float* in = nullptr;     ///< Input values.
  const float* add = nullptr;    ///< Optional addend.
  std::size_t n = 0;             ///< Elements.
  std::size_t k = 0;             ///< Entries kept.
  std::uint8_t* out = nullptr;   ///< 8k bytes: k u32 indices, then k f32 values.
  float* residual = nullptr;     ///< Optional residual; may equal in or add.
  void* workspace = nullptr;     ///< topk_workspace_bytes(n, k) bytes of device memory.
  std::size_t workspace_bytes = 0;  ///< Its size.
};
/// Enqueues the top-k encoder (a stable radix sort of the keys, then a sort of k indices).
Status topk_encode(const TopkEncodeArgs& args, Stream stream) noexcept;

/// Top-k decode (scatter) or decode-accumulate (sparse add). The payload is validated on
/// the device first (indices < n, strictly ascending); when it is bad nothing is written
/// and *status becomes 1 (0 when good). Read `status` after the stream has run. `rejected`,
/// when given, is set to 1 too on a bad payload and never cleared: one word that a host
/// can read after a whole program of decodes has run, with no host function between them.
struct TopkDecodeArgs {
  const std::uint8_t* in = nullptr;  ///< Payload (8k bytes).
  std::size_t n = 0;                 ///< Elements of the output.
  std::size_t k = 0;                 ///< Entries in the payload.
  float* out = nullptr;              ///< Output.
  bool accumulate = false;           ///< Sparse add instead of zero-fill and scatter.
  int* status = nullptr;             ///< Device int: 0 good, 1 rejected.
  int* rejected = nullptr;           ///< Optional sticky int (host-mapped): set to 1 on a bad payload.
};
/// Enqueues the validation and the scatter.
Status topk_decode(const TopkDecodeArgs& args, Stream stream) noexcept;

static_assert(std::is_trivially_copyable_v<ReduceArgs> && std::is_trivially_copyable_v<DivideArgs> &&
                  std::is_trivially_copyable_v<EncodeArgs> && std::is_trivially_copyable_v<DecodeArgs> &&
                  std::is_trivially_copyable_v<DecodeReduceEncodeArgs> &&
                  std::is_trivially_copyable_v<TopkEncodeArgs> && std::is_trivially_copyable_v<TopkDecodeArgs>,
              "kernel argument structs are passed by value to kernels");

}  // namespace braid::kernels::cuda
