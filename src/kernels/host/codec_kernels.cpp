// braid host codec kernels (formats: docs/codecs.md).
//
// Shape of the code, as in reduce.cpp: each loop is an always_inline template, compiled
// twice (x86-64 baseline and target("avx2")), and one CPUID probe picks the copy. No FMA
// is enabled in either copy, so both compute the same bits, and so will a CUDA kernel
// that uses __fmul_rn/__fadd_rn/__fdiv_rn in the order written here.
//
// * Round to nearest even without a libm call: for |v| <= 2^22, (v + 1.5*2^23) - 1.5*2^23
//   is rint(v) under the default rounding mode; it vectorises at SSE2.
// * Block absmax is an integer max over the |bit pattern| (sign cleared): monotone in
//   magnitude for finite values and larger for inf and NaN, so one max both finds the
//   scale and detects a non-finite block.
// * Encoders stage (in + add) in a block-sized stack buffer only when there is an `add`,
//   so the residual may alias either input.
#include "kernels/host/codec_kernels.hpp"
#include "kernels/host/bits.hpp"
#include "kernels/host/fp8.hpp"

#include "kernels/host/reduce.hpp"
#include "kernels/host/rng.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define BRAID_CODEC_X86 1
#include <immintrin.h>
#define BRAID_TARGET_AVX2 __attribute__((target("avx2")))
#define BRAID_TARGET_AVX2_F16C __attribute__((target("avx2,f16c")))
#else
#define BRAID_CODEC_X86 0
#endif


#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "braid codecs write little-endian scales and indices with memcpy; port the stores for big-endian hosts"
#endif

