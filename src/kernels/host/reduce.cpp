// braid host reduction kernels.
//
// Every (dtype, op) pair is one template instantiation of an element-wise loop over
// contiguous arrays, written so that GCC/Clang auto-vectorise it at the x86-64 baseline
// (SSE2) at -O2 and -O3; nothing assumes a -march flag. What shapes the code:
//
// * Aliasing. The contract allows dst == a and/or dst == b exactly (in-place reduction),
//   never a partial overlap. run_body() dispatches on the pointer identities to a loop
//   whose `__restrict` qualifiers are true for that case: three distinct arrays, dst == a,
//   dst == b, or all three equal (a == b with a separate dst is fine: restrict only
//   forbids sharing an object that is written). Without restrict the compiler would
//   version every loop on a run-time overlap check.
// * -O2. GCC's -O2 vectoriser ("very cheap" cost model) refuses loops that need a run-time
//   epilogue, so each loop walks fixed 64-byte blocks (a constant-trip inner loop, which it
//   does vectorise) and finishes with a scalar tail.
// * ISA. Each loop is compiled twice from the same source: for the baseline and with
//   target("avx2"); one CPUID probe picks the AVX2 copy where the CPU (and OS) has it. No FMA is
//   enabled, so both copies compute the same bits.
// * f16/bf16 are widened to f32, reduced, and rounded to nearest-even after every step.
//   The portable kernels treat a pair of 16-bit values as one 32-bit word (lo and hi
//   lanes), so widening and narrowing are shifts and masks inside 32-bit lanes instead of
//   cross-lane unpack/pack shuffles, and the conversions are branch-free (bitwise selects)
//   so the loops if-convert and vectorise. On CPUs with AVX+F16C, f16 goes through
//   vcvtph2ps/vcvtps2ph instead. The portable conversions match F16C bit for bit (checked
//   over all 2^32 floats, NaN payloads included); the arithmetic between them agrees
//   except for the payload of a NaN result when both inputs are NaN.
// * f8e4m3/f8e5m2 are widened to f32 the same way, one byte per 32-bit lane, with the fp8
//   codec's conversions (fp8.hpp): rounding back is nearest-even, saturating to the largest
//   finite value, NaN -> 0x7f, as CUDA's __nv_fp8_e4m3(float)/__nv_fp8_e5m2(float). A sum,
//   product or quotient of two fp8 values rounded first to f32 then to fp8 equals the
//   exact result rounded once (f32 has more than 2p+2 bits for these p; the unit test
//   checks all 2^16 pairs per op).
// * Integers wrap: the arithmetic is done in the unsigned type of the same width (or
//   `unsigned` for narrower types, to dodge the promotion to int), which has no UB.
// * Floating min/max propagate NaN: min(a, b) = isnan(a) ? a : (a < b ? a : b). The inner
//   select is what minps/vminps computes, and the outer one is a compare and blend, so
//   every path returns the same operand (signed zeros included). The quiet comparison
//   builtins keep the expression if-convertible under -ftrapping-math.
#include "kernels/host/reduce.hpp"
#include "kernels/host/bits.hpp"
#include "kernels/host/fp8.hpp"

#include <atomic>
#include <cstring>
#include <type_traits>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define BRAID_X86_DISPATCH 1
#include <cpuid.h>
#include <immintrin.h>
#define BRAID_TARGET_AVX2 __attribute__((target("avx2")))
#define BRAID_TARGET_F16C __attribute__((target("avx,f16c")))
#else
#define BRAID_X86_DISPATCH 0
#endif

#define BRAID_INLINE_LAMBDA __attribute__((always_inline))

