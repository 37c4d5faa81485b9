// Host-side check of the CUDA kernels' element recipes (src/kernels/cuda/*.cuh, which are
// __host__ __device__) against the host kernels: f16/bf16/fp8 conversions, Philox keying,
// the x86 NaN rules the device emulates, block scale / quantisation / packing, the payload
// readers and the value sources, driven here by a host emulation of the encoder kernel's
// loop (same chunking, same order of the sign1 lane sums). It runs on any machine, so a
// transcription error in a recipe shows without a GPU; what it cannot check (warp
// reductions, shared-memory staging, launch geometry, vector stores) is what
// test_cuda_kernels checks on a GPU.
#include "kernels/cuda/codec_device.cuh"
#include "kernels/host/codec_kernels.hpp"
#include "kernels/host/reduce.hpp"
#include "kernels/host/rng.hpp"

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace {

namespace hk = braid::kernels;
namespace d = braid::kernels::cuda::detail;
using hk::BlockFormat;

std::uint32_t fbits(float f) { return d::f2u(f); }

TEST(CudaRecipes, HalfConversionsMatchTheHost) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(fbits(d::h2f(h)), fbits(hk::half_to_float(static_cast<std::uint16_t>(h)))) << h;
    ASSERT_EQ(fbits(d::bf2f(h)), fbits(hk::bf16_to_float(static_cast<std::uint16_t>(h)))) << h;
  }
  // Every 61st float pattern (70 million, all exponents, NaN payloads included).
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 61) {
    const float f = d::u2f(static_cast<std::uint32_t>(u));
    ASSERT_EQ(d::f2h(f), hk::float_to_half(f)) << std::hex << u;
    ASSERT_EQ(d::f2bf(f), hk::float_to_bf16(f)) << std::hex << u;
  }
}

template <BlockFormat F>
void check_fp8() {
  for (std::uint32_t c = 0; c < 256; ++c)
    ASSERT_EQ(fbits(d::Fp8<F>::decode(c)), fbits(hk::fp8_to_float(static_cast<std::uint8_t>(c), F))) << c;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 251) {
    const float f = d::u2f(static_cast<std::uint32_t>(u));
    if (!std::isfinite(f)) continue;  // never reaches the encoder (non-finite blocks)
    ASSERT_EQ(d::Fp8<F>::encode(f), hk::float_to_fp8(f, F)) << std::hex << u;
  }
}
TEST(CudaRecipes, Fp8ConversionsMatchTheHost) {
  check_fp8<BlockFormat::fp8e4m3>();
  check_fp8<BlockFormat::fp8e5m2>();
}

// narrow() (the f8e4m3/f8e5m2 element types' rounding, host fp8.hpp and device
// codec_device.cuh) is CUDA's own __nv_cvt_float_to_fp8(v, __NV_SATFINITE, ...) (what the
// __nv_fp8_e4m3(float) / __nv_fp8_e5m2(float) constructors call; here its host code) bit
// for bit: every fp8 value, the midpoints and their neighbours, infinities, NaNs, and
// every 61st float pattern.
template <BlockFormat F>
void check_narrow_is_cuda_satfinite() {
  const __nv_fp8_interpretation_t kind = F == BlockFormat::fp8e4m3 ? __NV_E4M3 : __NV_E5M2;
  auto check = [&](float f) {
    const auto cuda = static_cast<std::uint32_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, kind));
    ASSERT_EQ(d::Fp8<F>::narrow(f), cuda) << std::hex << fbits(f);
    ASSERT_EQ(hk::float_to_fp8(f, F), cuda) << std::hex << fbits(f);
  };
  for (std::uint32_t c = 0; c < 256; ++c) {
    const float v = d::Fp8<F>::decode(c), w = d::Fp8<F>::decode(c + 1);
    for (float x : {v, std::nextafter(v, 0.0f), std::nextafter(v, 1e30f), std::nextafter(v, -1e30f)}) check(x);
    if (c < 255 && std::isfinite(v) && std::isfinite(w)) {
      const float mid = (v + w) / 2;
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), -mid}) check(x);
    }
  }
  for (float x : {INFINITY, -INFINITY, NAN, -NAN, 1e30f, -1e30f, 0x1p-40f, -0x1p-40f}) check(x);
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 61) check(d::u2f(static_cast<std::uint32_t>(u)));
}
TEST(CudaRecipes, Fp8NarrowIsCudasSatfiniteConversion) {
  check_narrow_is_cuda_satfinite<BlockFormat::fp8e4m3>();
  check_narrow_is_cuda_satfinite<BlockFormat::fp8e5m2>();
}

