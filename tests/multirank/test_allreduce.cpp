// All-reduce across ranks running as threads of this process, over every transport
// of the build and auto (test::grid) x world sizes x counts {0, 1, odd, large} x every
// dtype x every op, in-place and out-of-place. Results must be bitwise identical
// on every rank and equal to a reference: exact for integers and min/max; for sums
// within (n-1)·u·Σ|x| (u = unit roundoff of the type: each of the n-1 additions on
// the way rounds once), for avg that bound / n plus one rounding, for prod within
// (n-1)·u·|result| (docs/algorithms.md). fp8 rounds so coarsely (u = 2^-4, 2^-3) that
// the first-order bounds are replaced by γ(n-1) = (n-1)u / (1 - (n-1)u), plus the
// absolute error of results in the subnormal range.
#include "core/unique_id.hpp"
#include "kernels/host/codec_kernels.hpp"
#include "kernels/host/reduce.hpp"
#include "test_support.hpp"

#include <braid/braid.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

using namespace braid;
using braid::test::Group;
using braid::test::run_threads;

namespace {


double unit_roundoff(DataType t) {
  switch (t) {
    case DataType::f32: return std::ldexp(1.0, -24);
    case DataType::f64: return std::ldexp(1.0, -53);
    case DataType::f16: return std::ldexp(1.0, -11);
    case DataType::bf16: return std::ldexp(1.0, -8);
    case DataType::f8e4m3: return std::ldexp(1.0, -4);
    case DataType::f8e5m2: return std::ldexp(1.0, -3);
    default: return 0;
  }
}

// Half the smallest subnormal: the absolute error of one rounding near zero.
double underflow_error(DataType t) {
  switch (t) {
    case DataType::f8e4m3: return std::ldexp(1.0, -10);
    case DataType::f8e5m2: return std::ldexp(1.0, -17);
    default: return 0;  // the fill keeps the other types' results far from their subnormals
  }
}

kernels::BlockFormat fp8_format(DataType t) {
  return t == DataType::f8e4m3 ? kernels::BlockFormat::fp8e4m3 : kernels::BlockFormat::fp8e5m2;
}

double load(DataType t, const std::byte* p, std::size_t i) {
  switch (t) {
    case DataType::f32: return reinterpret_cast<const float*>(p)[i];
    case DataType::f64: return reinterpret_cast<const double*>(p)[i];
    case DataType::f16: return kernels::half_to_float(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case DataType::bf16: return kernels::bf16_to_float(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case DataType::f8e4m3:
    case DataType::f8e5m2: return kernels::fp8_to_float(reinterpret_cast<const std::uint8_t*>(p)[i], fp8_format(t));
    default: return 0;
  }
}

// Integer element as a 64-bit pattern for exact, wrapping reference arithmetic.
std::uint64_t load_int(DataType t, const std::byte* p, std::size_t i) {
  switch (t) {
    case DataType::i8: return static_cast<std::uint64_t>(static_cast<std::int64_t>(reinterpret_cast<const std::int8_t*>(p)[i]));
    case DataType::u8: return reinterpret_cast<const std::uint8_t*>(p)[i];
    case DataType::i32: return static_cast<std::uint64_t>(static_cast<std::int64_t>(reinterpret_cast<const std::int32_t*>(p)[i]));
    case DataType::i64: return static_cast<std::uint64_t>(reinterpret_cast<const std::int64_t*>(p)[i]);
    default: return 0;
  }
}

std::int64_t as_signed(DataType t, std::uint64_t v) {  // truncate to the type, sign-extend
  switch (t) {
    case DataType::i8: return static_cast<std::int8_t>(v);
    case DataType::u8: return static_cast<std::uint8_t>(v);
    case DataType::i32: return static_cast<std::int32_t>(v);
    default: return static_cast<std::int64_t>(v);
  }
}

void fill(DataType t, ReduceOp op, std::byte* p, std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> mag(0.5, 1.5);
  std::uniform_int_distribution<int> small(-100, 100), bit(0, 1);
  for (std::size_t i = 0; i < n; ++i) {
    const double f = op == ReduceOp::prod ? (bit(rng) ? 1 : -1) * mag(rng) : mag(rng) * (bit(rng) ? 1 : -1) * 4;
    const long long k = op == ReduceOp::prod ? (bit(rng) ? 3 : -1) : small(rng);
    switch (t) {
      case DataType::f32: reinterpret_cast<float*>(p)[i] = static_cast<float>(f); break;
      case DataType::f64: reinterpret_cast<double*>(p)[i] = f; break;
      case DataType::f16: reinterpret_cast<std::uint16_t*>(p)[i] = kernels::float_to_half(static_cast<float>(f)); break;
      case DataType::bf16: reinterpret_cast<std::uint16_t*>(p)[i] = kernels::float_to_bf16(static_cast<float>(f)); break;
      case DataType::i8: reinterpret_cast<std::int8_t*>(p)[i] = static_cast<std::int8_t>(k); break;
      case DataType::u8: reinterpret_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(k); break;
      case DataType::i32: reinterpret_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(k * 1000003); break;
      case DataType::i64: reinterpret_cast<std::int64_t*>(p)[i] = k * 1000000007LL; break;
      case DataType::f8e4m3:
      case DataType::f8e5m2:
        reinterpret_cast<std::uint8_t*>(p)[i] = kernels::float_to_fp8(static_cast<float>(f), fp8_format(t));
        break;
    }
  }
}

// Checks `out` (rank 0's result) against the inputs of every rank; returns the
// number of elements outside the bound, describing the first in `first`.
std::size_t check(DataType t, ReduceOp op, const std::vector<std::vector<std::byte>>& in, const std::byte* out,
                  std::size_t count, std::string& first) {
  const int n = static_cast<int>(in.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    bool ok;
    double got = 0, want = 0, bound = 0;
    if (is_floating(t)) {
      double acc = load(t, in[0].data(), i), mag = std::fabs(acc);
      for (int r = 1; r < n; ++r) {
        const double v = load(t, in[static_cast<std::size_t>(r)].data(), i);
        mag += std::fabs(v);
        switch (op) {
          case ReduceOp::sum: case ReduceOp::avg: case ReduceOp::premul_sum: acc += v; break;
          case ReduceOp::prod: acc *= v; break;
          case ReduceOp::min: acc = std::min(acc, v); break;
          case ReduceOp::max: acc = std::max(acc, v); break;
        }
      }
      // For f64 the double-precision reference rounds as often as the library does, so
      // the two may each be off by the bound.
      const double u = unit_roundoff(t) * (t == DataType::f64 ? 2 : 1);
      const bool fp8 = t == DataType::f8e4m3 || t == DataType::f8e5m2;
      const double nu = (n - 1) * u, g = fp8 ? nu / (1 - nu) : nu;  // γ(n-1), first order for wide types
      const double eta = underflow_error(t) * (n - 1) * std::pow(1.5, n - 1);  // prod factors are <= 1.5
      got = load(t, out, i);
      want = acc;
      if (op == ReduceOp::sum) bound = g * mag;
      if (op == ReduceOp::avg) want = acc / n, bound = g * mag / n + u * std::fabs(want) * 2 + eta;
      if (op == ReduceOp::prod) bound = g * std::fabs(acc) * 1.01 + eta;
      ok = std::fabs(got - want) <= bound;
    } else {
      std::uint64_t acc = load_int(t, in[0].data(), i);
      std::int64_t sacc = as_signed(t, acc);
      for (int r = 1; r < n; ++r) {
        const std::uint64_t v = load_int(t, in[static_cast<std::size_t>(r)].data(), i);
        const std::int64_t sv = as_signed(t, v);
        switch (op) {
          case ReduceOp::sum: case ReduceOp::avg: case ReduceOp::premul_sum: acc += v; break;
          case ReduceOp::prod: acc *= v; break;
          case ReduceOp::min: sacc = std::min(sacc, sv); break;
          case ReduceOp::max: sacc = std::max(sacc, sv); break;
        }
      }
      std::int64_t expect = (op == ReduceOp::min || op == ReduceOp::max) ? sacc : as_signed(t, acc);
      if (op == ReduceOp::avg) expect = as_signed(t, acc) / n;
      got = static_cast<double>(as_signed(t, load_int(t, out, i)));
      want = static_cast<double>(as_signed(t, static_cast<std::uint64_t>(expect)));
      ok = as_signed(t, load_int(t, out, i)) == as_signed(t, static_cast<std::uint64_t>(expect));
    }
    if (!ok && bad++ == 0)
      first = "element " + std::to_string(i) + ": got " + std::to_string(got) + ", want " + std::to_string(want) +
              " (bound " + std::to_string(bound) + ")";
  }
  return bad;
}

// transport x world (test::GridTest); counts loop inside, in one group.
class AllreduceThreads : public test::GridTest {};

TEST_P(AllreduceThreads, EveryTypeOpAndCount) {
  const int n = world();
  CommOptions opt;
  opt.chunk_bytes = 4096;  // several pipeline slices per chunk for the large count
  opt.timeout = std::chrono::seconds(60);
  Group g(n, opt, hosts(), transport());
  const std::size_t counts[] = {0, 1, 1001, (1u << 15) + 3};
  int case_no = 0;
  for (std::size_t count : counts)
    for (int ti = 0; ti < kNumDataTypes; ++ti)
      for (int oi = 0; oi <= static_cast<int>(ReduceOp::avg); ++oi) {  // premul_sum: PremulSum below
        const auto t = static_cast<DataType>(ti);
        const auto op = static_cast<ReduceOp>(oi);
        const bool in_place = (case_no++ % 2) == 1;
        const std::size_t bytes = count * dtype_size(t);
        std::vector<std::vector<std::byte>> in(static_cast<std::size_t>(n), std::vector<std::byte>(bytes + 1));
        std::vector<std::vector<std::byte>> out(static_cast<std::size_t>(n), std::vector<std::byte>(bytes + 1));
        for (int r = 0; r < n; ++r) {
          std::mt19937 rng(static_cast<unsigned>(r * 7919 + case_no));
          fill(t, op, in[static_cast<std::size_t>(r)].data(), count, rng);
          if (in_place) out[static_cast<std::size_t>(r)] = in[static_cast<std::size_t>(r)];
        }
        run_threads(n, [&](int r) {
          auto& o = out[static_cast<std::size_t>(r)];
          const void* src = in_place ? o.data() : in[static_cast<std::size_t>(r)].data();
          g[r].allreduce(src, o.data(), count, t, op).wait();
        });
        const std::string what = "world " + std::to_string(n) + " count " + std::to_string(count) + " " +
                                 std::string(to_string(t)) + " " + std::string(to_string(op)) +
                                 (in_place ? " in-place" : " out-of-place");
        for (int r = 1; r < n; ++r)
          ASSERT_EQ(0, std::memcmp(out[0].data(), out[static_cast<std::size_t>(r)].data(), bytes))
              << what << ": rank " << r << " differs from rank 0";
        std::string first;
        ASSERT_EQ(0u, check(t, op, in, out[0].data(), count, first)) << what << ": " << first;
      }
}

// shm over every world 1..8 but 6, every other transport over {2, 3, 5, 8} (test::grid), but
// ibverbs over 3 ranks only: it runs over the test provider (tests/support/fakeverbs), whose
// emulated HCA threads make every message cost four thread wake-ups, and this grid is the
// largest (245 s for the four worlds on the 2-core CI machine; 51 s for 3 ranks). Its
// other grids keep every world.
INSTANTIATE_TEST_SUITE_P(Worlds, AllreduceThreads,
                         ::testing::ValuesIn(test::grid({2, 3, 5, 8}, {{"shm", {1, 2, 3, 4, 5, 7, 8}},
                                                                       {"ibverbs", {3}}})),
                         test::grid_name);

// premul_sum (NCCL's ncclRedOpCreatePreMulSum, torch's PREMUL_SUM): every rank's input is
// multiplied by the call's scale before the sum, in all-reduce (every algorithm, and the
// deterministic order), reduce and reduce-scatter, in and out of place. Values are chosen so
// that the f32 results are exact. f16 shows why scaling comes first: 2 x 40000 overflows
// the type, 2 x (0.5 x 40000) does not. Integers need an integral scale.
TEST(PremulSum, ScalesEveryInputOnceBeforeTheSum) {
  for (int n : {1, 3, 4}) {
    CommOptions opt;
    opt.chunk_bytes = 4096;  // several slices of the 20000-byte buffers
    Group g(n, opt, n == 4 ? 2 : 0);
    const std::size_t count = 5000;
    auto x = [](int r, std::size_t i) { return static_cast<float>((r + 1) * static_cast<int>(i % 13) - 5); };
    auto want = [&](std::size_t i, double s) {
      double acc = 0;
      for (int r = 0; r < n; ++r) acc += s * x(r, i);
      return static_cast<float>(acc);
    };
    int case_no = 0;
    for (Algorithm a : {Algorithm::automatic, Algorithm::ring, Algorithm::tree, Algorithm::rhd, Algorithm::hierarchical})
      for (bool det : {false, true})
        for (bool in_place : {false, true}) {
          if (det && a != Algorithm::automatic) continue;
          const double s = case_no++ % 2 ? 0.25 : -2.0;
          run_threads(n, [&](int r) {
            std::vector<float> in(count), out(count, -1.0f);
            for (std::size_t i = 0; i < count; ++i) in[i] = x(r, i);
            if (in_place) out = in;
            AllreduceOptions o;
            o.algorithm = a;
            o.deterministic = det;
            o.scale = s;
            g[r].allreduce(in_place ? out.data() : in.data(), out.data(), count, DataType::f32, ReduceOp::premul_sum, o)
                .wait();
            for (std::size_t i = 0; i < count; ++i)
              ASSERT_EQ(out[i], want(i, s)) << "world " << n << " " << to_string(a) << (det ? " deterministic" : "")
                                            << (in_place ? " in place" : "") << " element " << i;
            if (!in_place) {
              ASSERT_EQ(in[5], x(r, 5)) << "the input was written";
            }
          });
        }
    // reduce to the last rank, and reduce-scatter, in and out of place.
    for (bool in_place : {false, true})
      run_threads(n, [&](int r) {
        std::vector<float> in(count), out(count, -1.0f);
        for (std::size_t i = 0; i < count; ++i) in[i] = x(r, i);
        if (in_place) out = in;
        ReduceOptions o;
        o.root = n - 1;
        o.scale = 0.5;
        g[r].reduce(in_place ? out.data() : in.data(), out.data(), count, DataType::f32, ReduceOp::premul_sum, o).wait();
        if (r == n - 1) {
          for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], want(i, 0.5)) << "reduce element " << i;
        }
        const std::size_t block = 37;
        std::vector<float> all(block * static_cast<std::size_t>(n)), mine(block, -1.0f);
        for (std::size_t i = 0; i < all.size(); ++i) all[i] = x(r, i);
        float* dst = in_place ? all.data() + static_cast<std::size_t>(r) * block : mine.data();
        ReduceScatterOptions so;
        so.scale = 4.0;
        g[r].reduce_scatter(all.data(), dst, block, DataType::f32, ReduceOp::premul_sum, so).wait();
        for (std::size_t i = 0; i < block; ++i)
          ASSERT_EQ(dst[i], want(static_cast<std::size_t>(r) * block + i, 4.0)) << "reduce_scatter element " << i;
      });
    if (n == 1) continue;
    run_threads(n, [&](int r) {
      // f16: scaled first, the sum stays finite (and exact: 40000 is a multiple of 32).
      std::vector<std::uint16_t> h(8, kernels::float_to_half(40000.0f));
      AllreduceOptions o;
      o.scale = 1.0 / n;
      g[r].allreduce(h.data(), h.data(), h.size(), DataType::f16, ReduceOp::premul_sum, o).wait();
      const float got = kernels::half_to_float(h[0]);
      EXPECT_TRUE(std::isfinite(got)) << got;
      EXPECT_NEAR(got, 40000.0f, 40000.0f * 4e-3f);
      // Integers: an integral scale, with wrap-around; a fractional one is refused.
      std::vector<std::int32_t> v(5);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = r + static_cast<int>(i);
      o.scale = -3;
      g[r].allreduce(v.data(), v.data(), v.size(), DataType::i32, ReduceOp::premul_sum, o).wait();
      for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], -3 * (n * (n - 1) / 2 + n * static_cast<int>(i)));
      o.scale = 0.5;
      EXPECT_THROW(g[r].allreduce(v.data(), v.data(), v.size(), DataType::i32, ReduceOp::premul_sum, o), Error);
      std::uint8_t u = 1;
      o.scale = 256;
      EXPECT_THROW(g[r].allreduce(&u, &u, 1, DataType::u8, ReduceOp::premul_sum, o), Error);
      // A codec compresses sums and averages only.
      AllreduceOptions c;
      c.codec = "int8";
      c.scale = 0.5;
      std::vector<float> f(64, 1.0f);
      try {
        g[r].allreduce(f.data(), f.data(), f.size(), DataType::f32, ReduceOp::premul_sum, c).wait();
        ADD_FAILURE() << "premul_sum with a codec was accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
        EXPECT_NE(std::string(e.what()).find("premul_sum"), std::string::npos) << e.what();
      }
      g[r].barrier().wait();  // the refusals left the communicator healthy
    });
  }
}