namespace braid::kernels {
namespace {

// ---------------------------------------------------------------------------------------
// Bit casts and branch-free f16/bf16 conversions. They work on 32-bit words so the
// vectoriser keeps everything in 32-bit lanes; always_inline so that they also inline
// into the target("avx2") copies of the loops.

using bits::f2u;
using bits::u2f;

// Bitwise select (bits::usel) where an arm holds a float operation, so that the loops
// if-convert and vectorise under the default -ftrapping-math.
using bits::usel;

// binary16 (low 16 bits of h) -> binary32. Normals re-bias the exponent; subnormals are
// renormalised by one exact float subtraction; inf/NaN get the all-ones exponent, and a
// NaN is quieted with its payload kept, as vcvtph2ps does.
BRAID_INLINE float h2f(std::uint32_t h) noexcept {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t em = (h & 0x7fffu) << 13;  // exponent and mantissa, float position
  const std::uint32_t exp = em & 0x0f800000u;
  const std::uint32_t normal = em + ((127u - 15u) << 23);
  const std::uint32_t infnan = (em + ((255u - 31u) << 23)) | (em > 0x0f800000u ? 0x00400000u : 0u);
  // Subnormal m * 2^-24: (1 + m/1024) * 2^-14 - 2^-14, exact.
  const std::uint32_t sub = f2u(u2f(em + (113u << 23)) - u2f(113u << 23));
  const std::uint32_t r = usel(exp == 0x0f800000u, infnan, usel(exp == 0, sub, normal));
  return u2f(r | sign);
}

// binary32 -> binary16 in the low 16 bits, round to nearest even. Overflow -> inf; NaN ->
// quiet NaN with the payload truncated (as vcvtps2ph). Results in the subnormal range are
// rounded by one float addition, so they follow the FPU's rounding, nearest-even by
// default (FTZ/DAZ cannot change them: neither the input nor the sum is subnormal when
// the result is nonzero).
BRAID_INLINE std::uint32_t f2h(float f) noexcept {
  const std::uint32_t u = f2u(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  // Normal range: re-bias and round on bit 13, ties to even. A carry out of the mantissa
  // bumps the exponent, so [65520, 65536) becomes inf (0x7c00) as it should.
  const std::uint32_t odd = (a >> 13) & 1u;
  const std::uint32_t normal = (a + ((15u - 127u) << 23) + 0xfffu + odd) >> 13;
  // Subnormal range (|f| < 2^-14): adding 0.5 lines the value up so that the addition's
  // rounding leaves the half mantissa in the low bits.
  const std::uint32_t sub = f2u(u2f(a) + 0.5f) - 0x3f000000u;
  const std::uint32_t infnan = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : 0x7c00u;
  std::uint32_t r = usel(a < (113u << 23), sub, normal);
  r = usel(a >= ((127u + 16u) << 23), infnan, r);  // |f| >= 65536: inf (or NaN)
  return r | sign;
}

// binary32 -> bfloat16 in the high 16 bits (low 16 bits zero), round to nearest even.
// Overflow carries into the exponent (inf); NaN is quieted with its top payload bits kept.
BRAID_INLINE std::uint32_t f2bf_hi(float f) noexcept {
  const std::uint32_t u = f2u(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const std::uint32_t nan = (u | 0x00400000u) & 0xffff0000u;
  // Signed compare: one pcmpgtd, where an unsigned one would need a bias first.
  return static_cast<std::int32_t>(u & 0x7fffffffu) > 0x7f800000 ? nan : rounded;
}

// ---------------------------------------------------------------------------------------
// Operations.

template <class T>
using WrapT = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct Sum {
  template <class T>
  static BRAID_INLINE T apply(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(static_cast<WrapT<T>>(static_cast<WrapT<T>>(a) + static_cast<WrapT<T>>(b)));
    else
      return a + b;
  }
};
struct Prod {
  template <class T>
  static BRAID_INLINE T apply(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(static_cast<WrapT<T>>(static_cast<WrapT<T>>(a) * static_cast<WrapT<T>>(b)));
    else
      return a * b;
  }
};
struct Min {
  template <class T>
  static BRAID_INLINE T apply(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>)
      return b < a ? b : a;
    else
      return a != a ? a : (__builtin_isless(a, b) ? a : b);
  }
};
struct Max {
  template <class T>
  static BRAID_INLINE T apply(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>)
      return a < b ? b : a;
    else
      return a != a ? a : (__builtin_isgreater(a, b) ? a : b);
  }
};

// ---------------------------------------------------------------------------------------
// Kernels: how one "word" of storage is loaded, combined and stored.

// One element of a native type per word.
template <class Op, class T>
struct NativeK {
  using Elem = T;
  using Word = T;
  static constexpr std::size_t kPerWord = 1;
  static BRAID_INLINE Word get(const Elem* p) noexcept { return *p; }
  static BRAID_INLINE void put(Elem* p, Word w) noexcept { *p = w; }
  static BRAID_INLINE Word apply(Word x, Word y) noexcept { return Op::apply(x, y); }
};

struct HalfFmt {
  static BRAID_INLINE float lo(std::uint32_t w) noexcept { return h2f(w & 0xffffu); }
  static BRAID_INLINE float hi(std::uint32_t w) noexcept { return h2f(w >> 16); }
  static BRAID_INLINE std::uint32_t round_lo(float f) noexcept { return f2h(f); }
  static BRAID_INLINE std::uint32_t round_hi(float f) noexcept { return f2h(f) << 16; }
};
struct Bf16Fmt {
  static BRAID_INLINE float lo(std::uint32_t w) noexcept { return u2f(w << 16); }
  static BRAID_INLINE float hi(std::uint32_t w) noexcept { return u2f(w & 0xffff0000u); }
  static BRAID_INLINE std::uint32_t round_lo(float f) noexcept { return f2bf_hi(f) >> 16; }
  static BRAID_INLINE std::uint32_t round_hi(float f) noexcept { return f2bf_hi(f); }
};

// Narrow elements packed into 32-bit words: loads and stores of whole words (memcpy, any
// alignment), for the kernels that convert lane by lane inside a word.
template <class E>
struct PackedWords {
  using Elem = E;
  using Word = std::uint32_t;
  static constexpr std::size_t kPerWord = sizeof(Word) / sizeof(E);
  static BRAID_INLINE Word get(const Elem* p) noexcept {
    Word w;
    std::memcpy(&w, p, sizeof w);
    return w;
  }
  static BRAID_INLINE void put(Elem* p, Word w) noexcept { std::memcpy(p, &w, sizeof w); }
};

// Two 16-bit floats per 32-bit word, each lane widened to f32, reduced and rounded back.
// Lanes are independent, so byte order does not matter.
template <class Op, class Fmt>
struct PairK : PackedWords<std::uint16_t> {
  static BRAID_INLINE Word apply(Word x, Word y) noexcept {
    return Fmt::round_lo(Op::apply(Fmt::lo(x), Fmt::lo(y))) | Fmt::round_hi(Op::apply(Fmt::hi(x), Fmt::hi(y)));
  }
};

// Four fp8 bytes per 32-bit word, each lane widened to f32, reduced and rounded back
// (satfinite), as PairK does with two 16-bit lanes: loads and stores are whole words and
// every conversion stays in 32-bit lanes. With one byte per word (a byte load, the
// conversions, a byte store) the AVX2 copy made 0.60 GB/s of output at 1 MiB
// (bench_reduce sum/f8e4m3; bf16 14.6), with four 1.6 GB/s; the SSE2 copy stays at 0.62,
// where the conversions' instruction count, not the loads, is the limit.
template <class Op, BlockFormat F>
struct Fp8K : PackedWords<std::uint8_t> {
  static BRAID_INLINE Word lane(Word x, Word y, int k) noexcept {
    using C = fp8::Fp8<F>;
    return C::narrow(Op::apply(C::decode((x >> (8 * k)) & 0xffu), C::decode((y >> (8 * k)) & 0xffu))) << (8 * k);
  }
  // A word whose upper lanes are zero (the tail's single bytes) gives zero upper lanes.
  static BRAID_INLINE Word apply(Word x, Word y) noexcept {
    return lane(x, y, 0) | lane(x, y, 1) | lane(x, y, 2) | lane(x, y, 3);
  }
};

// ---------------------------------------------------------------------------------------
// Loops, one per aliasing case; the restrict qualifiers are exact for each.

template <class K>
constexpr std::size_t kBlockWords = 64 / sizeof(typename K::Word);  // one cache line

// Each loop covers `words` words (words * K::kPerWord elements); run_body() finishes an
// odd element. body2 keeps the a/b operand order: K(d, o) when d is a, K(o, d) when d is b.
template <class K>
BRAID_INLINE void body3(typename K::Elem* __restrict d, const typename K::Elem* __restrict a,
                        const typename K::Elem* __restrict b, std::size_t words) noexcept {
  constexpr std::size_t P = K::kPerWord;
  std::size_t w = 0;
  for (; w + kBlockWords<K> <= words; w += kBlockWords<K>)
    for (std::size_t j = 0; j < kBlockWords<K>; ++j) {
      const std::size_t e = (w + j) * P;
      K::put(d + e, K::apply(K::get(a + e), K::get(b + e)));
    }
  for (; w < words; ++w) K::put(d + w * P, K::apply(K::get(a + w * P), K::get(b + w * P)));
}

template <class K, bool DstIsA>
BRAID_INLINE typename K::Word apply_ordered(typename K::Word dv, typename K::Word ov) noexcept {
  return DstIsA ? K::apply(dv, ov) : K::apply(ov, dv);
}

template <class K, bool DstIsA>
BRAID_INLINE void body2(typename K::Elem* __restrict d, const typename K::Elem* __restrict o,
                        std::size_t words) noexcept {
  constexpr std::size_t P = K::kPerWord;
  std::size_t w = 0;
  for (; w + kBlockWords<K> <= words; w += kBlockWords<K>)
    for (std::size_t j = 0; j < kBlockWords<K>; ++j) {
      const std::size_t e = (w + j) * P;
      K::put(d + e, apply_ordered<K, DstIsA>(K::get(d + e), K::get(o + e)));
    }
  for (; w < words; ++w) K::put(d + w * P, apply_ordered<K, DstIsA>(K::get(d + w * P), K::get(o + w * P)));
}

template <class K>
BRAID_INLINE void body1(typename K::Elem* __restrict d, std::size_t words) noexcept {
  constexpr std::size_t P = K::kPerWord;
  std::size_t w = 0;
  for (; w + kBlockWords<K> <= words; w += kBlockWords<K>)
    for (std::size_t j = 0; j < kBlockWords<K>; ++j) {
      const std::size_t e = (w + j) * P;
      const auto v = K::get(d + e);
      K::put(d + e, K::apply(v, v));
    }
  for (; w < words; ++w) {
    const auto v = K::get(d + w * P);
    K::put(d + w * P, K::apply(v, v));
  }
}

template <class K>
BRAID_INLINE void run_body(void* dst, const void* a, const void* b, std::size_t n) noexcept {
  using E = typename K::Elem;
  E* d = static_cast<E*>(dst);
  const E* x = static_cast<const E*>(a);
  const E* y = static_cast<const E*>(b);
  const std::size_t words = n / K::kPerWord;
  if (d == x && d == y)
    body1<K>(d, words);
  else if (d == x)
    body2<K, true>(d, y, words);
  else if (d == y)
    body2<K, false>(d, x, words);
  else
    body3<K>(d, x, y, words);
  if constexpr (K::kPerWord > 1) {
    // The last n % kPerWord elements (an odd one for 16-bit pairs, up to three fp8 bytes)
    // go one by one through the low lane of a word whose other lanes are zero.
    for (std::size_t i = words * K::kPerWord; i < n; ++i)
      d[i] = static_cast<E>(K::apply(x[i], y[i]));  // x[i], y[i] read before d[i] is written
  }
}

// The two compiled copies of every kernel.
template <class K>
BRAID_NOINLINE void run_base(void* dst, const void* a, const void* b, std::size_t n) noexcept {
  run_body<K>(dst, a, b, n);
}
#if BRAID_X86_DISPATCH
template <class K>
BRAID_NOINLINE BRAID_TARGET_AVX2 void run_avx2(void* dst, const void* a, const void* b, std::size_t n) noexcept {
  run_body<K>(dst, a, b, n);
}
#endif

// ---------------------------------------------------------------------------------------
// CPU dispatch.

struct Cpu {
  bool avx2 = false;
  bool f16c = false;
};

// CPUID plus XGETBV (the OS must save YMM state for AVX code to be usable). Equivalent to
// __builtin_cpu_supports("avx2") / ("f16c"), which clang 14 does not all accept.
Cpu probe_cpu() noexcept {
  Cpu c;
#if BRAID_X86_DISPATCH
  unsigned a = 0, b = 0, cx = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &cx, &d)) return c;
  const bool osxsave = cx & (1u << 27), avx = cx & (1u << 28), f16c = cx & (1u << 29);
  if (!osxsave || !avx) return c;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0x6u) != 0x6u) return c;  // XMM and YMM state enabled by the OS
  c.f16c = f16c;
  if (__get_cpuid_count(7, 0, &a, &b, &cx, &d)) c.avx2 = b & (1u << 5);