TEST(CudaRecipes, PhiloxKeyingMatchesTheHost) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 20000; ++i) {
    const std::uint64_t seed = rng(), step = rng() >> (i % 64), g0 = rng() >> (i % 61);
    const uint4 w = d::rounding_words(seed, step, g0 >> 2);
    const hk::Philox4 h = hk::rounding_words(seed, step, g0 >> 2);
    ASSERT_EQ(w.x, h.v[0]);
    ASSERT_EQ(w.y, h.v[1]);
    ASSERT_EQ(w.z, h.v[2]);
    ASSERT_EQ(w.w, h.v[3]);
    float u[8];
    switch (g0 & 3) {
      case 0: d::uniforms8<0>(seed, step, g0, u); break;
      case 1: d::uniforms8<1>(seed, step, g0, u); break;
      case 2: d::uniforms8<2>(seed, step, g0, u); break;
      default: d::uniforms8<3>(seed, step, g0, u); break;
    }
    for (int j = 0; j < 8; ++j) ASSERT_EQ(fbits(u[j]), fbits(hk::rounding_uniform(seed, step, g0 + j))) << j;
  }
}

// The rule the device applies to NaN results is what this x86 host computes (one NaN
// operand: that NaN quieted; NaN from non-NaN operands: the default NaN 0xffc00000).
TEST(CudaRecipes, X86NanRuleMatchesThisHost) {
  const float inf = std::numeric_limits<float>::infinity();
  const float vals[] = {0.0f, -0.0f, 1.5f, -3.0f, inf, -inf, d::u2f(0x7fc00000u), d::u2f(0xffc12345u),
                        d::u2f(0x7f800001u) /* signalling */, 1e-40f};
  for (float a : vals)
    for (float b : vals) {
      if (std::isnan(a) && std::isnan(b)) continue;  // operand order of two NaNs: not specified
      volatile float va = a, vb = b;
      const float sum = va + vb, dif = va - vb, pro = va * vb, quo = va / vb;
      EXPECT_EQ(fbits(d::x86_nan(sum, a, b)), fbits(sum)) << a << " + " << b;
      EXPECT_EQ(fbits(d::x86_nan(dif, a, b)), fbits(dif)) << a << " - " << b;
      EXPECT_EQ(fbits(d::x86_nan(pro, a, b)), fbits(pro)) << a << " * " << b;
      EXPECT_EQ(fbits(d::x86_nan(quo, a, b)), fbits(quo)) << a << " / " << b;
      volatile double da = a, db = b;
      const double dsum = da + db, dpro = da * db;
      EXPECT_EQ(d::d2u(d::x86_nan(dsum, static_cast<double>(a), static_cast<double>(b))), d::d2u(dsum));
      EXPECT_EQ(d::d2u(d::x86_nan(dpro, static_cast<double>(a), static_cast<double>(b))), d::d2u(dpro));
    }
}

std::vector<float> gradient(std::size_t n, std::uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng) * 0.01f;
  if (specials) {
    auto at = [&](std::size_t i, float x) {
      if (i < n) v[i] = x;
    };
    at(n / 2, std::numeric_limits<float>::quiet_NaN());
    at(n / 3 + 1, -std::numeric_limits<float>::infinity());
    at(n / 5 + 2, 1e30f);
    at(n / 9, -0.0f);
    at(n / 11, 1e-41f);
    for (std::size_t i = 0; i < 300 && 600 + i < n; ++i) v[600 + i] = 1e-35f * static_cast<float>(i % 5);
  }
  return v;
}

