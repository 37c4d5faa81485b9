// Proves the host reduction kernels (src/kernels/host/reduce.cpp) against independent
// scalar references: every dtype x op at awkward lengths, in-place aliasing, NaN/inf
// propagation, integer wrap-around, divide(), the f16/bf16 conversions (exhaustive
// over all 65536 bit patterns, and at every rounding tie), and fp8 (every pair of
// values, every op, against the exact result rounded once). The references below use
// double arithmetic and std::rint, not the bit tricks of the kernels.
#include "kernels/host/bits.hpp"
#include "kernels/host/reduce.hpp"

#include <gtest/gtest.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

using namespace braid;
using namespace braid::kernels;
using bits::f2u;
using bits::u2f;

namespace {

__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

constexpr std::size_t kLengths[] = {0, 1, 7, 1000, 4099};

// --- Reference conversions ------------------------------------------------------------

// binary16 -> float by its definition; NaN comes back quiet with the payload kept.
float ref_half_to_float(std::uint16_t h) {
  const bool neg = h & 0x8000;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 31) {
    if (m == 0) return neg ? -INFINITY : INFINITY;
    return u2f((neg ? 0x80000000u : 0u) | 0x7fc00000u | (static_cast<std::uint32_t>(m) << 13));
  }
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return static_cast<float>(neg ? -v : v);
}

// Rounds |x| to a binary format with `mbits` stored mantissa bits, exponent bias `bias`
// and an all-ones exponent field `emax_field` (inf/NaN), round-to-nearest-even via
// std::rint on an exactly scaled double. Returns the encoding without sign.
std::uint32_t ref_encode(double x, int mbits, int bias, int emax_field) {
  if (x == 0) return 0;
  const int emin = 1 - bias;
  int e;
  std::frexp(x, &e);  // x = f * 2^e, f in [0.5, 1)
  int E = std::max(e - 1, emin);
  double r = std::rint(std::ldexp(x, mbits - E));  // exact scaling, RNE
  const double one = std::ldexp(1.0, mbits);
  if (r >= 2 * one) {  // rounded up to the next binade
    r /= 2;
    ++E;
  }
  if (r < one) return static_cast<std::uint32_t>(r);  // subnormal (or zero)
  if (E + bias >= emax_field) return static_cast<std::uint32_t>(emax_field) << mbits;  // inf
  return (static_cast<std::uint32_t>(E + bias) << mbits) | static_cast<std::uint32_t>(r - one);
}

std::uint16_t ref_float_to_half(float f) {
  const std::uint32_t sign = (f2u(f) >> 16) & 0x8000u;
  if (std::isnan(f)) return static_cast<std::uint16_t>(sign | 0x7e00u | ((f2u(f) >> 13) & 0x3ffu));
  if (std::isinf(f)) return static_cast<std::uint16_t>(sign | 0x7c00u);
  return static_cast<std::uint16_t>(sign | ref_encode(std::fabs(static_cast<double>(f)), 10, 15, 31));
}

std::uint16_t ref_float_to_bf16(float f) {
  const std::uint32_t sign = (f2u(f) >> 16) & 0x8000u;
  if (std::isnan(f)) return static_cast<std::uint16_t>((f2u(f) >> 16) | 0x40u);
  if (std::isinf(f)) return static_cast<std::uint16_t>(sign | 0x7f80u);
  return static_cast<std::uint16_t>(sign | ref_encode(std::fabs(static_cast<double>(f)), 7, 127, 255));
}

float ref_bf16_to_float(std::uint16_t h) { return u2f(static_cast<std::uint32_t>(h) << 16); }

// OCP fp8 by its definition: E4M3 ("fn": bias 7, no inf, S.1111.111 NaN) when e4m3, else
// E5M2 (bias 15, IEEE-like).
double ref_fp8_value(std::uint8_t b, bool e4m3) {
  const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, efield = e4m3 ? 15 : 31;
  const int e = (b & 0x7f) >> mbits, m = b & ((1 << mbits) - 1);
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  if (e4m3 && (b & 0x7f) == 0x7f) return std::nan("");
  if (!e4m3 && e == efield) return m ? std::nan("") : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, 1 - bias - mbits);
  return sign * std::ldexp((1 << mbits) + m, e - bias - mbits);
}

// x rounded once to nearest even, saturating to the largest finite value (infinities
// too), NaN -> 0x7f: CUDA's __NV_SATFINITE conversion.
std::uint8_t ref_to_fp8(double x, bool e4m3) {
  const std::uint32_t maxcode = e4m3 ? 0x7e : 0x7b;
  if (std::isnan(x)) return 0x7f;
  const std::uint32_t sign = std::signbit(x) ? 0x80u : 0u;
  if (std::isinf(x)) return static_cast<std::uint8_t>(sign | maxcode);
  // e4m3 has no all-ones exponent for inf: 16 is never reached below 2^9, and anything
  // past the largest code saturates.
  std::uint32_t c = ref_encode(std::fabs(x), e4m3 ? 3 : 2, e4m3 ? 7 : 15, e4m3 ? 16 : 31);
  if (c > maxcode) c = maxcode;
  return static_cast<std::uint8_t>(sign | c);
}

bool is_fp8(DataType dt) { return dt == DataType::f8e4m3 || dt == DataType::f8e5m2; }

bool half_is_nan(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
bool bf16_is_nan(std::uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

// --- Reference reduction, one element -------------------------------------------------

template <class T>
T ref_float_op(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
    case ReduceOp::premul_sum: return a + b;
    case ReduceOp::prod: return a * b;
    case ReduceOp::min:
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
      return a < b ? a : b;
    case ReduceOp::max:
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
      return a > b ? a : b;
  }
  return T{};
}

// Integers: compute exactly in a wide type and wrap modulo 2^bits.
template <class T>
T ref_int_op(ReduceOp op, T a, T b) {
  using U = std::make_unsigned_t<T>;
  constexpr unsigned kBits = sizeof(T) * 8;
  const i128 x = a, y = b;
  i128 r = 0;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
    case ReduceOp::premul_sum: r = x + y; break;
    case ReduceOp::prod: {
      // |x*y| < 2^126 for 64-bit operands, so it fits.
      r = x * y;
      break;
    }
    case ReduceOp::min: r = x < y ? x : y; break;
    case ReduceOp::max: r = x > y ? x : y; break;
  }
  const u128 mask = (static_cast<u128>(1) << kBits) - 1;
  const U u = static_cast<U>(static_cast<u128>(r) & mask);
  T out;
  std::memcpy(&out, &u, sizeof out);
  return out;
}