#endif
  return c;
}

std::atomic<bool> g_force_portable{false};

Cpu cpu() noexcept {
  static const Cpu detected = probe_cpu();  // probed once, thread-safe
  if (g_force_portable.load(std::memory_order_relaxed)) return Cpu{};
  return detected;
}

template <class K>
void run(void* dst, const void* a, const void* b, std::size_t n) noexcept {
#if BRAID_X86_DISPATCH
  if (cpu().avx2) return run_avx2<K>(dst, a, b, n);
#endif
  run_base<K>(dst, a, b, n);
}

// ---------------------------------------------------------------------------------------
// f16 via F16C (AVX + F16C), 8 lanes per step. The tail goes through a padded block so
// that every element takes the same instructions. Loads precede the store within each
// block, so exact aliasing of d with a or b is fine.

#if BRAID_X86_DISPATCH
BRAID_TARGET_F16C BRAID_INLINE __m256 f16c_apply(ReduceOp op, __m256 x, __m256 y) noexcept {
  switch (op) {
    case ReduceOp::prod: return _mm256_mul_ps(x, y);
    case ReduceOp::min:  // vminps(x, y) = x < y ? x : y; then a NaN in x wins
      return _mm256_blendv_ps(_mm256_min_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    case ReduceOp::max:
      return _mm256_blendv_ps(_mm256_max_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    case ReduceOp::sum:
    case ReduceOp::avg:
    default: return _mm256_add_ps(x, y);
  }
}

constexpr int kF16cRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

template <ReduceOp kOp>
BRAID_TARGET_F16C BRAID_INLINE void f16c_block(std::uint16_t* d, const std::uint16_t* a,
                                               const std::uint16_t* b) noexcept {
  const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
  const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm256_cvtps_ph(f16c_apply(kOp, x, y), kF16cRound));
}

template <ReduceOp kOp>
BRAID_NOINLINE BRAID_TARGET_F16C void f16c_reduce(std::uint16_t* d, const std::uint16_t* a,
                                                  const std::uint16_t* b, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    f16c_block<kOp>(d + i, a + i, b + i);
    f16c_block<kOp>(d + i + 8, a + i + 8, b + i + 8);
  }
  for (; i + 8 <= n; i += 8) f16c_block<kOp>(d + i, a + i, b + i);
  if (i < n) {
    std::uint16_t ta[8] = {}, tb[8] = {}, td[8];
    std::memcpy(ta, a + i, (n - i) * 2);
    std::memcpy(tb, b + i, (n - i) * 2);
    f16c_block<kOp>(td, ta, tb);
    std::memcpy(d + i, td, (n - i) * 2);
  }
}