namespace braid::kernels {
namespace {

using bits::f2u;
using bits::u2f;
BRAID_INLINE float load_f32(const std::uint8_t* p) noexcept {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
BRAID_INLINE void store_f32(std::uint8_t* p, float f) noexcept { std::memcpy(p, &f, 4); }

using bits::rne;
using bits::usel;
BRAID_INLINE float fsel(bool c, float a, float b) noexcept { return u2f(usel(c, f2u(a), f2u(b))); }

constexpr std::uint32_t kNanBits = 0x7fc00000u;  // the scale of a non-finite block
constexpr float kTinyAbsmax = 0x1p-100f;          // smaller blocks encode as zero

// |bits| max: >= 0x7f800000 means the block holds inf or NaN.
BRAID_INLINE std::uint32_t abs_bits_max(const float* y, std::uint32_t len) noexcept {
  std::uint32_t m = 0;
  for (std::uint32_t i = 0; i < len; ++i) {
    const std::uint32_t a = f2u(y[i]) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  return m;
}

using fp8::Fp8;

// ---------------------------------------------------------------------------------------
// OCP Microscaling (MX v1.0): blocks of 32 values share an E8M0 scale X = 2^k (one byte,
// k + 127; 0xff is NaN), k = floor(log2(absmax)) - emax of the element type, clamped to
// [-127, 127]; each element is value / X in E4M3 (mxfp8, emax 8) or E2M1 (mxfp4, emax 2),
// round to nearest even, clamped to the largest normal.

constexpr bool is_mx(BlockFormat f) noexcept { return f == BlockFormat::mxfp8 || f == BlockFormat::mxfp4; }
// Bytes of one block's scale: an f32, or MX's E8M0 byte.
constexpr std::size_t scale_bytes(BlockFormat f) noexcept { return is_mx(f) ? 1 : 4; }
template <BlockFormat F>
constexpr int kMxEmax = F == BlockFormat::mxfp8 ? 8 : 2;

// 2^k as an f32, for k in [-127, 127] (2^-127 is subnormal).
BRAID_INLINE float pow2(int k) noexcept {
  return k >= -126 ? u2f(static_cast<std::uint32_t>(k + 127) << 23) : u2f(0x00400000u);
}

// The shared exponent k of a finite block from its |bits| max m. A zero or subnormal
// absmax is below 2^-126, so its floor(log2) - emax is under -127: the clamp's -127.
template <BlockFormat F>
BRAID_INLINE int mx_exponent(std::uint32_t m) noexcept {
  const int biased = static_cast<int>(m >> 23);
  const int k = biased - 127 - kMxEmax<F>;
  return biased == 0 || k < -127 ? -127 : k;  // at most 127 - emax: no upper clamp
}

// The value of an E8M0 scale byte.
BRAID_INLINE float e8m0_value(std::uint8_t b) noexcept { return b == 0xffu ? u2f(kNanBits) : pow2(b - 127); }

// E2M1 (magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; sign in bit 3): the nearest, ties to the
// even code, clamped to 6. Each comparison is one midpoint; a tie goes up exactly where
// the code above it is even.
BRAID_INLINE std::uint32_t fp4_encode(float v) noexcept {
  const std::uint32_t u = f2u(v);
  const float a = u2f(u & 0x7fffffffu);
  const std::uint32_t c = static_cast<std::uint32_t>(a > 0.25f) + static_cast<std::uint32_t>(a >= 0.75f) +
                          static_cast<std::uint32_t>(a > 1.25f) + static_cast<std::uint32_t>(a >= 1.75f) +
                          static_cast<std::uint32_t>(a > 2.5f) + static_cast<std::uint32_t>(a >= 3.5f) +
                          static_cast<std::uint32_t>(a > 5.0f);
  return c | ((u >> 28) & 8u);
}
BRAID_INLINE float fp4_decode(std::uint32_t c) noexcept {
  // Magnitude 2^(e-1) * (1 + m/2) for exponent field e > 0, m/2 for e = 0.
  const std::uint32_t e = (c >> 1) & 3u, m = c & 1u;
  const float mag = fsel(e == 0, 0.5f * static_cast<float>(m), u2f((e + 126u) << 23 | m << 22));
  return u2f(f2u(mag) | (c & 8u) << 28);
}

// ---------------------------------------------------------------------------------------
// Block encoders. `y` holds the block's len values; `codes` points at the block's codes.

template <BlockFormat F>
constexpr float kLevels = F == BlockFormat::int8 ? 127.0f : 7.0f;

template <BlockFormat F, bool SR, bool FB>
BRAID_INLINE void encode_int_block(const float* y, std::uint32_t len, float scale, float inv, std::uint8_t* codes,
                                   float* res, const BlockCodecParams& p, std::uint64_t g0) noexcept {
  constexpr float L = kLevels<F>;
  alignas(64) std::int8_t q8[F == BlockFormat::int4 ? kMaxCodecBlock : 1];
  std::int8_t* qdst = F == BlockFormat::int4 ? q8 : reinterpret_cast<std::int8_t*>(codes);
  if constexpr (SR) {
    // Random numbers for whole groups of 4 elements (one Philox call each), then the
    // block's window into them.
    alignas(64) float upad[kMaxCodecBlock + 8];
    const std::uint64_t first = g0 >> 2;
    const std::uint32_t groups = static_cast<std::uint32_t>(((g0 + len + 3) >> 2) - first);
    for (std::uint32_t j = 0; j < groups; ++j) {
      const Philox4 w = rounding_words(p.seed, p.step, first + j);
      upad[4 * j] = uniform24(w.v[0]);
      upad[4 * j + 1] = uniform24(w.v[1]);
      upad[4 * j + 2] = uniform24(w.v[2]);
      upad[4 * j + 3] = uniform24(w.v[3]);
    }
    const float* u = upad + (g0 & 3);
    for (std::uint32_t i = 0; i < len; ++i) {
      const float v = y[i] * inv;
      const float r = rne(v);
      const float f = fsel(r > v, r - 1.0f, r);  // floor(v)
      float q = fsel(u[i] < v - f, f + 1.0f, f);
      q = q > L ? L : (q < -L ? -L : q);
      qdst[i] = static_cast<std::int8_t>(static_cast<std::int32_t>(q));
      if constexpr (FB) res[i] = y[i] - q * scale;
    }
  } else {
    for (std::uint32_t i = 0; i < len; ++i) {
      float q = rne(y[i] * inv);
      q = q > L ? L : (q < -L ? -L : q);
      qdst[i] = static_cast<std::int8_t>(static_cast<std::int32_t>(q));
      if constexpr (FB) res[i] = y[i] - q * scale;
    }
  }
  if constexpr (F == BlockFormat::int4) {
    const std::uint32_t pairs = len / 2;
    for (std::uint32_t j = 0; j < pairs; ++j) {
      codes[j] = static_cast<std::uint8_t>((static_cast<std::uint8_t>(q8[2 * j]) & 0x0fu) |
                                           (static_cast<std::uint8_t>(q8[2 * j + 1]) << 4));
    }
    if (len & 1u) codes[pairs] = static_cast<std::uint8_t>(q8[len - 1]) & 0x0fu;
  }
}

template <BlockFormat F, bool FB>
BRAID_INLINE void encode_fp8_block(const float* y, std::uint32_t len, float scale, float inv, std::uint8_t* codes,
                                   float* res) noexcept {
  for (std::uint32_t i = 0; i < len; ++i) {
    const std::uint32_t c = Fp8<F>::encode(y[i] * inv);
    codes[i] = static_cast<std::uint8_t>(c);
    if constexpr (FB) res[i] = y[i] - Fp8<F>::decode(c) * scale;
  }
}

// MX elements: value * 2^-k in the element type; the residual against element * 2^k.
template <BlockFormat F, bool FB>
BRAID_INLINE void encode_mx_block(const float* y, std::uint32_t len, float scale, float inv, std::uint8_t* codes,
                                  float* res) noexcept {
  if constexpr (F == BlockFormat::mxfp8) {
    using E = Fp8<BlockFormat::fp8e4m3>;
    for (std::uint32_t i = 0; i < len; ++i) {
      const std::uint32_t c = E::encode(y[i] * inv);
      codes[i] = static_cast<std::uint8_t>(c);
      if constexpr (FB) res[i] = y[i] - E::decode(c) * scale;
    }
  } else {
    // Codes first (a loop of compares the compiler vectorises), then the nibbles packed.
    alignas(64) std::uint8_t q[kMaxCodecBlock];
    for (std::uint32_t i = 0; i < len; ++i) {
      const std::uint32_t c = fp4_encode(y[i] * inv);
      q[i] = static_cast<std::uint8_t>(c);
      if constexpr (FB) res[i] = y[i] - fp4_decode(c) * scale;
    }
    const std::uint32_t pairs = len / 2;
    for (std::uint32_t j = 0; j < pairs; ++j) codes[j] = static_cast<std::uint8_t>(q[2 * j] | q[2 * j + 1] << 4);
    if (len & 1u) codes[pairs] = q[len - 1];
  }
}

// Sum of |y| in the documented order: lane k = elements i with i % 8 == k in increasing i,
// then ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)).
BRAID_INLINE float abs_sum8(const float* y, std::uint32_t len) noexcept {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::uint32_t i = 0;
  for (; i + 8 <= len; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += u2f(f2u(y[i + k]) & 0x7fffffffu);
  for (int k = 0; i + k < len; ++k) s[k] += u2f(f2u(y[i + k]) & 0x7fffffffu);
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

template <bool FB>
BRAID_INLINE void encode_sign_block(const float* y, std::uint32_t len, float mean, std::uint8_t* codes,
                                    float* res) noexcept {
  const std::uint32_t full = len / 8;
  for (std::uint32_t j = 0; j < full; ++j) {
    std::uint32_t b = 0;
    for (int k = 0; k < 8; ++k) b |= static_cast<std::uint32_t>(y[8 * j + k] < 0.0f) << k;
    codes[j] = static_cast<std::uint8_t>(b);
  }
  if (len % 8) {
    std::uint32_t b = 0;
    for (std::uint32_t k = 0; 8 * full + k < len; ++k) b |= static_cast<std::uint32_t>(y[8 * full + k] < 0.0f) << k;
    codes[full] = static_cast<std::uint8_t>(b);
  }
  if constexpr (FB) {
    const std::uint32_t m = f2u(mean);
    for (std::uint32_t i = 0; i < len; ++i) {
      const std::uint32_t neg = static_cast<std::uint32_t>(y[i] < 0.0f) << 31;
      res[i] = y[i] - u2f(m | neg);
    }
  }
}

BRAID_INLINE std::size_t codes_bytes(BlockFormat f, std::size_t n) noexcept {
  switch (f) {
    case BlockFormat::int4:
    case BlockFormat::mxfp4: return (n + 1) / 2;
    case BlockFormat::sign1: return (n + 7) / 8;
    default: return n;
  }
}

template <BlockFormat F, bool SR, bool FB>
BRAID_INLINE void encode_all(const BlockCodecParams& p, const float* in, const float* add, std::size_t n,
                             std::uint8_t* out, float* residual) noexcept {
  const std::size_t B = p.block;
  const std::size_t nb = (n + B - 1) / B;
  std::uint8_t* codes = out + scale_bytes(F) * nb;
  alignas(64) float tmp[kMaxCodecBlock];
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t start = b * B;
    const auto len = static_cast<std::uint32_t>(std::min(B, n - start));
    const float* y = in + start;
    if (add) {
      const float* a = add + start;
      for (std::uint32_t i = 0; i < len; ++i) tmp[i] = y[i] + a[i];
      y = tmp;
    }
    float* res = FB ? residual + start : nullptr;
    std::uint8_t* c = codes + codes_bytes(F, start);
    const std::uint32_t m = abs_bits_max(y, len);
    float scale;
    std::uint8_t e8m0 = 0xffu;  // MX: the scale byte
    if (m >= 0x7f800000u) {  // inf or NaN: the whole block decodes to NaN; residual dropped
      scale = u2f(kNanBits);
      std::memset(c, 0, codes_bytes(F, len));
      if constexpr (FB) std::memset(res, 0, sizeof(float) * len);
    } else if constexpr (is_mx(F)) {
      const int k = mx_exponent<F>(m);
      e8m0 = static_cast<std::uint8_t>(k + 127);
      scale = pow2(k);
      encode_mx_block<F, FB>(y, len, scale, pow2(-k), c, res);
    } else if constexpr (F == BlockFormat::sign1) {
      scale = abs_sum8(y, len) / static_cast<float>(len);
      encode_sign_block<FB>(y, len, scale, c, res);
    } else {
      const float absmax = u2f(m);
      if (absmax < kTinyAbsmax) {
        scale = 0.0f;
        std::memset(c, 0, codes_bytes(F, len));
        if constexpr (FB) std::memmove(res, y, sizeof(float) * len);
      } else if constexpr (F == BlockFormat::int8 || F == BlockFormat::int4) {
        scale = absmax / kLevels<F>;
        encode_int_block<F, SR, FB>(y, len, scale, kLevels<F> / absmax, c, res, p, p.offset + start);
      } else {
        scale = absmax / Fp8<F>::kMax;
        encode_fp8_block<F, FB>(y, len, scale, Fp8<F>::kMax / absmax, c, res);
      }
    }
    if constexpr (is_mx(F))
      out[b] = e8m0;
    else
      store_f32(out + 4 * b, scale);
  }
  const std::size_t used = scale_bytes(F) * nb + codes_bytes(F, n);
  std::memset(out + used, 0, block_payload_bytes(F, p.block, n) - used);
}

template <bool FB>
BRAID_INLINE void encode_fb(const BlockCodecParams& p, const float* in, const float* add, std::size_t n,
                            std::uint8_t* out, float* residual) noexcept {
  switch (p.format) {
    case BlockFormat::int8:
      if (p.stochastic)
        encode_all<BlockFormat::int8, true, FB>(p, in, add, n, out, residual);
      else
        encode_all<BlockFormat::int8, false, FB>(p, in, add, n, out, residual);
      return;
    case BlockFormat::int4:
      if (p.stochastic)
        encode_all<BlockFormat::int4, true, FB>(p, in, add, n, out, residual);
      else
        encode_all<BlockFormat::int4, false, FB>(p, in, add, n, out, residual);
      return;
    case BlockFormat::fp8e4m3: encode_all<BlockFormat::fp8e4m3, false, FB>(p, in, add, n, out, residual); return;
    case BlockFormat::fp8e5m2: encode_all<BlockFormat::fp8e5m2, false, FB>(p, in, add, n, out, residual); return;
    case BlockFormat::sign1: encode_all<BlockFormat::sign1, false, FB>(p, in, add, n, out, residual); return;
    case BlockFormat::mxfp8: encode_all<BlockFormat::mxfp8, false, FB>(p, in, add, n, out, residual); return;
    case BlockFormat::mxfp4: encode_all<BlockFormat::mxfp4, false, FB>(p, in, add, n, out, residual); return;
  }
}

BRAID_INLINE void encode_any(const BlockCodecParams& p, const float* in, const float* add, std::size_t n,
                             std::uint8_t* out, float* residual) noexcept {
  if (residual)
    encode_fb<true>(p, in, add, n, out, residual);
  else
    encode_fb<false>(p, in, add, n, out, nullptr);
}

// ---------------------------------------------------------------------------------------
// Block decoders.

template <bool ACC>
BRAID_INLINE void put(float* o, float v) noexcept {
  if constexpr (ACC)
    *o += v;
  else
    *o = v;
}

template <BlockFormat F, bool ACC>
BRAID_INLINE void decode_all(std::uint32_t block, const std::uint8_t* in, std::size_t n, float* out) noexcept {
  const std::size_t B = block;
  const std::size_t nb = (n + B - 1) / B;
  const std::uint8_t* codes = in + scale_bytes(F) * nb;
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t start = b * B;
    const auto len = static_cast<std::uint32_t>(std::min(B, n - start));
    const float s = is_mx(F) ? e8m0_value(in[b]) : load_f32(in + 4 * b);
    const std::uint8_t* c = codes + codes_bytes(F, start);
    float* o = out + start;
    if constexpr (F == BlockFormat::int8) {
      for (std::uint32_t i = 0; i < len; ++i)
        put<ACC>(o + i, static_cast<float>(static_cast<std::int8_t>(c[i])) * s);
    } else if constexpr (F == BlockFormat::int4) {
      const std::uint32_t pairs = len / 2;
      for (std::uint32_t j = 0; j < pairs; ++j) {
        const auto lo = static_cast<std::int8_t>(static_cast<std::uint8_t>(c[j] << 4)) >> 4;
        const auto hi = static_cast<std::int8_t>(c[j]) >> 4;
        put<ACC>(o + 2 * j, static_cast<float>(lo) * s);
        put<ACC>(o + 2 * j + 1, static_cast<float>(hi) * s);
      }
      if (len & 1u) {
        const auto lo = static_cast<std::int8_t>(static_cast<std::uint8_t>(c[pairs] << 4)) >> 4;
        put<ACC>(o + len - 1, static_cast<float>(lo) * s);
      }
    } else if constexpr (F == BlockFormat::sign1) {
      const std::uint32_t m = f2u(s);
      const std::uint32_t full = len / 8;
      for (std::uint32_t j = 0; j < full; ++j) {
        const std::uint32_t byte = c[j];
        for (int k = 0; k < 8; ++k) put<ACC>(o + 8 * j + k, u2f(m ^ (((byte >> k) & 1u) << 31)));
      }
      for (std::uint32_t i = 8 * full; i < len; ++i) put<ACC>(o + i, u2f(m ^ (((c[i / 8] >> (i % 8)) & 1u) << 31)));
    } else if constexpr (F == BlockFormat::mxfp8) {
      for (std::uint32_t i = 0; i < len; ++i) put<ACC>(o + i, Fp8<BlockFormat::fp8e4m3>::decode(c[i]) * s);
    } else if constexpr (F == BlockFormat::mxfp4) {
      const std::uint32_t pairs = len / 2;
      for (std::uint32_t j = 0; j < pairs; ++j) {
        put<ACC>(o + 2 * j, fp4_decode(c[j] & 0xfu) * s);
        put<ACC>(o + 2 * j + 1, fp4_decode(static_cast<std::uint32_t>(c[j]) >> 4) * s);
      }
      if (len & 1u) put<ACC>(o + len - 1, fp4_decode(c[pairs] & 0xfu) * s);
    } else {
      for (std::uint32_t i = 0; i < len; ++i) put<ACC>(o + i, Fp8<F>::decode(c[i]) * s);
    }
  }
}

template <bool ACC>
BRAID_INLINE void decode_any(BlockFormat f, std::uint32_t block, const std::uint8_t* in, std::size_t n,
                             float* out) noexcept {
  switch (f) {
    case BlockFormat::int8: decode_all<BlockFormat::int8, ACC>(block, in, n, out); return;
    case BlockFormat::int4: decode_all<BlockFormat::int4, ACC>(block, in, n, out); return;
    case BlockFormat::fp8e4m3: decode_all<BlockFormat::fp8e4m3, ACC>(block, in, n, out); return;
    case BlockFormat::fp8e5m2: decode_all<BlockFormat::fp8e5m2, ACC>(block, in, n, out); return;
    case BlockFormat::sign1: decode_all<BlockFormat::sign1, ACC>(block, in, n, out); return;
    case BlockFormat::mxfp8: decode_all<BlockFormat::mxfp8, ACC>(block, in, n, out); return;
    case BlockFormat::mxfp4: decode_all<BlockFormat::mxfp4, ACC>(block, in, n, out); return;
  }
}

// ---------------------------------------------------------------------------------------
// bf16 (portable, vectorises) and fp16 (F16C, or the scalar reference conversions).

BRAID_INLINE std::uint32_t f2bf(float f) noexcept {
  const std::uint32_t u = f2u(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (u | 0x00400000u) >> 16;
  return static_cast<std::int32_t>(u & 0x7fffffffu) > 0x7f800000 ? nan : rounded;
}

template <bool FB>
BRAID_INLINE void bf16_encode(const float* in, const float* add, std::size_t n, std::uint8_t* out,
                              float* residual) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float y = add ? in[i] + add[i] : in[i];
    const std::uint32_t h = f2bf(y);
    const auto h16 = static_cast<std::uint16_t>(h);
    std::memcpy(out + 2 * i, &h16, 2);
    if constexpr (FB) residual[i] = y - u2f(h << 16);
  }
}

template <bool ACC>
BRAID_INLINE void bf16_decode(const std::uint8_t* in, std::size_t n, float* out) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    put<ACC>(out + i, u2f(static_cast<std::uint32_t>(h) << 16));
  }
}

void fp16_encode_scalar(const float* in, const float* add, std::size_t n, std::uint8_t* out, float* residual) {
  for (std::size_t i = 0; i < n; ++i) {
    const float y = add ? in[i] + add[i] : in[i];
    const std::uint16_t h = float_to_half(y);
    std::memcpy(out + 2 * i, &h, 2);
    if (residual) residual[i] = y - half_to_float(h);
  }
}
void fp16_decode_scalar(const std::uint8_t* in, std::size_t n, float* out, bool acc) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    if (acc)
      out[i] += half_to_float(h);
    else
      out[i] = half_to_float(h);
  }
}

