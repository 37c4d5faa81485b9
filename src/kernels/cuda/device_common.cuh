// Device helpers shared by the braid CUDA kernels: bit casts, the host's conversion
// recipes (reduce.cpp, codec_kernels.cpp) ported line for line, alignment-checked
// loads/stores and launch geometry. Included only by .cu files.
#pragma once

#include "gpu/runtime.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace braid::kernels::cuda::detail {

// The element recipes are __host__ __device__ so that tests/gpu/test_cuda_recipes.cu can
// check them against the host kernels on a machine without a GPU; on the host the _rn
// operations are plain IEEE operations (x86-64 without FMA).
#define BRAID_DEV __host__ __device__ __forceinline__

// Once in each .cu file of kernels, at namespace scope: registers the file's module, so
// that Runtime::load_kernels loads all its kernels when a communicator is created instead
// of each at its first launch (which waits for the whole device: docs/gpu.md, "Lazy
// loading").
#define BRAID_KERNEL_MODULE()                                                              \
  namespace {                                                                              \
  __global__ void braid_module_anchor() {}                                                 \
  [[maybe_unused]] const bool braid_module_registered =                                    \
      (::braid::gpu::register_kernel_module(reinterpret_cast<const void*>(&braid_module_anchor)), true); \
  }

BRAID_DEV std::uint32_t f2u(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
BRAID_DEV float u2f(std::uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
BRAID_DEV std::uint64_t d2u(double d) {
#ifdef __CUDA_ARCH__
  return static_cast<std::uint64_t>(__double_as_longlong(d));
#else
  std::uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
#endif
}
BRAID_DEV double u2d(std::uint64_t u) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, 8);
  return d;
#endif
}

// Correctly rounded (round-to-nearest-even) IEEE operations that nvcc never contracts.
#ifdef __CUDA_ARCH__
BRAID_DEV float add_rn(float a, float b) { return __fadd_rn(a, b); }
BRAID_DEV float sub_rn(float a, float b) { return __fsub_rn(a, b); }
BRAID_DEV float mul_rn(float a, float b) { return __fmul_rn(a, b); }
BRAID_DEV float div_rn(float a, float b) { return __fdiv_rn(a, b); }
BRAID_DEV double add_rn(double a, double b) { return __dadd_rn(a, b); }
BRAID_DEV double mul_rn(double a, double b) { return __dmul_rn(a, b); }
BRAID_DEV double div_rn(double a, double b) { return __ddiv_rn(a, b); }
BRAID_DEV std::uint32_t umulhi(std::uint32_t a, std::uint32_t b) { return __umulhi(a, b); }
#else
BRAID_DEV float add_rn(float a, float b) { return a + b; }
BRAID_DEV float sub_rn(float a, float b) { return a - b; }
BRAID_DEV float mul_rn(float a, float b) { return a * b; }
BRAID_DEV float div_rn(float a, float b) { return a / b; }
BRAID_DEV double add_rn(double a, double b) { return a + b; }
BRAID_DEV double mul_rn(double a, double b) { return a * b; }
BRAID_DEV double div_rn(double a, double b) { return a / b; }
BRAID_DEV std::uint32_t umulhi(std::uint32_t a, std::uint32_t b) {
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(a) * b) >> 32);
}
#endif

// binary16 -> binary32 (reduce.cpp h2f).
BRAID_DEV float h2f(std::uint32_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t em = (h & 0x7fffu) << 13;
  const std::uint32_t exp = em & 0x0f800000u;
  const std::uint32_t normal = em + ((127u - 15u) << 23);
  const std::uint32_t infnan = (em + ((255u - 31u) << 23)) | (em > 0x0f800000u ? 0x00400000u : 0u);
  const std::uint32_t sub = f2u(sub_rn(u2f(em + (113u << 23)), u2f(113u << 23)));
  const std::uint32_t r = exp == 0x0f800000u ? infnan : (exp == 0 ? sub : normal);
  return u2f(r | sign);
}