// Reference for one element given raw storage, returned as raw storage.
template <class T>
T ref_elem(DataType dt, ReduceOp op, T a, T b) {
  if constexpr (std::is_same_v<T, std::uint16_t>) {
    if (dt == DataType::f16)
      return ref_float_to_half(ref_float_op(op, ref_half_to_float(a), ref_half_to_float(b)));
    if (dt == DataType::bf16)
      return ref_float_to_bf16(ref_float_op(op, ref_bf16_to_float(a), ref_bf16_to_float(b)));
  }
  if constexpr (std::is_same_v<T, std::uint8_t>) {
    if (is_fp8(dt)) {
      const bool e4 = dt == DataType::f8e4m3;
      return ref_to_fp8(ref_float_op(op, ref_fp8_value(a, e4), ref_fp8_value(b, e4)), e4);
    }
  }
  if constexpr (std::is_floating_point_v<T>)
    return ref_float_op(op, a, b);
  else
    return ref_int_op(op, a, b);
}

// Result equality: bitwise, except any NaN matches any NaN (payloads of arithmetic NaNs
// are the FPU's business), and +0 matches -0 for min/max (ties pick one operand).
template <class T>
bool same_result(DataType dt, ReduceOp op, T want, T got) {
  const bool minmax = op == ReduceOp::min || op == ReduceOp::max;
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
    if (minmax && want == 0 && got == 0) return true;
    return std::memcmp(&want, &got, sizeof(T)) == 0;
  } else if constexpr (std::is_same_v<T, std::uint16_t>) {
    if (dt == DataType::f16 || dt == DataType::bf16) {
      const bool wn = dt == DataType::f16 ? half_is_nan(want) : bf16_is_nan(want);
      const bool gn = dt == DataType::f16 ? half_is_nan(got) : bf16_is_nan(got);
      if (wn || gn) return wn && gn;
      if (minmax && (want & 0x7fff) == 0 && (got & 0x7fff) == 0) return true;
    }
    return want == got;
  } else {
    return want == got;
  }
}

// --- Test data ------------------------------------------------------------------------

template <class T>
std::vector<T> random_data(DataType dt, std::size_t n, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(n);
  for (auto& x : v) {
    if constexpr (std::is_floating_point_v<T>) {
      // Mixed magnitudes, both signs, some exact zeros; no NaN (tested separately).
      const int kind = static_cast<int>(rng() % 8);
      const double mant = std::uniform_real_distribution<double>(-2, 2)(rng);
      x = kind == 0 ? T(0) : static_cast<T>(std::ldexp(mant, static_cast<int>(rng() % 40) - 20));
    } else if constexpr (std::is_same_v<T, std::uint16_t>) {
      // Any non-NaN bit pattern: normals, subnormals, zeros, infinities.
      do {
        x = static_cast<std::uint16_t>(rng());
      } while (dt == DataType::f16 ? half_is_nan(x) : bf16_is_nan(x));
    } else {
      x = static_cast<T>(rng());  // full range, so sums and products wrap
    }
  }
  return v;
}

template <class T>
std::string show(T v) {
  if constexpr (std::is_floating_point_v<T>) return std::to_string(v);
  else return std::to_string(static_cast<long long>(v));
}

template <class T>
void check_reduce(DataType dt, ReduceOp op, std::size_t n, std::uint32_t seed) {
  const auto a = random_data<T>(dt, n, seed);
  const auto b = random_data<T>(dt, n, seed + 1);
  std::vector<T> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = ref_elem(dt, op, a[i], b[i]);

  // Guard elements past the end must stay untouched.
  const T guard = static_cast<T>(0x5a);
  std::vector<T> dst(n + 4, guard);
  reduce(dt, op, dst.data(), a.data(), b.data(), n);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_TRUE(same_result(dt, op, want[i], dst[i]))
        << to_string(dt) << " " << to_string(op) << " n=" << n << " i=" << i << " a=" << show(a[i])
        << " b=" << show(b[i]) << " want=" << show(want[i]) << " got=" << show(dst[i]);
  for (std::size_t i = n; i < n + 4; ++i) ASSERT_EQ(dst[i], guard) << "wrote past the end, n=" << n;
}

template <class T>
void check_aliasing(DataType dt, ReduceOp op, std::size_t n) {
  const auto a = random_data<T>(dt, n, 7);
  const auto b = random_data<T>(dt, n, 8);
  std::vector<T> separate(n);
  reduce(dt, op, separate.data(), a.data(), b.data(), n);

  auto in_a = a;  // dst == a
  reduce(dt, op, in_a.data(), in_a.data(), b.data(), n);
  auto in_b = b;  // dst == b
  reduce(dt, op, in_b.data(), a.data(), in_b.data(), n);
  auto self = a;  // dst == a == b
  reduce(dt, op, self.data(), self.data(), self.data(), n);
  std::vector<T> self_sep(n);  // a == b, dst separate
  reduce(dt, op, self_sep.data(), a.data(), a.data(), n);

  // In-place results are bitwise the separate-buffer results (same operand order).
  ASSERT_EQ(0, std::memcmp(in_a.data(), separate.data(), n * sizeof(T))) << to_string(dt) << " " << to_string(op);
  ASSERT_EQ(0, std::memcmp(in_b.data(), separate.data(), n * sizeof(T))) << to_string(dt) << " " << to_string(op);
  ASSERT_EQ(0, std::memcmp(self.data(), self_sep.data(), n * sizeof(T))) << to_string(dt) << " " << to_string(op);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(same_result(dt, op, ref_elem(dt, op, a[i], b[i]), separate[i])) << i;
    ASSERT_TRUE(same_result(dt, op, ref_elem(dt, op, a[i], a[i]), self[i])) << i;
  }
}

template <class F>
void for_each_dtype(DataType dt, F&& f) {
  switch (dt) {
    case DataType::f32: f(float{}); break;
    case DataType::f64: f(double{}); break;
    case DataType::f16:
    case DataType::bf16: f(std::uint16_t{}); break;
    case DataType::i8: f(std::int8_t{}); break;
    case DataType::u8: f(std::uint8_t{}); break;
    case DataType::i32: f(std::int32_t{}); break;
    case DataType::i64: f(std::int64_t{}); break;
    case DataType::f8e4m3:
    case DataType::f8e5m2: f(std::uint8_t{}); break;  // every byte: NaN and inf included
  }
}

// Independent of the library's CPUID probe where the compiler allows it.
bool cpu_has_f16c() {
#if (defined(__x86_64__) || defined(__i386__)) && !defined(__clang__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
#elif defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 28)) && (c & (1u << 29));
#else
  return false;
#endif
}

// Runs `body` once on the CPU's best paths (AVX2 loops, F16C where present) and once on
// the portable ones (baseline-ISA loops, scalar f16 conversions).
template <class F>
void for_each_path(F&& body) {
  force_portable_path(false);
  body(std::string("best (f16: ") + half_path() + ")");
  force_portable_path(true);
  body(std::string("portable (f16: ") + half_path() + ")");
  force_portable_path(false);
}