#if BRAID_CODEC_X86
BRAID_NOINLINE BRAID_TARGET_AVX2_F16C void fp16_encode_f16c(const float* in, const float* add, std::size_t n,
                                                            std::uint8_t* out, float* residual) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 y = _mm256_loadu_ps(in + i);
    if (add) y = _mm256_add_ps(y, _mm256_loadu_ps(add + i));
    const __m128i h = _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
    if (residual) _mm256_storeu_ps(residual + i, _mm256_sub_ps(y, _mm256_cvtph_ps(h)));
  }
  fp16_encode_scalar(in + i, add ? add + i : nullptr, n - i, out + 2 * i, residual ? residual + i : nullptr);
}
BRAID_NOINLINE BRAID_TARGET_AVX2_F16C void fp16_decode_f16c(const std::uint8_t* in, std::size_t n, float* out,
                                                            bool acc) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
    if (acc) d = _mm256_add_ps(d, _mm256_loadu_ps(out + i));
    _mm256_storeu_ps(out + i, d);
  }
  fp16_decode_scalar(in + 2 * i, n - i, out + i, acc);
}
#endif

#if BRAID_CODEC_X86
// sign1 in two passes over each block (the portable loops take five): (1) value = in + add
// into a stack block, the |bits| max and the lane sums of |value| together; (2) the sign
// bits straight from a compare mask and the residual. Lane k of the sum takes elements
// i % 8 == k in increasing i, and the lanes are combined in abs_sum8's order, so the
// bytes are those of the portable loops. Blocks whose length is not a multiple of 8 (a
// short last block) take the portable per-block code.
template <bool FB>
BRAID_INLINE BRAID_TARGET_AVX2 void sign1_encode_avx2_impl(std::uint32_t block, const float* in, const float* add,
                                                           std::size_t n, std::uint8_t* out,
                                                           float* residual) noexcept {
  const std::size_t B = block;
  const std::size_t nb = (n + B - 1) / B;
  std::uint8_t* codes = out + 4 * nb;
  alignas(64) float tmp[kMaxCodecBlock];
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256 sign_bit = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256 zero = _mm256_setzero_ps();
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t start = b * B;
    const auto len = static_cast<std::uint32_t>(std::min(B, n - start));
    float* res = FB ? residual + start : nullptr;
    std::uint8_t* c = codes + start / 8;
    const float* y = in + start;
    float scale;
    if (len % 8 != 0) {  // a short last block: the portable code
      if (add) {
        const float* a = add + start;
        for (std::uint32_t i = 0; i < len; ++i) tmp[i] = y[i] + a[i];
        y = tmp;
      }
      if (abs_bits_max(y, len) >= 0x7f800000u) {
        scale = u2f(kNanBits);
        std::memset(c, 0, codes_bytes(BlockFormat::sign1, len));
        if constexpr (FB) std::memset(res, 0, sizeof(float) * len);
      } else {
        scale = abs_sum8(y, len) / static_cast<float>(len);
        encode_sign_block<FB>(y, len, scale, c, res);
      }
      store_f32(out + 4 * b, scale);
      continue;
    }
    __m256i mx = _mm256_setzero_si256();
    __m256 sum = _mm256_setzero_ps();
    if (add) {
      const float* a = add + start;
      for (std::uint32_t i = 0; i < len; i += 8) {
        const __m256 v = _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(a + i));
        _mm256_store_ps(tmp + i, v);
        const __m256i bits = _mm256_and_si256(_mm256_castps_si256(v), abs_mask);
        mx = _mm256_max_epu32(mx, bits);
        sum = _mm256_add_ps(sum, _mm256_castsi256_ps(bits));
      }
      y = tmp;
    } else {
      for (std::uint32_t i = 0; i < len; i += 8) {
        const __m256i bits = _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(y + i)), abs_mask);
        mx = _mm256_max_epu32(mx, bits);
        sum = _mm256_add_ps(sum, _mm256_castsi256_ps(bits));
      }
    }
    alignas(32) std::uint32_t m8[8];
    alignas(32) float s8[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(m8), mx);
    _mm256_store_ps(s8, sum);
    std::uint32_t m = 0;
    for (const std::uint32_t v : m8) m = v > m ? v : m;
    if (m >= 0x7f800000u) {  // inf or NaN: the whole block decodes to NaN; residual dropped
      scale = u2f(kNanBits);
      std::memset(c, 0, len / 8);
      if constexpr (FB) std::memset(res, 0, sizeof(float) * len);
      store_f32(out + 4 * b, scale);
      continue;
    }
    scale = (((s8[0] + s8[4]) + (s8[2] + s8[6])) + ((s8[1] + s8[5]) + (s8[3] + s8[7]))) / static_cast<float>(len);
    const __m256 mean = _mm256_set1_ps(scale);
    for (std::uint32_t i = 0; i < len; i += 8) {
      const __m256 v = _mm256_loadu_ps(y + i);
      const __m256 neg = _mm256_cmp_ps(v, zero, _CMP_LT_OQ);
      c[i / 8] = static_cast<std::uint8_t>(_mm256_movemask_ps(neg));
      if constexpr (FB) _mm256_storeu_ps(res + i, _mm256_sub_ps(v, _mm256_or_ps(mean, _mm256_and_ps(neg, sign_bit))));
    }
    store_f32(out + 4 * b, scale);
  }
  const std::size_t used = 4 * nb + codes_bytes(BlockFormat::sign1, n);
  std::memset(out + used, 0, block_payload_bytes(BlockFormat::sign1, block, n) - used);
}