TEST(AllreduceSemantics, NanAndInfPropagate) {
  Group g(3);
  const float nan = std::nanf(""), inf = INFINITY;
  std::vector<std::vector<float>> in = {{1, nan, inf, inf}, {2, 1, 1, -inf}, {3, 1, 1, 5}};
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max}) {
    std::vector<std::vector<float>> out(3, std::vector<float>(4));
    run_threads(3, [&](int r) {
      g[r].allreduce(in[static_cast<std::size_t>(r)].data(),
                                                      out[static_cast<std::size_t>(r)].data(), 4, DataType::f32, op).wait();
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>(r)][1])) << to_string(op);
      EXPECT_EQ(0, std::memcmp(out[0].data(), out[static_cast<std::size_t>(r)].data(), 16));
    }
    if (op == ReduceOp::sum) {
      EXPECT_TRUE(std::isinf(out[0][2]));
      EXPECT_TRUE(std::isnan(out[0][3]));  // inf + -inf
    }
  }
}

// fp8 sums saturate at every step (CUDA's satfinite) instead of overflowing to NaN (e4m3)
// or inf (e5m2); an e5m2 inf input saturates too; NaN stays NaN (0x7f); every algorithm,
// every rank the same bits.
TEST(AllreduceSemantics, Fp8Saturates) {
  Group g(4);
  for (Algorithm algo : {Algorithm::ring, Algorithm::tree, Algorithm::rhd}) {
    std::vector<std::vector<std::uint8_t>> e4(4), e5(4);
    for (int r = 0; r < 4; ++r) {
      e4[static_cast<std::size_t>(r)] = {0x7e, 0xfe, 0x38, static_cast<std::uint8_t>(r == 2 ? 0xff : 0x38)};
      e5[static_cast<std::size_t>(r)] = {0x7b, static_cast<std::uint8_t>(r == 1 ? 0x7c : 0x3c), 0xfb, 0x3c};
    }
    run_threads(4, [&](int r) {
      AllreduceOptions o;
      o.algorithm = algo;
      auto& a = e4[static_cast<std::size_t>(r)];
      auto& b = e5[static_cast<std::size_t>(r)];
      g[r].allreduce(a.data(), a.data(), a.size(), DataType::f8e4m3, ReduceOp::sum, o).wait();
      g[r].allreduce(b.data(), b.data(), b.size(), DataType::f8e5m2, ReduceOp::sum, o).wait();
    });
    for (int r = 0; r < 4; ++r) {
      SCOPED_TRACE(std::string(to_string(algo)) + " rank " + std::to_string(r));
      const auto& a = e4[static_cast<std::size_t>(r)];
      const auto& b = e5[static_cast<std::size_t>(r)];
      EXPECT_EQ(a[0], 0x7e);  // 4 x 448 -> 448
      EXPECT_EQ(a[1], 0xfe);  // 4 x -448 -> -448
      EXPECT_EQ(a[2], 0x48);  // 4 x 1.0 = 4.0
      EXPECT_EQ(a[3], 0x7f);  // a NaN (-NaN 0xff on one rank) gives 0x7f
      EXPECT_EQ(b[0], 0x7b);  // 4 x 57344 -> 57344
      EXPECT_EQ(b[1], 0x7b);  // inf + 3 -> 57344 (satfinite)
      EXPECT_EQ(b[2], 0xfb);
      EXPECT_EQ(b[3], 0x44);  // 4.0
    }
  }
}