// --- Parameterised: every dtype x op x length -----------------------------------------

class ReduceAll : public ::testing::TestWithParam<std::tuple<int, int>> {};

// Every dtype x op at n = 0, 1, 7, 1000, 4099 equals the scalar reference, and writes
// nothing past n, on both the best and the portable code paths.
TEST_P(ReduceAll, MatchesScalarReference) {
  const auto dt = static_cast<DataType>(std::get<0>(GetParam()));
  const auto op = static_cast<ReduceOp>(std::get<1>(GetParam()));
  for_each_path([&](const std::string& path) {
    SCOPED_TRACE("path " + path);
    for (std::size_t n : kLengths)
      for_each_dtype(dt, [&](auto tag) { check_reduce<decltype(tag)>(dt, op, n, static_cast<std::uint32_t>(n) * 31 + 1); });
  });
}

// dst == a, dst == b and dst == a == b give the same bits as separate buffers.
TEST_P(ReduceAll, InPlaceAliasing) {
  const auto dt = static_cast<DataType>(std::get<0>(GetParam()));
  const auto op = static_cast<ReduceOp>(std::get<1>(GetParam()));
  for_each_path([&](const std::string& path) {
    SCOPED_TRACE("path " + path);
    for (std::size_t n : {std::size_t{7}, std::size_t{1000}, std::size_t{4099}})
      for_each_dtype(dt, [&](auto tag) { check_aliasing<decltype(tag)>(dt, op, n); });
  });
}

INSTANTIATE_TEST_SUITE_P(AllTypesOps, ReduceAll,
                         ::testing::Combine(::testing::Range(0, kNumDataTypes), ::testing::Range(0, kNumReduceOps)),
                         [](const auto& tp) {
                           return std::string(to_string(static_cast<DataType>(std::get<0>(tp.param)))) + "_" +
                                  std::string(to_string(static_cast<ReduceOp>(std::get<1>(tp.param))));
                         });

// --- Special values -------------------------------------------------------------------

// Builds vectors of length 37 (vector body + tail) with the special pair at `pos`.
template <class T, class Enc>
void check_special(DataType dt, ReduceOp op, float a, float b, float want, Enc enc, const char* what) {
  for (std::size_t pos : {std::size_t{0}, std::size_t{5}, std::size_t{33}, std::size_t{36}}) {
    std::vector<T> va(37, enc(1.0f)), vb(37, enc(2.0f)), out(37);
    va[pos] = enc(a);
    vb[pos] = enc(b);
    reduce(dt, op, out.data(), va.data(), vb.data(), va.size());
    ASSERT_TRUE(same_result(dt, op, enc(want), out[pos]))
        << to_string(dt) << " " << to_string(op) << " " << what << " at " << pos;
    // Neighbours are unaffected.
    const std::size_t other = pos == 0 ? 1 : 0;
    ASSERT_TRUE(same_result(dt, op, enc(ref_float_op(op, 1.0f, 2.0f)), out[other]));
  }
}

template <class T, class Enc>
void check_specials_for(DataType dt, Enc enc) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case { ReduceOp op; float a, b, want; const char* what; };
  const Case cases[] = {
      {ReduceOp::sum, nan, 1, nan, "NaN+1"},     {ReduceOp::sum, 1, nan, nan, "1+NaN"},
      {ReduceOp::sum, inf, 1, inf, "inf+1"},     {ReduceOp::sum, inf, -inf, nan, "inf-inf"},
      {ReduceOp::sum, -inf, -1, -inf, "-inf-1"}, {ReduceOp::prod, nan, 2, nan, "NaN*2"},
      {ReduceOp::prod, inf, 0, nan, "inf*0"},    {ReduceOp::avg, 1, nan, nan, "avg 1,NaN"},
      {ReduceOp::min, nan, 1, nan, "min NaN,1"}, {ReduceOp::min, 1, nan, nan, "min 1,NaN"},
      {ReduceOp::min, nan, -inf, nan, "min NaN,-inf"}, {ReduceOp::min, -inf, nan, nan, "min -inf,NaN"},
      {ReduceOp::min, -inf, 1, -inf, "min -inf,1"},    {ReduceOp::min, 3, inf, 3, "min 3,inf"},
      {ReduceOp::max, nan, 1, nan, "max NaN,1"}, {ReduceOp::max, 1, nan, nan, "max 1,NaN"},
      {ReduceOp::max, inf, nan, nan, "max inf,NaN"}, {ReduceOp::max, nan, inf, nan, "max NaN,inf"},
      {ReduceOp::max, inf, 1, inf, "max inf,1"},       {ReduceOp::max, -3, -inf, -3, "max -3,-inf"},
  };
  for (const auto& c : cases) check_special<T>(dt, c.op, c.a, c.b, c.want, enc, c.what);
}

// NaN and inf propagate through sum/prod/min/max for every floating type, in the vector
// body and the tail.
TEST(ReduceSpecials, NanAndInfPropagate) {
  for_each_path([&](const std::string& path) {
    SCOPED_TRACE("path " + path);
    check_specials_for<float>(DataType::f32, [](float f) { return f; });
    check_specials_for<double>(DataType::f64, [](float f) { return static_cast<double>(f); });
    check_specials_for<std::uint16_t>(DataType::bf16, [](float f) { return ref_float_to_bf16(f); });
    check_specials_for<std::uint16_t>(DataType::f16, [](float f) { return ref_float_to_half(f); });
  });
}

// min/max keep the operand order of a/b in every aliasing case: min(+0, -0) is b (-0)
// under minps semantics, so a swapped in-place variant would return +0.
TEST(ReduceSpecials, SignedZeroOperandOrderIsStable) {
  for_each_path([&](const std::string& path) {
    SCOPED_TRACE("path " + path);
    std::vector<float> a(40, 0.0f), b(40, -0.0f), sep(40);
    reduce(DataType::f32, ReduceOp::min, sep.data(), a.data(), b.data(), a.size());
    auto in_b = b;
    reduce(DataType::f32, ReduceOp::min, in_b.data(), a.data(), in_b.data(), a.size());
    auto in_a = a;
    reduce(DataType::f32, ReduceOp::min, in_a.data(), in_a.data(), b.data(), a.size());
    EXPECT_EQ(0, std::memcmp(sep.data(), in_b.data(), sep.size() * 4));
    EXPECT_EQ(0, std::memcmp(sep.data(), in_a.data(), sep.size() * 4));
    EXPECT_TRUE(std::signbit(sep[0]));
    EXPECT_TRUE(std::signbit(sep[39]));
    // Same for bf16 (+0 = 0x0000, -0 = 0x8000), through the paired-lane kernel.
    std::vector<std::uint16_t> ha(41, 0x0000), hb(41, 0x8000), hsep(41);
    reduce(DataType::bf16, ReduceOp::max, hsep.data(), ha.data(), hb.data(), ha.size());
    auto hin_b = hb;
    reduce(DataType::bf16, ReduceOp::max, hin_b.data(), ha.data(), hin_b.data(), ha.size());
    EXPECT_EQ(hsep, hin_b);
    EXPECT_EQ(hsep[0], 0x8000);
    EXPECT_EQ(hsep[40], 0x8000);
  });
}