BRAID_NOINLINE BRAID_TARGET_F16C void f16c_divide(std::uint16_t* d, std::size_t n, float divisor) noexcept {
  const __m256 q = _mm256_set1_ps(divisor);
  auto block = [q](std::uint16_t* p) BRAID_TARGET_F16C {
    __m128i* v = reinterpret_cast<__m128i*>(p);
    _mm_storeu_si128(v, _mm256_cvtps_ph(_mm256_div_ps(_mm256_cvtph_ps(_mm_loadu_si128(v)), q), kF16cRound));
  };
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) block(d + i);
  if (i < n) {
    std::uint16_t t[8] = {};
    std::memcpy(t, d + i, (n - i) * 2);
    block(t);
    std::memcpy(d + i, t, (n - i) * 2);
  }
}
#endif

// ---------------------------------------------------------------------------------------

template <template <class> class KOf>
void dispatch_op(ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) noexcept {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
    case ReduceOp::premul_sum: run<KOf<Sum>>(dst, a, b, n); return;
    case ReduceOp::prod: run<KOf<Prod>>(dst, a, b, n); return;
    case ReduceOp::min: run<KOf<Min>>(dst, a, b, n); return;
    case ReduceOp::max: run<KOf<Max>>(dst, a, b, n); return;
  }
}