// The encoder kernel's loop, one "warp" at a time on the host: pass 1 per 256-element
// chunk (|bits| max, sign1 lane sums in the kernel's order), block_scale, pass 2 with
// quantise8/pack8 per 8-element group, padding zeroed.
template <BlockFormat F, bool SR, class Src>
void emulate_block_encode(const hk::BlockCodecParams& p, const Src& src, std::size_t n, std::uint8_t* out,
                          float* residual) {
  const std::uint32_t B = p.block;
  const std::size_t nb = (n + B - 1) / B;
  std::uint8_t* codes = out + 4 * nb;
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t start = b * B;
    const int len = static_cast<int>(std::min<std::size_t>(B, n - start));
    std::uint32_t m = 0;
    float sums[8] = {};
    for (int c = 0; c < len; c += 256) {
      float stage[256] = {};
      for (int lane = 0; lane < 32; ++lane) {
        const int i0 = c + 8 * lane, cnt = len - i0;
        float y[8] = {}, acc[8];
        if (cnt > 0) src.load8(start + i0, cnt, y, acc);
        for (int j = 0; j < 8; ++j) {
          m = std::max(m, d::f2u(y[j]) & 0x7fffffffu);
          stage[8 * lane + j] = d::u2f(d::f2u(y[j]) & 0x7fffffffu);
        }
      }
      for (int lane = 0; lane < 8; ++lane)
        for (int t = 0; t < 32 && c + 8 * t + lane < len; ++t) sums[lane] = d::fadd(sums[lane], stage[8 * t + lane]);
    }
    const d::BlockScale bs = d::block_scale<F>(m, sums, len);
    d::store_u32(out + 4 * b, d::f2u(bs.scale));
    for (int i0 = 0; i0 < len; i0 += 8) {
      const int cnt = len - i0;
      const std::size_t e = start + i0;
      float y[8], acc[8], r[8];
      src.load8(e, cnt, y, acc);
      std::uint32_t q[8], w[2];
      d::quantise8<F, SR>(y, cnt, bs, p, e, q, r);
      d::pack8<F>(q, w);
      const int bytes = F == BlockFormat::sign1 ? 1 : (F == BlockFormat::int4 ? (std::min(cnt, 8) + 1) / 2 : std::min(cnt, 8));
      d::store_partial(F == BlockFormat::sign1 ? codes + e / 8 : (F == BlockFormat::int4 ? codes + e / 2 : codes + e), w,
                       bytes);
      if (residual) d::store8f(residual + e, cnt, r);
    }
  }
  for (std::size_t k = 4 * nb + d::codes_bytes(F, n); k < hk::block_payload_bytes(F, B, n); ++k) out[k] = 0;
}

template <BlockFormat F, bool SR>
void check_block(std::uint32_t block, std::size_t n, std::uint64_t offset) {
  SCOPED_TRACE(testing::Message() << "format " << static_cast<int>(F) << " sr " << SR << " block " << block << " n "
                                  << n << " offset " << offset);
  hk::BlockCodecParams p;
  p.format = F;
  p.block = block;
  p.stochastic = SR;
  p.seed = 12345;
  p.step = 3;
  p.offset = offset;
  const auto x = gradient(n, 9 + static_cast<std::uint32_t>(n), true);
  auto add = gradient(n, 10, false);
  const std::size_t bytes = hk::block_payload_bytes(F, block, n);
  // Plain encode with add and residual; payload 1 byte off alignment.
  std::vector<std::uint8_t> want(bytes), got(bytes + 1, 0xab);
  std::vector<float> want_res(n), got_res(n);
  hk::block_encode(p, x.data(), add.data(), n, want.data(), want_res.data());
  emulate_block_encode<F, SR>(p, d::PlainSrc{x.data(), add.data()}, n, got.data() + 1, got_res.data());
  ASSERT_EQ(std::memcmp(got.data() + 1, want.data(), bytes), 0) << "payload";
  ASSERT_EQ(std::memcmp(got_res.data(), want_res.data(), 4 * n), 0) << "residual";
  // Payload reader against the host decoder.
  std::vector<float> want_dec(n), got_dec(n);
  hk::block_decode(F, block, want.data(), n, want_dec.data(), false);
  const d::BlockDec<F> dec{got.data() + 1, (n + block - 1) / block, block};
  for (std::size_t i = 0; i < n; i += 8) {
    float v[8];
    dec.load8(i, static_cast<int>(std::min<std::size_t>(8, n - i)), v);
    for (std::size_t j = 0; j < 8 && i + j < n; ++j) ASSERT_EQ(fbits(v[j]), fbits(want_dec[i + j])) << i + j;
  }
  // Fused source: acc = local + decode(payload), value = acc + residual.
  std::vector<float> acc = add, res = gradient(n, 11, false);
  hk::block_decode(F, block, want.data(), n, acc.data(), true);
  std::vector<std::uint8_t> want2(bytes), got2(bytes);
  std::vector<float> want_res2 = res, got_res2 = res;
  hk::block_encode(p, acc.data(), want_res2.data(), n, want2.data(), want_res2.data());
  const d::FusedSrc<d::BlockDec<F>> fused{dec, add.data(), got_res2.data(), nullptr};
  emulate_block_encode<F, SR>(p, fused, n, got2.data(), got_res2.data());
  ASSERT_EQ(std::memcmp(got2.data(), want2.data(), bytes), 0) << "fused payload";
  ASSERT_EQ(std::memcmp(got_res2.data(), want_res2.data(), 4 * n), 0) << "fused residual";
}