// The best and portable paths agree bit for bit on every op for f16 and bf16, over every
// bit pattern as first operand, including subnormal, infinite and overflowing results
// (NaN results only need to be NaN on both: payload choice between two NaNs is free).
// premul_sum's input scaling: floats multiply once in their precision (f16/bf16 in f32,
// rounded once), integers wrap; in place gives the same bits.
TEST(Scale, EveryTypeAgainstAReference) {
  const std::size_t n = 1031;
  std::mt19937 rng(7);
  for (double factor : {0.5, -3.0, 1.0 / 3.0}) {
    std::vector<float> f(n), fo(n);
    std::vector<double> d(n), dout(n);
    std::vector<std::uint16_t> h(n), ho(n), b(n), bo(n);
    for (std::size_t i = 0; i < n; ++i) {
      f[i] = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 0.37f;
      d[i] = f[i];
      h[i] = float_to_half(f[i]);
      b[i] = float_to_bf16(f[i]);
    }
    scale(DataType::f32, fo.data(), f.data(), n, factor);
    scale(DataType::f64, dout.data(), d.data(), n, factor);
    scale(DataType::f16, ho.data(), h.data(), n, factor);
    scale(DataType::bf16, bo.data(), b.data(), n, factor);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(f2u(fo[i]), f2u(f[i] * static_cast<float>(factor))) << i;
      ASSERT_EQ(dout[i], d[i] * factor) << i;
      ASSERT_EQ(ho[i], float_to_half(half_to_float(h[i]) * static_cast<float>(factor))) << i;
      ASSERT_EQ(bo[i], float_to_bf16(bf16_to_float(b[i]) * static_cast<float>(factor))) << i;
    }
    std::vector<float> inplace = f;
    scale(DataType::f32, inplace.data(), inplace.data(), n, factor);
    ASSERT_EQ(0, std::memcmp(inplace.data(), fo.data(), n * sizeof(float)));
  }
  // fp8: every code times the factor, rounded once (satfinite) against the reference.
  for (DataType dt : {DataType::f8e4m3, DataType::f8e5m2}) {
    const bool e4 = dt == DataType::f8e4m3;
    std::uint8_t in[256], out[256];
    for (int c = 0; c < 256; ++c) in[c] = static_cast<std::uint8_t>(c);
    for (double factor : {0.5, -3.0, 100.0}) {
      scale(dt, out, in, 256, factor);
      for (int c = 0; c < 256; ++c) {
        const float want_v = ref_fp8_value(in[c], e4) * static_cast<float>(factor);
        ASSERT_TRUE(same_result(dt, ReduceOp::sum, ref_to_fp8(want_v, e4), out[c]))
            << to_string(dt) << " code " << c << " x " << factor;
      }
    }
  }
  // f16: scaling first keeps 2 x 40000 in range (the plain sum overflows to inf).
  const std::uint16_t big = float_to_half(40000.0f);
  std::uint16_t half_big = 0;
  scale(DataType::f16, &half_big, &big, 1, 0.5);
  EXPECT_EQ(half_to_float(half_big), 20000.0f);
  // Integers multiply and wrap in their width.
  const std::int8_t i8[] = {-128, -1, 0, 1, 63, 127};
  std::int8_t i8o[6];
  scale(DataType::i8, i8o, i8, 6, -3.0);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(i8o[i], static_cast<std::int8_t>(static_cast<std::uint8_t>(i8[i] * -3))) << i;
  const std::uint8_t u8[] = {0, 1, 100, 255};
  std::uint8_t u8o[4];
  scale(DataType::u8, u8o, u8, 4, 3.0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(u8o[i], static_cast<std::uint8_t>(u8[i] * 3)) << i;
  const std::int32_t i32[] = {-5, 7, 1 << 30};
  std::int32_t i32o[3];
  scale(DataType::i32, i32o, i32, 3, 4.0);
  EXPECT_EQ(i32o[0], -20);
  EXPECT_EQ(i32o[1], 28);
  EXPECT_EQ(i32o[2], 0);  // 2^32 wraps to 0
  const std::int64_t i64[] = {-5, 1ll << 40};
  std::int64_t i64o[2];
  scale(DataType::i64, i64o, i64, 2, -7.0);
  EXPECT_EQ(i64o[0], 35);
  EXPECT_EQ(i64o[1], -7ll * (1ll << 40));
}