template <class T>
struct NativeOf {
  template <class Op>
  using K = NativeK<Op, T>;
};
template <class Op>
using HalfK = PairK<Op, HalfFmt>;
template <class Op>
using Bf16K = PairK<Op, Bf16Fmt>;
template <class Op>
using E4m3K = Fp8K<Op, BlockFormat::fp8e4m3>;
template <class Op>
using E5m2K = Fp8K<Op, BlockFormat::fp8e5m2>;

void reduce_half(ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) noexcept {
#if BRAID_X86_DISPATCH
  if (cpu().f16c) {
    auto* d = static_cast<std::uint16_t*>(dst);
    const auto* x = static_cast<const std::uint16_t*>(a);
    const auto* y = static_cast<const std::uint16_t*>(b);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
      case ReduceOp::premul_sum: f16c_reduce<ReduceOp::sum>(d, x, y, n); return;
      case ReduceOp::prod: f16c_reduce<ReduceOp::prod>(d, x, y, n); return;
      case ReduceOp::min: f16c_reduce<ReduceOp::min>(d, x, y, n); return;
      case ReduceOp::max: f16c_reduce<ReduceOp::max>(d, x, y, n); return;
    }
    return;
  }
#endif
  dispatch_op<HalfK>(op, dst, a, b, n);
}

