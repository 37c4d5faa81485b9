// braid host kernels: element-wise reduction and the helpers around it.
//
// Depends on nothing but braid/types.hpp. f16, bf16, f8e4m3 and f8e5m2 are widened to
// f32 for the arithmetic and rounded back to nearest-even (fp8: saturating to the largest
// finite value, NaN -> 0x7f, as CUDA's satfinite conversion); integer arithmetic wraps. Floating
// min/max propagate NaN (if either input is NaN the result is NaN).
#pragma once

#include <braid/types.hpp>

#include <cstddef>
#include <cstdint>

namespace braid::kernels {

/// dst[i] = a[i] (op) b[i] for i < n. `avg` reduces as `sum` (the division happens
/// once, in divide()). dst may alias a or b exactly (in-place); other overlaps are
/// not allowed. dtype/op must be valid enum values.
void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b,
            std::size_t n) noexcept;

/// buf[i] = buf[i] / divisor, for finishing `avg`. Floats divide in their own
/// precision (f16/bf16/fp8 in f32, rounded back); integers truncate toward zero.
void divide(DataType dtype, void* buf, std::size_t n, int divisor) noexcept;

/// dst[i] = src[i] * factor for i < n, the input scaling of ReduceOp::premul_sum. Floats
/// multiply in their own precision (f16/bf16/fp8 in f32 with the factor as a float,
/// rounded back once); integers multiply by the factor converted to int64 (the caller checks that
/// it is integral and fits the type), wrapping. dst may equal src.
void scale(DataType dtype, void* dst, const void* src, std::size_t n, double factor) noexcept;

/// dst[i] = a[i] + scale(b[i]): premul_sum's first sum of this rank's own input `b` (the
/// same bits as scale() into a temporary, then reduce(sum), without the temporary's pass).
/// dst may alias a or b exactly.
void reduce_scaled(DataType dtype, void* dst, const void* a, const void* b, std::size_t n, double factor) noexcept;

/// IEEE binary16 bits -> float (exact).
float half_to_float(std::uint16_t h) noexcept;
/// float -> IEEE binary16 bits, round to nearest even; overflow -> inf; NaN stays NaN.
std::uint16_t float_to_half(float f) noexcept;
/// bfloat16 bits -> float (exact).
float bf16_to_float(std::uint16_t h) noexcept;
/// float -> bfloat16 bits, round to nearest even; NaN stays (quiet) NaN.
std::uint16_t float_to_bf16(float f) noexcept;

/// Name of the code path reduce() uses on this CPU for f16 ("f16c" or "scalar"), for
/// logs and benchmarks.
const char* half_path() noexcept;

/// Makes reduce()/divide() take the portable code paths (baseline-ISA loops, scalar f16
/// conversions) even where the CPU offers AVX2/F16C (true), or go back to the CPU's best
/// paths (false); half_path() then says "scalar". For tests and benchmarks: the paths give
/// bit-identical results (except the payload of a NaN computed from two NaNs). Atomic,
/// but meant to be set while no reduction is running.
void force_portable_path(bool on) noexcept;

}  // namespace braid::kernels