// reduce_scaled(a, b) = a + scale(b): the same bits as scale() into a temporary then
// reduce(sum), for every type (NaN payloads aside), in place on either operand too.
TEST(ReduceScaled, EqualsScaleThenSum) {
  const std::size_t n = 777;
  std::mt19937 rng(3);
  for (int ti = 0; ti < kNumDataTypes; ++ti) {
    const auto dt = static_cast<DataType>(ti);
    const std::size_t es = dtype_size(dt);
    const double factor = is_floating(dt) ? 0.3 : -3.0;
    std::vector<unsigned char> a(n * es), b(n * es), tmp(n * es), want(n * es), got(n * es);
    for (auto& x : a) x = static_cast<unsigned char>(rng());
    for (auto& x : b) x = static_cast<unsigned char>(rng());
    if (dt == DataType::f32 || dt == DataType::f64 || dt == DataType::f16 || dt == DataType::bf16)
      for (std::size_t i = 0; i < n; ++i) {  // finite values, so that bits must match exactly
        const float va = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 0.37f;
        const float vb = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 0.11f;
        if (dt == DataType::f32) { std::memcpy(&a[i * 4], &va, 4); std::memcpy(&b[i * 4], &vb, 4); }
        if (dt == DataType::f64) { const double da = va, db = vb; std::memcpy(&a[i * 8], &da, 8); std::memcpy(&b[i * 8], &db, 8); }
        if (dt == DataType::f16) { const auto ha = float_to_half(va), hb = float_to_half(vb); std::memcpy(&a[i * 2], &ha, 2); std::memcpy(&b[i * 2], &hb, 2); }
        if (dt == DataType::bf16) { const auto ha = float_to_bf16(va), hb = float_to_bf16(vb); std::memcpy(&a[i * 2], &ha, 2); std::memcpy(&b[i * 2], &hb, 2); }
      }
    if (dt == DataType::f8e4m3 || dt == DataType::f8e5m2)
      for (auto& x : b) x = static_cast<unsigned char>(x & 0xf7);  // some NaN codes out, to compare bits
    scale(dt, tmp.data(), b.data(), n, factor);
    reduce(dt, ReduceOp::sum, want.data(), a.data(), tmp.data(), n);
    reduce_scaled(dt, got.data(), a.data(), b.data(), n, factor);
    for (std::size_t i = 0; i < n; ++i) {
      const bool fp8_nan = (dt == DataType::f8e4m3 || dt == DataType::f8e5m2) && (want[i] & 0x7f) == 0x7f;
      if (fp8_nan) continue;
      ASSERT_EQ(0, std::memcmp(&want[i * es], &got[i * es], es)) << to_string(dt) << " element " << i;
    }
    std::vector<unsigned char> inplace = a;
    reduce_scaled(dt, inplace.data(), inplace.data(), b.data(), n, factor);
    std::vector<unsigned char> inplace_b = b;
    reduce_scaled(dt, inplace_b.data(), a.data(), inplace_b.data(), n, factor);
    for (std::size_t i = 0; i < n; ++i) {
      if ((dt == DataType::f8e4m3 || dt == DataType::f8e5m2) && (want[i] & 0x7f) == 0x7f) continue;
      ASSERT_EQ(0, std::memcmp(&inplace[i * es], &got[i * es], es)) << to_string(dt) << " in place on a, element " << i;
      ASSERT_EQ(0, std::memcmp(&inplace_b[i * es], &got[i * es], es)) << to_string(dt) << " in place on b, element " << i;
    }
  }
}

TEST(ReduceHalf, PathsAgreeBitwise) {
  const std::size_t n = 65536 + 3;
  std::vector<std::uint16_t> a(n), b(n);
  std::mt19937 rng(99);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = static_cast<std::uint16_t>(i);  // every bit pattern once
    b[i] = static_cast<std::uint16_t>(rng());
  }
  for (DataType dt : {DataType::f16, DataType::bf16}) {
    auto is_nan = dt == DataType::f16 ? half_is_nan : bf16_is_nan;
    for (int o = 0; o < kNumReduceOps; ++o) {
      const auto op = static_cast<ReduceOp>(o);
      std::vector<std::uint16_t> fast(n), slow(n);
      force_portable_path(false);
      reduce(dt, op, fast.data(), a.data(), b.data(), n);
      force_portable_path(true);
      reduce(dt, op, slow.data(), a.data(), b.data(), n);
      force_portable_path(false);
      for (std::size_t i = 0; i < n; ++i) {
        if (is_nan(fast[i]) || is_nan(slow[i])) {
          ASSERT_TRUE(is_nan(fast[i]) && is_nan(slow[i])) << i;
        } else {
          ASSERT_EQ(fast[i], slow[i]) << to_string(dt) << " " << to_string(op) << " a=" << a[i] << " b=" << b[i];
        }
      }
    }
  }
}

TEST(ReduceHalf, HalfPathNamesTheCpuPath) {
  force_portable_path(false);
  EXPECT_STREQ(half_path(), cpu_has_f16c() ? "f16c" : "scalar");
  force_portable_path(true);
  EXPECT_STREQ(half_path(), "scalar");
  force_portable_path(false);
}

// f16/bf16 arithmetic rounds once, to nearest even, after the f32 operation.
// Length 41 with the probes at index 8 (vector body) and 40 (tail) on every path.
TEST(ReduceHalf, SumRoundsToNearestEven) {
  constexpr std::size_t n = 41;
  for_each_path([&](const std::string& path) {
    SCOPED_TRACE("path " + path);
    // 2048 + 1 = 2049 is a tie between 2048 and 2050 in f16 (ulp 2): even mantissa wins.
    // 2050 + 1 = 2051 is a tie between 2050 and 2052: 2052 has the even mantissa.
    std::vector<std::uint16_t> a(n, float_to_half(2048)), b(n, float_to_half(1)), out(n);
    a[8] = a[40] = float_to_half(2050);
    reduce(DataType::f16, ReduceOp::sum, out.data(), a.data(), b.data(), n);
    EXPECT_EQ(half_to_float(out[0]), 2048.0f);
    EXPECT_EQ(half_to_float(out[39]), 2048.0f);
    EXPECT_EQ(half_to_float(out[8]), 2052.0f);
    EXPECT_EQ(half_to_float(out[40]), 2052.0f);
    // 65504 (max) + 16 = 65520 rounds up to inf; 65504 + 15 stays at max.
    std::vector<std::uint16_t> m(n, float_to_half(65504)), c(n, float_to_half(16)), o2(n);
    c[8] = c[40] = float_to_half(15);
    reduce(DataType::f16, ReduceOp::sum, o2.data(), m.data(), c.data(), n);
    EXPECT_EQ(o2[0], 0x7c00);
    EXPECT_EQ(o2[8], 0x7bff);
    EXPECT_EQ(o2[40], 0x7bff);
    // Subnormals: 2^-24 + 2^-24 = 2^-23 exactly (bits 1 + 1 = 2); 0x03ff + 0x0001 = 0x0400
    // crosses into the normals.
    std::vector<std::uint16_t> s1(n, 0x0001), s2(n, 0x0001), o3(n);
    s1[8] = s1[40] = 0x03ff;
    reduce(DataType::f16, ReduceOp::sum, o3.data(), s1.data(), s2.data(), n);
    EXPECT_EQ(o3[0], 0x0002);
    EXPECT_EQ(o3[8], 0x0400);
    EXPECT_EQ(o3[40], 0x0400);
    // bf16: 256 + 1 is a tie between 256 and 258 (ulp 2) -> 256; 258 + 1 -> 260.
    std::vector<std::uint16_t> ba(n, float_to_bf16(256)), bb(n, float_to_bf16(1)), bo(n);
    ba[8] = ba[40] = float_to_bf16(258);
    reduce(DataType::bf16, ReduceOp::sum, bo.data(), ba.data(), bb.data(), n);
    EXPECT_EQ(bf16_to_float(bo[0]), 256.0f);
    EXPECT_EQ(bf16_to_float(bo[8]), 260.0f);
    EXPECT_EQ(bf16_to_float(bo[40]), 260.0f);
  });
}

// --- fp8 ------------------------------------------------------------------------------