BRAID_NOINLINE BRAID_TARGET_AVX2 void sign1_encode_avx2(std::uint32_t block, const float* in, const float* add,
                                                        std::size_t n, std::uint8_t* out, float* residual) noexcept {
  if (residual)
    sign1_encode_avx2_impl<true>(block, in, add, n, out, residual);
  else
    sign1_encode_avx2_impl<false>(block, in, add, n, out, nullptr);
}
#endif

// ---------------------------------------------------------------------------------------
// ISA dispatch.

bool have_avx2() noexcept {
#if BRAID_CODEC_X86
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return yes;
#else
  return false;
#endif
}
// force_portable_path(true) (reduce.hpp) makes half_path() say "scalar"; the codec loops
// follow it too, so tests can compare the baseline and AVX2 copies. Every AVX2 CPU has F16C.
bool use_avx2() noexcept { return have_avx2() && std::strcmp(half_path(), "f16c") == 0; }
bool have_f16c() noexcept { return use_avx2(); }

#define BRAID_CODEC_ENTRY(name, attrs)                                                                             \
  BRAID_NOINLINE attrs void name##_block_encode(const BlockCodecParams& p, const float* in, const float* add,       \
                                                std::size_t n, std::uint8_t* out, float* residual) noexcept {      \
    encode_any(p, in, add, n, out, residual);                                                                      \
  }                                                                                                                \
  BRAID_NOINLINE attrs void name##_block_decode(BlockFormat f, std::uint32_t block, const std::uint8_t* in,       \
                                                std::size_t n, float* out, bool acc) noexcept {                    \
    if (acc)                                                                                                       \
      decode_any<true>(f, block, in, n, out);                                                                      \
    else                                                                                                           \
      decode_any<false>(f, block, in, n, out);                                                                     \
  }                                                                                                                \
  BRAID_NOINLINE attrs void name##_bf16_encode(const float* in, const float* add, std::size_t n,                  \
                                               std::uint8_t* out, float* residual) noexcept {                      \
    if (residual)                                                                                                  \
      bf16_encode<true>(in, add, n, out, residual);                                                                \
    else                                                                                                           \
      bf16_encode<false>(in, add, n, out, nullptr);                                                                \
  }                                                                                                                \
  BRAID_NOINLINE attrs void name##_bf16_decode(const std::uint8_t* in, std::size_t n, float* out, bool acc)       \
      noexcept {                                                                                                   \
    if (acc)                                                                                                       \
      bf16_decode<true>(in, n, out);                                                                               \
    else                                                                                                           \
      bf16_decode<false>(in, n, out);                                                                              \
  }

