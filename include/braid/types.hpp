// braid — element types, reduction operations and small enums shared by the whole API.
#pragma once

#include <braid/export.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace braid {

/// Element type of a buffer handed to a collective.
///
/// f16, bf16 and the two fp8 types are reduced in f32 and rounded back to nearest-even
/// after every arithmetic step (a ring over n ranks rounds n-1 times). The fp8 types are
/// OCP FP8 (as torch.float8_e4m3fn / torch.float8_e5m2 and CUDA's __nv_fp8_e4m3 /
/// __nv_fp8_e5m2); rounding back saturates to the largest finite value (CUDA's
/// __NV_SATFINITE) and keeps NaN a NaN. Compression codecs take only f32, f16 and bf16
/// input: an fp8 collective never compresses (docs/codecs.md).
enum class DataType : std::uint8_t {
  f32 = 0,  ///< IEEE-754 binary32.
  f64,      ///< IEEE-754 binary64.
  f16,      ///< IEEE-754 binary16.
  bf16,     ///< bfloat16 (upper half of a binary32).
  i8,       ///< Two's-complement 8-bit signed integer.
  u8,       ///< 8-bit unsigned integer.
  i32,      ///< Two's-complement 32-bit signed integer.
  i64,      ///< Two's-complement 64-bit signed integer.
  f8e4m3,   ///< OCP FP8 E4M3 ("fn"): bias 7, no infinities, NaN = S.1111.111, max ±448.
  f8e5m2,   ///< OCP FP8 E5M2: bias 15, IEEE-like with ±inf and NaNs, max finite ±57344.
};

/// Number of element types; valid DataType values are [0, kNumDataTypes).
inline constexpr int kNumDataTypes = 10;

/// Reduction applied element by element.
///
/// `avg` is the sum divided by the number of ranks; on integer types the
/// division truncates toward zero (as NCCL's ncclAvg). Integer sums wrap
/// modulo 2^bits, like the hardware.
///
/// `premul_sum` is NCCL's ncclRedOpCreatePreMulSum: every rank multiplies its input by
/// the call's factor (the `scale` of AllreduceOptions, ReduceOptions and
/// ReduceScatterOptions) before the sum, so the result is sum over ranks of scale * x.
/// Scaling first is what keeps an f16 gradient sum in range when the factor is 1/world
/// (what DDP and FSDP fold into the reduction). Floating types multiply in their own
/// precision (f16/bf16 in f32, rounded back once); integer types need an integral factor
/// that fits the type, and multiply with wrap-around.
enum class ReduceOp : std::uint8_t {
  sum = 0,     ///< a + b
  prod,        ///< a * b
  min,         ///< min(a, b); NaN propagates for floating types.
  max,         ///< max(a, b); NaN propagates for floating types.
  avg,         ///< sum / world size.
  premul_sum,  ///< sum of scale * x (the factor is the call's `scale` option).
};

/// Number of reduction operations; valid ReduceOp values are [0, kNumReduceOps).
inline constexpr int kNumReduceOps = 6;

/// All-reduce algorithm choice. `automatic` lets the tuner decide (docs/cost-model.md).
enum class Algorithm : std::uint8_t {
  automatic = 0,  ///< Let braid choose.
  ring,           ///< Reduce-scatter + all-gather around a ring (bandwidth-optimal).
  tree,           ///< Double binary tree: two complementary trees, each carrying half the data.
  rhd,            ///< Recursive halving-doubling (Rabenseifner), any world size.
  hierarchical,   ///< Intra-host reduce-scatter, inter-host all-reduce per shard, intra-host all-gather.
};

/// Number of Algorithm values (automatic included); valid values are [0, kNumAlgorithms).
/// Which collectives offer which algorithm: docs/algorithms.md (and
/// braid._C.algorithm_table() in Python).
inline constexpr int kNumAlgorithms = 5;

/// Where a collective's buffers live (CollectiveOptions::memory).
///
/// `automatic` asks the device runtime (a pointer-attribute query; host memory when
/// braid has no device backend). Device buffers (cudaMalloc, managed memory) make the
/// call stream-ordered on CollectiveOptions::stream (docs/gpu.md).
enum class MemoryKind : std::uint8_t {
  automatic = 0,  ///< Ask the runtime about each buffer.
  host,           ///< Host memory (pageable or pinned): no query.
  device,         ///< Memory of the communicator's GPU (still queried, to check the GPU).
};

/// Size in bytes of one element of `t`; 0 for a value outside the enum.
BRAID_API std::size_t dtype_size(DataType t) noexcept;

/// True for f32, f64, f16, bf16, f8e4m3 and f8e5m2.
BRAID_API bool is_floating(DataType t) noexcept;

/// Canonical lower-case name ("f32", "bf16", ...); "invalid" outside the enum.
BRAID_API std::string_view to_string(DataType t) noexcept;

/// Canonical lower-case name ("sum", "avg", ...); "invalid" outside the enum.
BRAID_API std::string_view to_string(ReduceOp op) noexcept;

/// Canonical lower-case name ("auto", "ring", ...); "invalid" outside the enum.
BRAID_API std::string_view to_string(Algorithm a) noexcept;

/// "automatic", "host" or "device"; "invalid" outside the enum.
BRAID_API std::string_view to_string(MemoryKind m) noexcept;

/// Parses a type name. Accepts the canonical names and the nccl-tests/PyTorch
/// spellings: float, half, bfloat16, double, int8, uint8, int32, int64, f8e4m3,
/// f8e5m2 (also float32, float16, float64, int, char, fp8e4m3, float8_e4m3fn, e4m3,
/// fp8e5m2, float8_e5m2, e5m2...). Empty when unknown.
BRAID_API std::optional<DataType> parse_dtype(std::string_view name) noexcept;

/// Parses an operation name (sum, prod, min, max, avg, premul_sum). Empty when unknown.
BRAID_API std::optional<ReduceOp> parse_op(std::string_view name) noexcept;

/// Parses an algorithm name (auto, ring, tree, rhd, hier/hierarchical). Empty when unknown.
BRAID_API std::optional<Algorithm> parse_algorithm(std::string_view name) noexcept;

}  // namespace braid