// Every pair of fp8 values (2^16, NaNs and e5m2's infinities included) under every op, on
// every path, equals the exact result (double holds every sum and product of two fp8
// values exactly) rounded once: so widening to f32 and rounding back loses nothing to
// double rounding, saturates and keeps NaN a NaN.
TEST(ReduceFp8, EveryPairMatchesTheExactResultRoundedOnce) {
  constexpr std::size_t n = 65536;
  std::vector<std::uint8_t> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = static_cast<std::uint8_t>(i);
    b[i] = static_cast<std::uint8_t>(i >> 8);
  }
  for_each_path([&](const std::string& path) {
    SCOPED_TRACE("path " + path);
    for (DataType dt : {DataType::f8e4m3, DataType::f8e5m2}) {
      const bool e4 = dt == DataType::f8e4m3;
      for (int o = 0; o < kNumReduceOps; ++o) {
        const auto op = static_cast<ReduceOp>(o);
        std::vector<std::uint8_t> out(n);
        reduce(dt, op, out.data(), a.data(), b.data(), n);
        for (std::size_t i = 0; i < n; ++i) {
          const double x = ref_fp8_value(a[i], e4), y = ref_fp8_value(b[i], e4);
          double exact = 0;
          switch (op) {
            case ReduceOp::sum:
            case ReduceOp::avg:
            case ReduceOp::premul_sum: exact = x + y; break;
            case ReduceOp::prod: exact = x * y; break;
            case ReduceOp::min: exact = std::isnan(x) || std::isnan(y) ? NAN : (x < y ? x : y); break;
            case ReduceOp::max: exact = std::isnan(x) || std::isnan(y) ? NAN : (x > y ? x : y); break;
          }
          ASSERT_EQ(out[i], ref_to_fp8(exact, e4))
              << to_string(dt) << " " << to_string(op) << std::hex << " a=0x" << int{a[i]} << " b=0x" << int{b[i]};
        }
      }
    }
  });
}

// The documented edges, by value: saturation instead of NaN/inf, ties to even, NaN -> 0x7f.
TEST(ReduceFp8, SaturatesRoundsToEvenAndCanonicalisesNan) {
  auto one = [](DataType dt, ReduceOp op, std::uint8_t x, std::uint8_t y) {
    std::vector<std::uint8_t> va(131, x), vb(131, y), out(131);  // vector body and tail
    reduce(dt, op, out.data(), va.data(), vb.data(), va.size());
    EXPECT_EQ(out[0], out[130]);
    return out[130];
  };
  const auto e4 = DataType::f8e4m3, e5 = DataType::f8e5m2;
  for_each_path([&](const std::string& path) {
    SCOPED_TRACE("path " + path);
    EXPECT_EQ(one(e4, ReduceOp::sum, 0x7e, 0x7e), 0x7e);  // 448 + 448 -> 448, not NaN
    EXPECT_EQ(one(e4, ReduceOp::sum, 0xfe, 0xfe), 0xfe);  // -448 - 448 -> -448
    EXPECT_EQ(one(e4, ReduceOp::sum, 0x7e, 0x50), 0x7e);  // 448 + 8 = 456 -> 448
    EXPECT_EQ(one(e4, ReduceOp::sum, 0x38, 0x18), 0x38);  // 1 + 1/16: tie -> 1 (even)
    EXPECT_EQ(one(e4, ReduceOp::sum, 0x39, 0x18), 0x3a);  // 1.125 + 1/16: tie -> 1.25 (even)
    EXPECT_EQ(one(e4, ReduceOp::prod, 0x01, 0x30), 0x00);  // 2^-9 * 0.5: tie -> 0
    EXPECT_EQ(one(e4, ReduceOp::max, 0xff, 0x38), 0x7f);  // NaN wins, as 0x7f
    EXPECT_EQ(one(e4, ReduceOp::min, 0x38, 0xff), 0x7f);
    EXPECT_EQ(one(e5, ReduceOp::sum, 0x7b, 0x7b), 0x7b);  // 57344 + 57344 -> 57344
    EXPECT_EQ(one(e5, ReduceOp::sum, 0x7c, 0x3c), 0x7b);  // inf + 1 -> 57344 (satfinite)
    EXPECT_EQ(one(e5, ReduceOp::max, 0xfc, 0xfc), 0xfb);  // -inf -> -57344
    EXPECT_EQ(one(e5, ReduceOp::sum, 0x7c, 0xfc), 0x7f);  // inf - inf = NaN -> 0x7f
    EXPECT_EQ(one(e5, ReduceOp::sum, 0xfe, 0x3c), 0x7f);  // -NaN (0xfe) -> 0x7f
    EXPECT_EQ(one(e5, ReduceOp::sum, 0x3c, 0x30), 0x3c);  // 1 + 1/8: tie -> 1 (even)
    EXPECT_EQ(one(e5, ReduceOp::sum, 0x3d, 0x30), 0x3e);  // 1.25 + 1/8: tie -> 1.5 (even)
  });
}

// --- Integer wrap -----------------------------------------------------------------------

template <class T>
T reduce1(DataType dt, ReduceOp op, T a, T b) {
  // Length 131: two 64-byte blocks of i8 plus a tail, so the value goes through the
  // vector body and the scalar tail of every type.
  std::vector<T> va(131, a), vb(131, b), out(131);
  reduce(dt, op, out.data(), va.data(), vb.data(), 131);
  EXPECT_EQ(out[0], out[130]);
  return out[0];
}

TEST(ReduceInt, SumAndProdWrap) {
  for_each_path([&](const std::string& path) {
    SCOPED_TRACE("path " + path);
    using L8 = std::numeric_limits<std::int8_t>;
    using L32 = std::numeric_limits<std::int32_t>;
    using L64 = std::numeric_limits<std::int64_t>;
    EXPECT_EQ(reduce1<std::int8_t>(DataType::i8, ReduceOp::sum, L8::max(), 1), L8::min());
    EXPECT_EQ(reduce1<std::int8_t>(DataType::i8, ReduceOp::prod, -128, -1), -128);
    EXPECT_EQ(reduce1<std::int8_t>(DataType::i8, ReduceOp::prod, 16, 16), 0);
    EXPECT_EQ(reduce1<std::uint8_t>(DataType::u8, ReduceOp::sum, 255, 3), 2);
    EXPECT_EQ(reduce1<std::uint8_t>(DataType::u8, ReduceOp::prod, 255, 255), 1);
    EXPECT_EQ(reduce1<std::int32_t>(DataType::i32, ReduceOp::sum, L32::max(), 1), L32::min());
    EXPECT_EQ(reduce1<std::int32_t>(DataType::i32, ReduceOp::avg, L32::min(), -1), L32::max());
    EXPECT_EQ(reduce1<std::int32_t>(DataType::i32, ReduceOp::prod, 65536, 65536), 0);
    EXPECT_EQ(reduce1<std::int32_t>(DataType::i32, ReduceOp::prod, L32::min(), -1), L32::min());
    EXPECT_EQ(reduce1<std::int64_t>(DataType::i64, ReduceOp::sum, L64::max(), 1), L64::min());
    EXPECT_EQ(reduce1<std::int64_t>(DataType::i64, ReduceOp::prod, std::int64_t{1} << 32, std::int64_t{1} << 32), 0);
    EXPECT_EQ(reduce1<std::int64_t>(DataType::i64, ReduceOp::prod, L64::min(), -1), L64::min());
    // min/max are signed for signed types and unsigned for u8.
    EXPECT_EQ(reduce1<std::int8_t>(DataType::i8, ReduceOp::min, -1, 1), -1);
    EXPECT_EQ(reduce1<std::uint8_t>(DataType::u8, ReduceOp::min, 255, 1), 1);
    EXPECT_EQ(reduce1<std::int64_t>(DataType::i64, ReduceOp::max, L64::min(), -1), -1);
  });
}

