// Bit casts and inlining attributes shared by the host kernels (reduce.cpp,
// codec_kernels.cpp). always_inline so that the helpers also inline into the
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

}  // namespace braid::kernels::bits