// buf[i] /= q. Not hot (once per avg, on the final result), so one baseline copy; it
// still vectorises.
template <class T>
void divide_native(void* buf, std::size_t n, T q) noexcept {
  T* p = static_cast<T*>(buf);
  constexpr std::size_t B = 64 / sizeof(T);
  std::size_t i = 0;
  for (; i + B <= n; i += B)
    for (std::size_t j = 0; j < B; ++j) p[i + j] = p[i + j] / q;
  for (; i < n; ++i) p[i] = p[i] / q;
}

template <class Fmt>
void divide_pairs(void* buf, std::size_t n, float q) noexcept {
  auto* p = static_cast<std::uint16_t*>(buf);
  auto div = [q](std::uint32_t w) BRAID_INLINE_LAMBDA {
    return Fmt::round_lo(Fmt::lo(w) / q) | Fmt::round_hi(Fmt::hi(w) / q);
  };
  constexpr std::size_t B = 16;  // words per block
  const std::size_t words = n / 2;
  std::size_t w = 0;
  for (; w + B <= words; w += B)
    for (std::size_t j = 0; j < B; ++j) {
      std::uint32_t v;
      std::memcpy(&v, p + 2 * (w + j), 4);
      v = div(v);
      std::memcpy(p + 2 * (w + j), &v, 4);
    }
  for (std::size_t i = 2 * w; i < n; ++i) p[i] = static_cast<std::uint16_t>(div(p[i]));  // lo lane
}

template <BlockFormat F>
void divide_fp8(void* buf, std::size_t n, float q) noexcept {
  using C = fp8::Fp8<F>;
  auto* p = static_cast<std::uint8_t*>(buf);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(C::narrow(C::decode(p[i]) / q));
}

// Truncating division. x / -1 is a wrapping negation (INT_MIN / -1 would be UB), and a
// zero divisor leaves the data untouched rather than trapping.
template <class T>
void divide_int(void* buf, std::size_t n, int divisor) noexcept {
  T* p = static_cast<T*>(buf);
  if (divisor == 0 || divisor == 1) return;
  if (divisor == -1) {
    for (std::size_t i = 0; i < n; ++i)
      p[i] = static_cast<T>(static_cast<WrapT<T>>(WrapT<T>{0} - static_cast<WrapT<T>>(p[i])));
    return;
  }
  // i8/u8 promote to int (no overflow possible); i32/i64 cannot overflow with |d| >= 2.
  using W = std::conditional_t<(sizeof(T) < sizeof(std::int64_t)), std::int32_t, std::int64_t>;
  const W d = divisor;
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<W>(p[i]) / d);
}

// premul_sum's input scaling (not hot: one pass over the input), one baseline copy.
template <class T>
void scale_native(void* dst, const void* src, std::size_t n, T k) noexcept {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(src);
  for (std::size_t i = 0; i < n; ++i) d[i] = x[i] * k;
}

template <class Fmt>
void scale_16(void* dst, const void* src, std::size_t n, float k) noexcept {
  auto* d = static_cast<std::uint16_t*>(dst);
  const auto* x = static_cast<const std::uint16_t*>(src);
  for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<std::uint16_t>(Fmt::round_lo(Fmt::lo(x[i]) * k));
}