// --- divide ---------------------------------------------------------------------------

template <class T>
std::vector<T> divided(DataType dt, std::vector<T> v, int d) {
  divide(dt, v.data(), v.size(), d);
  return v;
}

TEST(Divide, IntegersTruncateTowardZero) {
  const auto i32 = divided<std::int32_t>(DataType::i32, {7, -7, 8, -8, 1, -1, 0, std::numeric_limits<std::int32_t>::min()}, 2);
  EXPECT_EQ(i32, (std::vector<std::int32_t>{3, -3, 4, -4, 0, 0, 0, -1073741824}));
  EXPECT_EQ(divided<std::int8_t>(DataType::i8, {-128, 127, -7, 7, 5}, 3), (std::vector<std::int8_t>{-42, 42, -2, 2, 1}));
  EXPECT_EQ(divided<std::uint8_t>(DataType::u8, {255, 7, 2}, 3), (std::vector<std::uint8_t>{85, 2, 0}));
  EXPECT_EQ(divided<std::int64_t>(DataType::i64, {-9, 9, std::numeric_limits<std::int64_t>::min()}, 4),
            (std::vector<std::int64_t>{-2, 2, std::numeric_limits<std::int64_t>::min() / 4}));
  // Negative divisors, and the one overflowing quotient (MIN / -1) wraps instead of trapping.
  EXPECT_EQ(divided<std::int32_t>(DataType::i32, {7, -7, std::numeric_limits<std::int32_t>::min()}, -1),
            (std::vector<std::int32_t>{-7, 7, std::numeric_limits<std::int32_t>::min()}));
  EXPECT_EQ(divided<std::int64_t>(DataType::i64, {7, std::numeric_limits<std::int64_t>::min()}, -1),
            (std::vector<std::int64_t>{-7, std::numeric_limits<std::int64_t>::min()}));
  EXPECT_EQ(divided<std::int8_t>(DataType::i8, {-128, 9}, -2), (std::vector<std::int8_t>{64, -4}));
}

// Every length, random data: divide equals the reference for every dtype.
TEST(Divide, MatchesReferenceAllTypes) {
  for_each_path([&](const std::string& path) {
    SCOPED_TRACE("path " + path);
    for (std::size_t n : kLengths) {
      for (int d : {3, 8, 7}) {
        {
          const auto v = random_data<float>(DataType::f32, n, 5);
          const auto r = divided(DataType::f32, v, d);
          for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(f2u(r[i]), f2u(v[i] / static_cast<float>(d)));
        }
        {
          const auto v = random_data<double>(DataType::f64, n, 6);
          const auto r = divided(DataType::f64, v, d);
          for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(r[i], v[i] / d);
        }
        for (DataType dt : {DataType::f16, DataType::bf16}) {
          const auto v = random_data<std::uint16_t>(dt, n, 9);
          const auto r = divided(dt, v, d);
          for (std::size_t i = 0; i < n; ++i) {
            const std::uint16_t want = dt == DataType::f16
                ? ref_float_to_half(ref_half_to_float(v[i]) / static_cast<float>(d))
                : ref_float_to_bf16(ref_bf16_to_float(v[i]) / static_cast<float>(d));
            ASSERT_EQ(r[i], want) << to_string(dt) << " n=" << n << " i=" << i << " v=" << v[i] << " d=" << d;
          }
        }
        for (DataType dt : {DataType::f8e4m3, DataType::f8e5m2}) {
          const auto v = random_data<std::uint8_t>(dt, n, 14);
          const auto r = divided(dt, v, d);
          const bool e4 = dt == DataType::f8e4m3;
          for (std::size_t i = 0; i < n; ++i)
            ASSERT_EQ(r[i], ref_to_fp8(ref_fp8_value(v[i], e4) / d, e4))
                << to_string(dt) << " n=" << n << " i=" << i << " v=" << int{v[i]} << " d=" << d;
        }
        {
          const auto v = random_data<std::int32_t>(DataType::i32, n, 10);
          const auto r = divided(DataType::i32, v, d);
          for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(r[i], v[i] / d);
        }
        {
          const auto v = random_data<std::int64_t>(DataType::i64, n, 11);
          const auto r = divided(DataType::i64, v, d);
          for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(r[i], v[i] / d);
        }
        {
          const auto v = random_data<std::int8_t>(DataType::i8, n, 12);
          const auto r = divided(DataType::i8, v, d);
          for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(r[i], static_cast<std::int8_t>(v[i] / d));
        }
        {
          const auto v = random_data<std::uint8_t>(DataType::u8, n, 13);
          const auto r = divided(DataType::u8, v, d);
          for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(r[i], static_cast<std::uint8_t>(v[i] / d));
        }
      }
    }
  });
}

TEST(Divide, FloatsKeepSpecialsAndRound) {
  const float inf = std::numeric_limits<float>::infinity();
  const auto f = divided<float>(DataType::f32, {7.0f, -inf, std::nanf(""), 1.0f}, 2);
  EXPECT_EQ(f[0], 3.5f);
  EXPECT_EQ(f[1], -inf);
  EXPECT_TRUE(std::isnan(f[2]));
  EXPECT_EQ(f[3], 0.5f);
  for_each_path([&](const std::string& path) {
    SCOPED_TRACE("path " + path);
    // 1/3 in f32 then RNE to f16: 0x3555 (0.33325195...).
    const auto h = divided<std::uint16_t>(DataType::f16, std::vector<std::uint16_t>(41, 0x3c00), 3);
    for (auto x : h) EXPECT_EQ(x, 0x3555);
    // Smallest subnormal / 2 is a tie between 0 and 2^-24: rounds to even (0).
    const auto s = divided<std::uint16_t>(DataType::f16, std::vector<std::uint16_t>(41, 0x0001), 2);
    EXPECT_EQ(s[0], 0x0000);
    EXPECT_EQ(s[40], 0x0000);
    // 3 * 2^-24 / 2 = 1.5 * 2^-24: a tie between 1 and 2 ulps -> 2 (even).
    const auto t = divided<std::uint16_t>(DataType::f16, std::vector<std::uint16_t>(41, 0x0003), 2);
    EXPECT_EQ(t[0], 0x0002);
    EXPECT_EQ(t[40], 0x0002);
  });
  const auto bf = divided<std::uint16_t>(DataType::bf16, std::vector<std::uint16_t>(41, 0x3f80), 3);
  EXPECT_EQ(bf[0], 0x3eab);  // 1/3 = 0x3eaaaaab in f32 -> RNE to bf16
  EXPECT_EQ(bf[40], 0x3eab);
}