// binary32 -> binary16, RNE (reduce.cpp f2h; matches vcvtps2ph bit for bit).
BRAID_DEV std::uint32_t f2h(float f) {
  const std::uint32_t u = f2u(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  const std::uint32_t odd = (a >> 13) & 1u;
  const std::uint32_t normal = (a + ((15u - 127u) << 23) + 0xfffu + odd) >> 13;
  const std::uint32_t sub = f2u(add_rn(u2f(a), 0.5f)) - 0x3f000000u;
  const std::uint32_t infnan = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : 0x7c00u;
  std::uint32_t r = a < (113u << 23) ? sub : normal;
  r = a >= ((127u + 16u) << 23) ? infnan : r;
  return r | sign;
}

// binary32 -> bfloat16 bits in the low half, RNE, NaN quieted (codec_kernels.cpp f2bf).
BRAID_DEV std::uint32_t f2bf(float f) {
  const std::uint32_t u = f2u(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (u | 0x00400000u) >> 16;
  return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}
BRAID_DEV float bf2f(std::uint32_t h) { return u2f(h << 16); }

// ---------------------------------------------------------------------------------------
// IEEE operations with x86 SSE/AVX NaN results, so that NaN bits match the host too: an
// input NaN comes out quieted with its payload and sign (the first operand's when both are
// NaN), and a NaN created from non-NaN inputs (inf - inf, 0 * inf) is the x86 "default
// NaN" 0xffc00000. A GPU would return the canonical 0x7fffffff in every case. One compare
// on the fast path.

BRAID_DEV float x86_nan(float r, float a, float b) {
  if (r == r) return r;
  if (a != a) return u2f(f2u(a) | 0x00400000u);
  if (b != b) return u2f(f2u(b) | 0x00400000u);
  return u2f(0xffc00000u);
}
BRAID_DEV double x86_nan(double r, double a, double b) {
  if (r == r) return r;
  if (a != a) return u2d(d2u(a) | 0x0008000000000000ull);
  if (b != b) return u2d(d2u(b) | 0x0008000000000000ull);
  return u2d(0xfff8000000000000ull);
}
BRAID_DEV float fadd(float a, float b) { return x86_nan(add_rn(a, b), a, b); }
BRAID_DEV float fsub(float a, float b) { return x86_nan(sub_rn(a, b), a, b); }
BRAID_DEV float fmul(float a, float b) { return x86_nan(mul_rn(a, b), a, b); }
BRAID_DEV float fdiv(float a, float b) { return x86_nan(div_rn(a, b), a, b); }
BRAID_DEV double fadd(double a, double b) { return x86_nan(add_rn(a, b), a, b); }
BRAID_DEV double fmul(double a, double b) { return x86_nan(mul_rn(a, b), a, b); }
BRAID_DEV double fdiv(double a, double b) { return x86_nan(div_rn(a, b), a, b); }

// ---------------------------------------------------------------------------------------
// Loads and stores of byte ranges at any alignment (payloads have none in particular).

BRAID_DEV bool aligned(const void* p, std::size_t a) { return (reinterpret_cast<std::uintptr_t>(p) & (a - 1)) == 0; }

BRAID_DEV std::uint32_t load_u32(const std::uint8_t* p) {
  if (aligned(p, 4)) return *reinterpret_cast<const std::uint32_t*>(p);
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
BRAID_DEV void store_u32(std::uint8_t* p, std::uint32_t v) {
  if (aligned(p, 4)) {
    *reinterpret_cast<std::uint32_t*>(p) = v;
  } else {
    p[0] = static_cast<std::uint8_t>(v);
    p[1] = static_cast<std::uint8_t>(v >> 8);
    p[2] = static_cast<std::uint8_t>(v >> 16);
    p[3] = static_cast<std::uint8_t>(v >> 24);
  }
}

// Copies `bytes` (a multiple of 4 up to 32) between a register array and memory.
template <int kBytes>
BRAID_DEV void load_bytes(const std::uint8_t* p, std::uint32_t (&w)[(kBytes + 3) / 4]) {
  constexpr int W = (kBytes + 3) / 4;
  if constexpr (kBytes % 16 == 0) {
    if (aligned(p, 16)) {
#pragma unroll
      for (int i = 0; i < W / 4; ++i) {
        const uint4 v = reinterpret_cast<const uint4*>(p)[i];
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      }
      return;
    }
  }
  if constexpr (kBytes % 8 == 0) {
    if (aligned(p, 8)) {
#pragma unroll
      for (int i = 0; i < W / 2; ++i) {
        const uint2 v = reinterpret_cast<const uint2*>(p)[i];
        w[2 * i] = v.x, w[2 * i + 1] = v.y;
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < W; ++i) w[i] = load_u32(p + 4 * i);
}
template <int kBytes>
BRAID_DEV void store_bytes(std::uint8_t* p, const std::uint32_t (&w)[(kBytes + 3) / 4]) {
  constexpr int W = (kBytes + 3) / 4;
  if constexpr (kBytes % 16 == 0) {
    if (aligned(p, 16)) {
#pragma unroll
      for (int i = 0; i < W / 4; ++i)
        reinterpret_cast<uint4*>(p)[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
      return;
    }
  }
  if constexpr (kBytes % 8 == 0) {
    if (aligned(p, 8)) {
#pragma unroll
      for (int i = 0; i < W / 2; ++i) reinterpret_cast<uint2*>(p)[i] = make_uint2(w[2 * i], w[2 * i + 1]);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < W; ++i) store_u32(p + 4 * i, w[i]);
}
// The first `bytes` (< full size) bytes of w, one at a time (tails).
template <int kWords>
BRAID_DEV void store_partial(std::uint8_t* p, const std::uint32_t (&w)[kWords], int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<std::uint8_t>(w[i / 4] >> (8 * (i % 4)));
}

// Eight consecutive floats at p (cnt of them exist, the rest read as +0); vector loads
// when p is 16-byte aligned and all eight exist.
BRAID_DEV void load8f(const float* p, int cnt, float (&v)[8]) {
  if (cnt >= 8 && aligned(p, 16)) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = j < cnt ? p[j] : 0.0f;
}
BRAID_DEV void store8f(float* p, int cnt, const float (&v)[8]) {
  if (cnt >= 8 && aligned(p, 16)) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (j < cnt) p[j] = v[j];
}

// ---------------------------------------------------------------------------------------
// Launch geometry: grid-stride kernels get at most a few waves of blocks.

inline int sm_count() noexcept {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      sms <= 0)
    return 80;
  return sms;
}
inline unsigned grid_for(std::size_t items, unsigned threads, unsigned waves = 8) noexcept {
  const std::size_t want = (items + threads - 1) / threads;
  const std::size_t cap = static_cast<std::size_t>(sm_count()) * waves;
  return static_cast<unsigned>(want < cap ? (want ? want : 1) : cap);
}
inline Status last_status() noexcept { return static_cast<Status>(cudaGetLastError()); }

}  // namespace braid::kernels::cuda::detail
