// Bit casts, selects and inlining attributes shared by the host kernels (reduce.cpp,
// codec_kernels.cpp, fp8.hpp). always_inline so that the helpers also inline into the
// target("avx2") copies of the loops, where a call would stop vectorisation.
#pragma once

#include <cstdint>
#include <cstring>

#define BRAID_INLINE inline __attribute__((always_inline))
#define BRAID_NOINLINE __attribute__((noinline))

namespace braid::kernels::bits {

/// The bits of a float.
BRAID_INLINE std::uint32_t f2u(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
/// The float with these bits.
BRAID_INLINE float u2f(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Bitwise select, c ? a : b, with both arms computed: under the default -ftrapping-math
/// GCC will not if-convert a ?: whose arm holds a float operation, and then does not
/// vectorise the loop; a mask keeps it unconditional.
BRAID_INLINE std::uint32_t usel(bool c, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return (a & m) | (b & ~m);
}

/// rint(v) for |v| <= 2^22 under the default rounding mode (nearest even), without a
/// libm call: (v + 1.5*2^23) - 1.5*2^23. Vectorises at SSE2.
constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
BRAID_INLINE float rne(float v) noexcept { return (v + kMagic) - kMagic; }

}  // namespace braid::kernels::bits