// --- Conversions ------------------------------------------------------------------------

// Every binary16 pattern: half->float is exact (matches the definition bit for bit,
// NaNs quieted with payload kept) and half->float->half is the identity (NaNs quieted).
TEST(HalfConversion, ExhaustiveRoundTrip) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto x = static_cast<std::uint16_t>(h);
    const float f = half_to_float(x);
    ASSERT_EQ(f2u(f), f2u(ref_half_to_float(x))) << std::hex << h;
    const std::uint16_t back = float_to_half(f);
    if (half_is_nan(x)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(back, x | 0x0200) << std::hex << h;  // quiet bit set, sign and payload kept
    } else {
      ASSERT_EQ(back, x) << std::hex << h;
    }
  }
}

// Around every f16 rounding boundary (each half value, the midpoints between neighbours,
// and one float ulp either side), for every exponent from below the subnormals to past
// overflow: float_to_half equals the rint-based reference.
TEST(HalfConversion, RoundingAtTiesMatchesReference) {
  std::size_t ties = 0;
  for (int fexp = 90; fexp <= 145; ++fexp) {        // 2^-37 .. 2^18: below subnormals to overflow
    for (std::uint32_t m = 0; m < (1u << 23); m += (1u << 13)) {  // each f16 mantissa step
      for (std::uint32_t low : {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu, 0x7ffu, 0x801u}) {
        for (std::uint32_t sign : {0u, 0x80000000u}) {
          const float f = u2f(sign | (static_cast<std::uint32_t>(fexp) << 23) | m | low);
          ASSERT_EQ(float_to_half(f), ref_float_to_half(f)) << std::hexfloat << f;
        }
      }
    }
  }
  // Explicit midpoints between consecutive finite halves: the even neighbour wins.
  for (std::uint32_t h = 0; h < 0x7bff; ++h) {
    const double lo = ref_half_to_float(static_cast<std::uint16_t>(h));
    const double hi = ref_half_to_float(static_cast<std::uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: needs 12 bits
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const std::uint16_t even = (h & 1) ? static_cast<std::uint16_t>(h + 1) : static_cast<std::uint16_t>(h);
    ASSERT_EQ(float_to_half(mid), even) << std::hex << h;
    ASSERT_EQ(float_to_half(-mid), even | 0x8000) << std::hex << h;
    ++ties;
  }
  EXPECT_EQ(ties, 0x7bffu);
  // Overflow and specials.
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.996f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_half(-1e30f), 0xfc00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);     // tie -> even (0)
  EXPECT_EQ(float_to_half(0x1.8p-24f), 0x0002);   // tie -> even (2)
  EXPECT_EQ(float_to_half(0x1.ffcp-15f), 0x0400); // rounds up into the smallest normal
  EXPECT_EQ(float_to_half(u2f(0x7f800001u)), 0x7e00);  // signaling NaN -> quiet
  EXPECT_EQ(float_to_half(u2f(0xffc02000u)), 0xfe01);  // sign and top payload kept
}

// The F16C hardware conversion is a second reference: squares of random halves (every
// rounding case, subnormal and overflowing results) round the same on both paths.
TEST(HalfConversion, ScalarMatchesF16cOnRandomFloats) {
  if (!cpu_has_f16c()) GTEST_SKIP() << "CPU has no AVX+F16C";
  std::mt19937 rng(3);
  std::vector<std::uint16_t> a(4096), fast(4096), slow(4096);
  for (int rep = 0; rep < 256; ++rep) {
    for (auto& x : a) x = static_cast<std::uint16_t>(rng());
    force_portable_path(false);
    reduce(DataType::f16, ReduceOp::prod, fast.data(), a.data(), a.data(), a.size());
    force_portable_path(true);
    reduce(DataType::f16, ReduceOp::prod, slow.data(), a.data(), a.data(), a.size());
    force_portable_path(false);
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(fast[i], slow[i]) << std::hex << a[i];  // x*x: no NaN-payload ambiguity
      const float sq = half_to_float(a[i]) * half_to_float(a[i]);
      ASSERT_EQ(slow[i], ref_float_to_half(sq)) << std::hex << a[i];
    }
  }
}

// Every bfloat16 pattern: bf16->float is the exact bit extension, and the round trip is
// the identity (NaNs quieted).
TEST(Bf16Conversion, ExhaustiveRoundTrip) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto x = static_cast<std::uint16_t>(h);
    const float f = bf16_to_float(x);
    ASSERT_EQ(f2u(f), h << 16);
    const std::uint16_t back = float_to_bf16(f);
    if (bf16_is_nan(x))
      ASSERT_EQ(back, x | 0x40) << std::hex << h;
    else
      ASSERT_EQ(back, x) << std::hex << h;
  }
}

TEST(Bf16Conversion, RoundingAtTiesMatchesReference) {
  for (int fexp = 0; fexp <= 255; ++fexp) {
    for (std::uint32_t m = 0; m < (1u << 23); m += (1u << 16) * 3) {
      for (std::uint32_t low : {0x0u, 0x1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x10000u, 0x18000u}) {
        for (std::uint32_t sign : {0u, 0x80000000u}) {
          const float f = u2f(sign | (static_cast<std::uint32_t>(fexp) << 23) | ((m | low) & 0x7fffffu));
          ASSERT_EQ(float_to_bf16(f), ref_float_to_bf16(f)) << std::hexfloat << f;
        }
      }
    }
  }
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);          // tie -> even (down)
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);      // tie -> even (up)
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflow -> inf
  EXPECT_EQ(float_to_bf16(u2f(0x00008000u)), 0x0000);    // subnormal tie -> even
  EXPECT_EQ(float_to_bf16(u2f(0x00018000u)), 0x0002);
  EXPECT_EQ(float_to_bf16(u2f(0x7f800001u)), 0x7fc0);    // signaling NaN -> quiet
  EXPECT_EQ(float_to_bf16(u2f(0xff810000u)), 0xffc1);
}

}  // namespace