BRAID_CODEC_ENTRY(base, )
#if BRAID_CODEC_X86
BRAID_CODEC_ENTRY(avx2, BRAID_TARGET_AVX2)
#endif

}  // namespace

std::size_t block_payload_bytes(BlockFormat format, std::uint32_t block, std::size_t n) noexcept {
  const std::size_t nb = block ? (n + block - 1) / block : 0;
  const std::size_t raw = scale_bytes(format) * nb + codes_bytes(format, n);
  return (raw + 3) & ~std::size_t{3};
}

void block_encode(const BlockCodecParams& p, const float* in, const float* add, std::size_t n, std::uint8_t* out,
                  float* residual) noexcept {
#if BRAID_CODEC_X86
  if (use_avx2() && p.format == BlockFormat::sign1) return sign1_encode_avx2(p.block, in, add, n, out, residual);
  if (use_avx2()) return avx2_block_encode(p, in, add, n, out, residual);
#endif
  base_block_encode(p, in, add, n, out, residual);
}

void block_decode(BlockFormat format, std::uint32_t block, const std::uint8_t* in, std::size_t n, float* out,
                  bool accumulate) noexcept {
#if BRAID_CODEC_X86
  if (use_avx2()) return avx2_block_decode(format, block, in, n, out, accumulate);
#endif
  base_block_decode(format, block, in, n, out, accumulate);
}