TEST(CudaRecipes, BlockEncodersMatchTheHostBitForBit) {
  for (std::size_t n : {1u, 7u, 8u, 9u, 255u, 257u, 4099u, 70001u})
    for (std::uint64_t offset : {0u, 1u, 6u}) {
      check_block<BlockFormat::int8, false>(256, n, offset);
      check_block<BlockFormat::int8, true>(256, n, offset);
      check_block<BlockFormat::int4, false>(256, n, offset);
      check_block<BlockFormat::int4, true>(40, n, offset);
      check_block<BlockFormat::fp8e4m3, false>(256, n, offset);
      check_block<BlockFormat::fp8e5m2, false>(64, n, offset);
      check_block<BlockFormat::sign1, false>(256, n, offset);
      check_block<BlockFormat::sign1, false>(24, n, offset);
      check_block<BlockFormat::sign1, false>(4096, n, offset);
      check_block<BlockFormat::int8, false>(8, n, offset);
    }
}

// fp16/bf16/raw: the element kernel's group loop on the host.
template <class Fmt>
void check_elem(hk::HalfFormat hf, bool raw) {
  for (std::size_t n : {1u, 7u, 8u, 9u, 1001u}) {
    const auto x = gradient(n, 21, true);
    auto add = gradient(n, 22, false);
    add[n / 2] = std::numeric_limits<float>::infinity();  // inf + finite, inf - inf residuals
    const std::size_t bytes = raw ? 4 * n : hk::half_payload_bytes(n);
    std::vector<std::uint8_t> want(bytes), got(bytes + 3, 0xab);
    std::vector<float> want_res(n), got_res(n);
    if (raw) {
      for (std::size_t i = 0; i < n; ++i) {
        const float v = x[i] + add[i];
        std::memcpy(want.data() + 4 * i, &v, 4);
      }
    } else {
      hk::half_encode(hf, x.data(), add.data(), n, want.data(), want_res.data());
    }
    const d::PlainSrc src{x.data(), add.data()};
    std::uint8_t* out = got.data() + 3;
    for (std::size_t i = 0; i < n; i += 8) {
      const int cnt = static_cast<int>(std::min<std::size_t>(8, n - i));
      float y[8], acc[8], r[8];
      src.load8(i, cnt, y, acc);
      for (int j = 0; j < cnt; ++j) {
        const std::uint32_t c = Fmt::enc(y[j]);
        for (int k = 0; k < Fmt::kBytes; ++k) out[Fmt::kBytes * (i + j) + k] = static_cast<std::uint8_t>(c >> (8 * k));
        r[j] = Fmt::kBytes == 4 ? 0.0f : d::fsub(y[j], Fmt::dec(c));
      }
      d::store8f(got_res.data() + i, cnt, r);
    }
    for (std::size_t k = Fmt::kBytes * n; k < bytes; ++k) out[k] = 0;
    ASSERT_EQ(std::memcmp(out, want.data(), bytes), 0) << "n " << n;
    if (!raw) ASSERT_EQ(std::memcmp(got_res.data(), want_res.data(), 4 * n), 0) << "n " << n;
    // Reader.
    std::vector<float> want_dec(n);
    if (raw)
      std::memcpy(want_dec.data(), want.data(), 4 * n);
    else
      hk::half_decode(hf, want.data(), n, want_dec.data(), false);
    const d::ElemDec<Fmt> dec{out};
    for (std::size_t i = 0; i < n; i += 8) {
      float v[8];
      dec.load8(i, static_cast<int>(std::min<std::size_t>(8, n - i)), v);
      for (std::size_t j = 0; j < 8 && i + j < n; ++j) ASSERT_EQ(fbits(v[j]), fbits(want_dec[i + j])) << i + j;
    }
  }
}
TEST(CudaRecipes, ElementCodecsMatchTheHostBitForBit) {
  check_elem<d::Fp16Fmt>(hk::HalfFormat::fp16, false);
  check_elem<d::Bf16Fmt>(hk::HalfFormat::bf16, false);
  check_elem<d::RawFmt>(hk::HalfFormat::bf16, true);
}

}  // namespace