TEST(AllreduceSemantics, ManyOutstandingWorksCompleteInOrder) {
  Group g(4);
  run_threads(4, [&](int r) {
    std::vector<std::vector<std::int64_t>> bufs(50, std::vector<std::int64_t>(333));
    std::vector<Work> works;
    for (int k = 0; k < 50; ++k) {
      std::fill(bufs[static_cast<std::size_t>(k)].begin(), bufs[static_cast<std::size_t>(k)].end(), k * 10 + r);
      works.push_back(g[r].allreduce(
          bufs[static_cast<std::size_t>(k)].data(), bufs[static_cast<std::size_t>(k)].data(), 333, DataType::i64,
          ReduceOp::sum));
    }
    for (int k = 49; k >= 0; --k) {
      works[static_cast<std::size_t>(k)].wait();
      for (auto v : bufs[static_cast<std::size_t>(k)]) ASSERT_EQ(v, 4 * k * 10 + 6);
    }
  });
}

TEST(AllreduceSemantics, BarrierAndUniqueId) {
  const UniqueId id = Communicator::create_unique_id();
  std::vector<std::unique_ptr<Communicator>> comms(3);
  run_threads(3, [&](int r) {
    comms[static_cast<std::size_t>(r)] = std::make_unique<Communicator>(Communicator::from_unique_id(id, r, 3));
    comms[static_cast<std::size_t>(r)]->barrier().wait();
    double x = r + 1;
    comms[static_cast<std::size_t>(r)]->allreduce(&x, &x, 1, DataType::f64, ReduceOp::avg).wait();
    EXPECT_EQ(x, 2.0);
    EXPECT_EQ(comms[static_cast<std::size_t>(r)]->local_size(), 3);
    EXPECT_EQ(comms[static_cast<std::size_t>(r)]->local_rank(), r);
  });
  // The id's nonce reached the ranks privately, so it is the job's token and the store's
  // record of the communicator carries none (issue 31): "<comm id>\ngiven".
  const auto f = braid::core::parse_unique_id(id);
  ASSERT_TRUE(f.has_value());
  TcpStore reader(f->addr, static_cast<std::uint16_t>(f->port), false, std::chrono::seconds(5), f->nonce);
  const std::string meta = reader.get("uid-" + f->nonce + "/braid/braid/3/1/meta", std::chrono::seconds(5));
  EXPECT_EQ(meta.substr(meta.find('\n') + 1), "given") << meta;
  run_threads(3, [&](int r) { comms[static_cast<std::size_t>(r)].reset(); });
}

TEST(AllreduceSemantics, SecondCommunicatorOnTheSameStoreIsSeparate) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  const auto port = server->port();
  run_threads(2, [&](int r) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port);
    Communicator a(store, r, 2), b(store, r, 2);
    int x = r + 1, y = (r + 1) * 100;
    auto wb = b.allreduce(&y, &y, 1, DataType::i32, ReduceOp::sum);
    auto wa = a.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum);
    wa.wait();
    wb.wait();
    EXPECT_EQ(x, 3);
    EXPECT_EQ(y, 300);
  });
}

}  // namespace
