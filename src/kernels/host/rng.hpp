// Counter-based random numbers for stochastic rounding (docs/codecs.md, "RNG").
//
// Philox4x32-10 (Salmon et al., SC'11; the generator of Random123 and of cuRAND's
// curand_Philox4x32_10): a pure function of a 128-bit counter and a 64-bit key, so any
// element's random number can be computed independently, in any order, on CPU or GPU,
// and gives the same bits. Header-only so that the codec kernels inline it; a CUDA port
// is these lines with __umulhi.
//
// How braid keys it (the contract a CUDA kernel must reproduce):
//   key     = (lo32(seed), hi32(seed))
//   counter = (lo32(e >> 2), hi32(e >> 2), lo32(step), hi32(step))   e = global element offset
//   word    = philox4x32_10(counter, key)[e & 3]
//   u       = (word >> 8) * 2^-24                                      exact float in [0, 1)
#pragma once

#include <cstdint>

namespace braid::kernels {

/// Four 32-bit words: a Philox counter or output block.
struct Philox4 {
  std::uint32_t v[4];  ///< Words 0..3.
};

/// Philox4x32 with 10 rounds, the Random123 reference definition.
inline Philox4 philox4x32_10(Philox4 ctr, std::uint32_t k0, std::uint32_t k1) noexcept {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * ctr.v[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * ctr.v[2];
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
  }
  return ctr;
}

/// The four random words for elements 4*group .. 4*group+3 at `step` under `seed`.
inline Philox4 rounding_words(std::uint64_t seed, std::uint64_t step, std::uint64_t group) noexcept {
  return philox4x32_10(Philox4{{static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32),
                                static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(step >> 32)}},
                       static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

/// Uniform float in [0, 1) with 24 random bits (exactly representable) from one word.
inline float uniform24(std::uint32_t word) noexcept {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

/// The uniform number of element `e` (global offset) at `step` under `seed`.
inline float rounding_uniform(std::uint64_t seed, std::uint64_t step, std::uint64_t e) noexcept {
  return uniform24(rounding_words(seed, step, e >> 2).v[e & 3]);
}

/// Derives an independent stream seed for one (rank, phase) from the user's seed, so that
/// ranks rounding the same element at the same step do not share random numbers:
/// mix(mix(seed) ^ (rank << 32 | phase)), mix = the SplitMix64 step (add 0x9E3779B97F4A7C15,
/// then the two xor-shift-multiply rounds and the final xor-shift).
inline std::uint64_t stream_seed(std::uint64_t seed, std::uint32_t rank, std::uint32_t phase) noexcept {
  auto mix = [](std::uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  return mix(mix(seed) ^ ((static_cast<std::uint64_t>(rank) << 32) | phase));
}

}  // namespace braid::kernels
