// OCP FP8 (E4M3 "fn" and E5M2) <-> f32, branch-free, for the host kernels: the fp8
// codecs (codec_kernels.cpp) and the f8e4m3/f8e5m2 element types (reduce.cpp). One
// conversion per direction; the device copy (kernels/cuda/codec_device.cuh Fp8) follows
// it operation for operation, and tests/gpu/test_cuda_recipes.cu holds them equal.
//
// narrow() is CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, ...) (the __nv_fp8_e4m3 /
// __nv_fp8_e5m2 constructors from float) bit for bit: round to nearest even, anything
// beyond the largest finite value (infinities included) saturates to it with its sign,
// and NaN becomes the canonical NaN 0x7f (its sign and payload are not kept).
#pragma once

#include "kernels/host/bits.hpp"
#include "kernels/host/codec_kernels.hpp"

#include <cstdint>

namespace braid::kernels::fp8 {

template <BlockFormat F>
struct Fp8 {
  static_assert(F == BlockFormat::fp8e4m3 || F == BlockFormat::fp8e5m2);
  static constexpr int kMbits = F == BlockFormat::fp8e4m3 ? 3 : 2;
  static constexpr int kBias = F == BlockFormat::fp8e4m3 ? 7 : 15;
  static constexpr std::uint32_t kMaxCode = F == BlockFormat::fp8e4m3 ? 0x7eu : 0x7bu;
  static constexpr std::uint32_t kNanCode = 0x7fu;  // CUDA's canonical NaN, both formats
  static constexpr float kMax = F == BlockFormat::fp8e4m3 ? 448.0f : 57344.0f;
  // 2^(kBias - 1 + kMbits): subnormal codes are rint(|v| * this).
  static constexpr float kSubScale = F == BlockFormat::fp8e4m3 ? 512.0f : 65536.0f;
  static constexpr float kSubStep = 1.0f / kSubScale;
  static constexpr std::uint32_t kNanBits = 0x7fc00000u;

  // Non-NaN v; saturates (infinities included). NaN would come out as ±max: narrow() is
  // the total function.
  static BRAID_INLINE std::uint32_t encode(float v) noexcept {
    using bits::f2u;
    using bits::u2f;
    using bits::usel;
    const std::uint32_t u = f2u(v);
    const std::uint32_t sign = (u >> 24) & 0x80u;
    const std::uint32_t a = u & 0x7fffffffu;
    constexpr int kShift = 23 - kMbits;
    const std::uint32_t normal =
        (a - (static_cast<std::uint32_t>(127 - kBias) << 23) + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u)) >>
        kShift;
    // Clamped to the subnormal range first so the int conversion cannot overflow on the
    // lanes that take the normal path.
    constexpr std::uint32_t kMinNormalBits = static_cast<std::uint32_t>(127 + 1 - kBias) << 23;
    const float as = u2f(usel(a < kMinNormalBits, a, kMinNormalBits));
    const std::uint32_t sub = static_cast<std::uint32_t>(static_cast<std::int32_t>(bits::rne(as * kSubScale)));
    std::uint32_t r = usel(a < kMinNormalBits, sub, normal);
    r = usel(r < kMaxCode, r, kMaxCode);
    return r | sign;
  }
  // Any v: encode(), and NaN -> kNanCode.
  static BRAID_INLINE std::uint32_t narrow(float v) noexcept {
    return bits::usel((bits::f2u(v) & 0x7fffffffu) > 0x7f800000u, kNanCode, encode(v));
  }
  // Exact. NaN codes give a quiet NaN with the code's sign; E5M2's 0x7c is inf.
  static BRAID_INLINE float decode(std::uint32_t code) noexcept {
    using bits::f2u;
    using bits::u2f;
    using bits::usel;
    const std::uint32_t c = code & 0x7fu;
    const std::uint32_t sign = (code & 0x80u) << 24;
    const float normal = u2f((c << (23 - kMbits)) + (static_cast<std::uint32_t>(127 - kBias) << 23));
    const float sub = static_cast<float>(static_cast<std::int32_t>(c)) * kSubStep;
    std::uint32_t r = usel((c >> kMbits) == 0, f2u(sub), f2u(normal));
    if constexpr (F == BlockFormat::fp8e4m3) {
      r = usel(c == 0x7fu, kNanBits, r);
    } else {
      r = usel(c >= 0x7cu, usel(c == 0x7cu, 0x7f800000u, kNanBits), r);
    }
    return u2f(r | sign);
  }
};

}  // namespace braid::kernels::fp8