std::size_t half_payload_bytes(std::size_t n) noexcept { return (2 * n + 3) & ~std::size_t{3}; }

void half_encode(HalfFormat f, const float* in, const float* add, std::size_t n, std::uint8_t* out,
                 float* residual) noexcept {
  half_narrow(f, in, add, n, out, residual);
  std::memset(out + 2 * n, 0, half_payload_bytes(n) - 2 * n);
}

void half_narrow(HalfFormat f, const float* in, const float* add, std::size_t n, std::uint8_t* out,
                 float* residual) noexcept {
  if (f == HalfFormat::bf16) {
#if BRAID_CODEC_X86
    if (use_avx2())
      avx2_bf16_encode(in, add, n, out, residual);
    else
#endif
      base_bf16_encode(in, add, n, out, residual);
  } else {
#if BRAID_CODEC_X86
    if (have_f16c())
      fp16_encode_f16c(in, add, n, out, residual);
    else
#endif
      fp16_encode_scalar(in, add, n, out, residual);
  }
}

void half_decode(HalfFormat f, const std::uint8_t* in, std::size_t n, float* out, bool accumulate) noexcept {
  if (f == HalfFormat::bf16) {
#if BRAID_CODEC_X86
    if (use_avx2()) return avx2_bf16_decode(in, n, out, accumulate);
#endif
    return base_bf16_decode(in, n, out, accumulate);
  }
#if BRAID_CODEC_X86
  if (have_f16c()) return fp16_decode_f16c(in, n, out, accumulate);
#endif
  fp16_decode_scalar(in, n, out, accumulate);
}