template <BlockFormat F>
void scale_fp8(void* dst, const void* src, std::size_t n, float k) noexcept {
  using C = fp8::Fp8<F>;
  auto* d = static_cast<std::uint8_t*>(dst);
  const auto* x = static_cast<const std::uint8_t*>(src);
  for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<std::uint8_t>(C::narrow(C::decode(x[i]) * k));
}

// reduce_scaled: a + scale(b), element by element, with scale()'s rounding of the product
// before the sum (what a scale pass into a temporary followed by reduce(sum) computes).
template <class T>
void reduce_scaled_native(void* dst, const void* a, const void* b, std::size_t n, T k) noexcept {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    const T scaled = y[i] * k;  // rounded here: no FMA is enabled for this file (see the top)
    d[i] = x[i] + scaled;
  }
}

template <class Fmt>
void reduce_scaled_16(void* dst, const void* a, const void* b, std::size_t n, float k) noexcept {
  auto* d = static_cast<std::uint16_t*>(dst);
  const auto* x = static_cast<const std::uint16_t*>(a);
  const auto* y = static_cast<const std::uint16_t*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t scaled = Fmt::round_lo(Fmt::lo(y[i]) * k);
    d[i] = static_cast<std::uint16_t>(Fmt::round_lo(Fmt::lo(x[i]) + Fmt::lo(scaled)));
  }
}

template <BlockFormat F>
void reduce_scaled_fp8(void* dst, const void* a, const void* b, std::size_t n, float k) noexcept {
  using C = fp8::Fp8<F>;
  auto* d = static_cast<std::uint8_t*>(dst);
  const auto* x = static_cast<const std::uint8_t*>(a);
  const auto* y = static_cast<const std::uint8_t*>(b);
  for (std::size_t i = 0; i < n; ++i)
    d[i] = static_cast<std::uint8_t>(C::narrow(C::decode(x[i]) + C::decode(C::narrow(C::decode(y[i]) * k))));
}

// An integral factor as a multiplier in T's wrapping type. The caller checked the factor;
// an out-of-range one still must not be UB here.
template <class T>
WrapT<T> wrap_factor(double factor) noexcept {
  const std::int64_t k = factor >= -9.2e18 && factor <= 9.2e18 ? static_cast<std::int64_t>(factor) : 0;
  return static_cast<WrapT<T>>(static_cast<std::uint64_t>(k));
}

template <class T>
void reduce_scaled_int(void* dst, const void* a, const void* b, std::size_t n, double factor) noexcept {
  using W = WrapT<T>;
  const W w = wrap_factor<T>(factor);
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i)
    d[i] = static_cast<T>(static_cast<W>(static_cast<W>(x[i]) + static_cast<W>(static_cast<W>(y[i]) * w)));
}

template <class T>
void scale_int(void* dst, const void* src, std::size_t n, double factor) noexcept {
  const auto w = wrap_factor<T>(factor);
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(src);
  for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<T>(static_cast<WrapT<T>>(static_cast<WrapT<T>>(x[i]) * w));
}

}  // namespace

void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b,
            std::size_t n) noexcept {
  switch (dtype) {
    case DataType::f32: dispatch_op<NativeOf<float>::K>(op, dst, a, b, n); return;
    case DataType::f64: dispatch_op<NativeOf<double>::K>(op, dst, a, b, n); return;
    case DataType::f16: reduce_half(op, dst, a, b, n); return;
    case DataType::bf16: dispatch_op<Bf16K>(op, dst, a, b, n); return;
    case DataType::i8: dispatch_op<NativeOf<std::int8_t>::K>(op, dst, a, b, n); return;
    case DataType::u8: dispatch_op<NativeOf<std::uint8_t>::K>(op, dst, a, b, n); return;
    case DataType::i32: dispatch_op<NativeOf<std::int32_t>::K>(op, dst, a, b, n); return;
    case DataType::i64: dispatch_op<NativeOf<std::int64_t>::K>(op, dst, a, b, n); return;
    case DataType::f8e4m3: dispatch_op<E4m3K>(op, dst, a, b, n); return;
    case DataType::f8e5m2: dispatch_op<E5m2K>(op, dst, a, b, n); return;
  }
}