std::size_t topk_payload_bytes(std::size_t k) noexcept { return 8 * k; }

void topk_encode(const float* in, const float* add, std::size_t n, std::size_t k, std::uint8_t* out,
                 float* residual) {
  auto val = [&](std::size_t i) { return add ? in[i] + add[i] : in[i]; };
  auto key = [&](std::size_t i) { return f2u(val(i)) & 0x7fffffffu; };
  // Find thr = the k-th largest key and `above` = how many keys exceed it.
  std::uint32_t thr;
  std::size_t above = 0;
  if (n <= 32768) {
    // Small payloads: nth_element on the keys (the radix histograms would cost more).
    std::vector<std::uint32_t> keys(n);
    for (std::size_t i = 0; i < n; ++i) keys[i] = key(i);
    std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(k - 1), keys.end(),
                     [](std::uint32_t a, std::uint32_t b) { return a > b; });
    thr = keys[k - 1];
    for (std::size_t i = 0; i < k - 1; ++i) above += keys[i] > thr;
  } else {
    // Radix select: 16 high bits, then 16 low bits inside that bin.
    std::vector<std::uint32_t> hist(1u << 16);
    for (std::size_t i = 0; i < n; ++i) ++hist[key(i) >> 16];
    std::uint32_t hi = 0xffff;
    for (;; --hi) {
      if (above + hist[hi] >= k || hi == 0) break;
      above += hist[hi];
    }
    std::fill(hist.begin(), hist.end(), 0);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t kk = key(i);
      if ((kk >> 16) == hi) ++hist[kk & 0xffffu];
    }
    std::uint32_t lo = 0xffff;
    for (;; --lo) {
      if (above + hist[lo] >= k || lo == 0) break;
      above += hist[lo];
    }
    thr = (hi << 16) | lo;
  }
  std::size_t take_equal = k - above;  // entries equal to thr to take, lowest indices first
  std::uint8_t* idx = out;
  std::uint8_t* vals = out + 4 * k;
  std::size_t j = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = val(i);
    const std::uint32_t kk = f2u(v) & 0x7fffffffu;
    bool pick = kk > thr;
    if (!pick && kk == thr && take_equal > 0) {
      pick = true;
      --take_equal;
    }
    if (pick) {
      const auto i32 = static_cast<std::uint32_t>(i);
      std::memcpy(idx + 4 * j, &i32, 4);
      store_f32(vals + 4 * j, v);
      ++j;
    }
    if (residual) residual[i] = pick ? 0.0f : v;
  }
}