void divide(DataType dtype, void* buf, std::size_t n, int divisor) noexcept {
  switch (dtype) {
    case DataType::f32: divide_native<float>(buf, n, static_cast<float>(divisor)); return;
    case DataType::f64: divide_native<double>(buf, n, static_cast<double>(divisor)); return;
    case DataType::f16:
#if BRAID_X86_DISPATCH
      if (cpu().f16c) {
        f16c_divide(static_cast<std::uint16_t*>(buf), n, static_cast<float>(divisor));
        return;
      }
#endif
      divide_pairs<HalfFmt>(buf, n, static_cast<float>(divisor));
      return;
    case DataType::bf16: divide_pairs<Bf16Fmt>(buf, n, static_cast<float>(divisor)); return;
    case DataType::i8: divide_int<std::int8_t>(buf, n, divisor); return;
    case DataType::u8: divide_int<std::uint8_t>(buf, n, divisor); return;
    case DataType::i32: divide_int<std::int32_t>(buf, n, divisor); return;
    case DataType::i64: divide_int<std::int64_t>(buf, n, divisor); return;
    case DataType::f8e4m3: divide_fp8<BlockFormat::fp8e4m3>(buf, n, static_cast<float>(divisor)); return;
    case DataType::f8e5m2: divide_fp8<BlockFormat::fp8e5m2>(buf, n, static_cast<float>(divisor)); return;
  }
}

void scale(DataType dtype, void* dst, const void* src, std::size_t n, double factor) noexcept {
  switch (dtype) {
    case DataType::f32: scale_native<float>(dst, src, n, static_cast<float>(factor)); return;
    case DataType::f64: scale_native<double>(dst, src, n, factor); return;
    case DataType::f16: scale_16<HalfFmt>(dst, src, n, static_cast<float>(factor)); return;
    case DataType::bf16: scale_16<Bf16Fmt>(dst, src, n, static_cast<float>(factor)); return;
    case DataType::i8: scale_int<std::int8_t>(dst, src, n, factor); return;
    case DataType::u8: scale_int<std::uint8_t>(dst, src, n, factor); return;
    case DataType::i32: scale_int<std::int32_t>(dst, src, n, factor); return;
    case DataType::i64: scale_int<std::int64_t>(dst, src, n, factor); return;
    case DataType::f8e4m3: scale_fp8<BlockFormat::fp8e4m3>(dst, src, n, static_cast<float>(factor)); return;
    case DataType::f8e5m2: scale_fp8<BlockFormat::fp8e5m2>(dst, src, n, static_cast<float>(factor)); return;
  }
}

void reduce_scaled(DataType dtype, void* dst, const void* a, const void* b, std::size_t n, double factor) noexcept {
  const auto kf = static_cast<float>(factor);
  switch (dtype) {
    case DataType::f32: reduce_scaled_native<float>(dst, a, b, n, kf); return;
    case DataType::f64: reduce_scaled_native<double>(dst, a, b, n, factor); return;
    case DataType::f16: reduce_scaled_16<HalfFmt>(dst, a, b, n, kf); return;
    case DataType::bf16: reduce_scaled_16<Bf16Fmt>(dst, a, b, n, kf); return;
    case DataType::i8: reduce_scaled_int<std::int8_t>(dst, a, b, n, factor); return;
    case DataType::u8: reduce_scaled_int<std::uint8_t>(dst, a, b, n, factor); return;
    case DataType::i32: reduce_scaled_int<std::int32_t>(dst, a, b, n, factor); return;
    case DataType::i64: reduce_scaled_int<std::int64_t>(dst, a, b, n, factor); return;
    case DataType::f8e4m3: reduce_scaled_fp8<BlockFormat::fp8e4m3>(dst, a, b, n, kf); return;
    case DataType::f8e5m2: reduce_scaled_fp8<BlockFormat::fp8e5m2>(dst, a, b, n, kf); return;
  }
}

float half_to_float(std::uint16_t h) noexcept { return h2f(h); }
std::uint16_t float_to_half(float f) noexcept { return static_cast<std::uint16_t>(f2h(f)); }
float bf16_to_float(std::uint16_t h) noexcept { return u2f(static_cast<std::uint32_t>(h) << 16); }
std::uint16_t float_to_bf16(float f) noexcept { return static_cast<std::uint16_t>(f2bf_hi(f) >> 16); }

const char* half_path() noexcept { return cpu().f16c ? "f16c" : "scalar"; }

void force_portable_path(bool on) noexcept { g_force_portable.store(on, std::memory_order_relaxed); }

}  // namespace braid::kernels