bool topk_decode(const std::uint8_t* in, std::size_t n, std::size_t k, float* out, bool accumulate) noexcept {
  const std::uint8_t* idx = in;
  const std::uint8_t* vals = in + 4 * k;
  std::uint64_t prev = 0;
  for (std::size_t j = 0; j < k; ++j) {
    std::uint32_t i;
    std::memcpy(&i, idx + 4 * j, 4);
    if (i >= n || (j > 0 && i <= prev)) return false;
    prev = i;
  }
  if (!accumulate) std::memset(out, 0, sizeof(float) * n);
  for (std::size_t j = 0; j < k; ++j) {
    std::uint32_t i;
    std::memcpy(&i, idx + 4 * j, 4);
    const float v = load_f32(vals + 4 * j);
    if (accumulate)
      out[i] += v;
    else
      out[i] = v;
  }
  return true;
}

std::uint8_t float_to_fp8(float v, BlockFormat format) noexcept {
  return static_cast<std::uint8_t>(format == BlockFormat::fp8e4m3 ? Fp8<BlockFormat::fp8e4m3>::narrow(v)
                                                                  : Fp8<BlockFormat::fp8e5m2>::narrow(v));
}

float fp8_to_float(std::uint8_t bits, BlockFormat format) noexcept {
  return format == BlockFormat::fp8e4m3 ? Fp8<BlockFormat::fp8e4m3>::decode(bits)
                                        : Fp8<BlockFormat::fp8e5m2>::decode(bits);
}

const char* codec_path() noexcept { return use_avx2() ? "avx2" : "baseline"; }

}  // namespace braid::kernels
