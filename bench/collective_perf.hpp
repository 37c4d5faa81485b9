// The nccl-tests sweep for every collective, shared by collective_bench (braid) and its MPI
// twin mpi_collective_bench, so that both print the same columns from the same inputs and
// check the same expected results. A backend posts the calls; this header does the rest.
//
// Sizes follow nccl-tests: "size" is the largest buffer of the call in bytes (allgather's
// output, reduce_scatter's input, alltoall's whole buffer), rounded down to a whole number
// of elements per rank. algbw = size / time; busbw = algbw x the collective's factor from
// nccl-tests' PERFORMANCE.md: allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall,
// gather and scatter (n-1)/n; broadcast, reduce and sendrecv 1. Time is the slowest rank's mean per call.
// sendrecv: each rank sends to rank+1 and receives from rank-1 (no in-place form).
// A backend may put the buffers in device memory (collective_bench --device): the sweep
// then fills and checks host copies and the backend moves them (Backend::device_buffer).
#pragma once

#include "bench_args.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace braid::bench {

enum class Coll { allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall, gather, scatter, sendrecv, allgatherv, alltoallv };
enum class Type { f32, f64, f16, bf16, i8, u8, i32, i64, f8e4m3, f8e5m2 };
enum class Op { sum, prod, min, max, avg };

struct CollInfo {
  Coll coll;
  const char* name;       ///< --coll value
  const char* perf_name;  ///< nccl-tests' binary name (collective_bench answers to it too)
  bool reduces;           ///< takes -o
  bool rooted;            ///< takes -r
};

inline constexpr CollInfo kColls[] = {
    {Coll::allreduce, "allreduce", "all_reduce_perf", true, false},
    {Coll::allgather, "allgather", "all_gather_perf", false, false},
    {Coll::reduce_scatter, "reduce_scatter", "reduce_scatter_perf", true, false},
    {Coll::broadcast, "broadcast", "broadcast_perf", false, true},
    {Coll::reduce, "reduce", "reduce_perf", true, true},
    {Coll::alltoall, "alltoall", "alltoall_perf", false, false},
    {Coll::gather, "gather", "gather_perf", false, true},
    {Coll::scatter, "scatter", "scatter_perf", false, true},
    {Coll::sendrecv, "sendrecv", "sendrecv_perf", false, false},
    {Coll::allgatherv, "allgatherv", "all_gatherv_perf", false, false},
    {Coll::alltoallv, "alltoallv", "alltoallv_perf", false, false},
};

/// The collective named `name` (--coll value or nccl-tests binary name), or null.
inline const CollInfo* find_coll(const std::string& name) {
  for (const auto& c : kColls)
    if (name == c.name || name == c.perf_name) return &c;
  return nullptr;
}

/// nccl-tests' bus bandwidth factor.
inline double bus_factor(Coll c, int n) {
  if (n <= 1) return 1.0;
  switch (c) {
    case Coll::allreduce: return 2.0 * (n - 1) / n;
    case Coll::allgather: case Coll::reduce_scatter: case Coll::alltoall: case Coll::gather: case Coll::scatter:
    case Coll::allgatherv: case Coll::alltoallv:
      return static_cast<double>(n - 1) / n;
    default: return 1.0;
  }
}

/// Ranks whose buffers the call splits into blocks (count per rank = elements / blocks).
inline int blocks(Coll c, int n) {
  return c == Coll::allgather || c == Coll::reduce_scatter || c == Coll::alltoall || c == Coll::gather ||
                 c == Coll::scatter || c == Coll::allgatherv || c == Coll::alltoallv
             ? n
             : 1;
}

/// The v-collectives' skewed blocks: block k of n holds 2·count·(k+1)/(n+1) elements (sizes
/// in proportion 1 : 2 : … : n, `count` on average, never more than count·n in all).
/// allgatherv: rank j contributes block j. alltoallv: rank `from` sends rank `to` block
/// (from + to) mod n, so what a rank sends and what it receives have the same sizes.
inline std::size_t v_block(std::size_t count, int n, int k) {
  return 2 * count * static_cast<std::size_t>(k + 1) / static_cast<std::size_t>(n + 1);
}
/// Block sizes of `rank`'s call (allgatherv: every rank's; alltoallv: what it sends or
/// receives, which are the same), and their offsets.
inline std::vector<std::size_t> v_counts(Coll c, std::size_t count, int n, int rank) {
  std::vector<std::size_t> v(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) v[static_cast<std::size_t>(j)] = v_block(count, n, c == Coll::alltoallv ? (rank + j) % n : j);
  return v;
}
inline std::vector<std::size_t> v_offsets(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> at(counts.size(), 0);
  for (std::size_t j = 1; j < counts.size(); ++j) at[j] = at[j - 1] + counts[j - 1];
  return at;
}

struct TypeInfo {
  const char* name;  ///< nccl-tests' spelling
  Type type;
  std::size_t size;
};
inline constexpr TypeInfo kTypes[] = {{"float", Type::f32, 4}, {"double", Type::f64, 8}, {"half", Type::f16, 2},
                                      {"bfloat16", Type::bf16, 2}, {"int8", Type::i8, 1}, {"uint8", Type::u8, 1},
                                      {"int32", Type::i32, 4}, {"int64", Type::i64, 8},
                                      {"f8e4m3", Type::f8e4m3, 1}, {"f8e5m2", Type::f8e5m2, 1}};
inline const TypeInfo* find_type(const std::string& name) {
  for (const auto& t : kTypes)
    if (name == t.name) return &t;
  return nullptr;
}
inline bool parse_op(const std::string& s, Op* op) {
  const char* names[] = {"sum", "prod", "min", "max", "avg"};
  for (int i = 0; i < 5; ++i)
    if (s == names[i]) {
      *op = static_cast<Op>(i);
      return true;
    }
  return false;
}

// --- values: small integers, exact in every type, so #wrong counts real errors --------
inline std::uint16_t to_half(float f) {  // round to nearest even
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  std::uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(exp) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}
inline float from_half(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --exp;
      }
      x = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline std::uint16_t to_bf16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}
inline float from_bf16(std::uint16_t h) {
  const std::uint32_t x = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// OCP fp8 (E4M3 "fn" when e4m3, else E5M2) from its definition, and the nearest value by
// search (ties to the even code, saturating): a reference, not braid's conversion.
inline double from_fp8(std::uint8_t b, bool e4m3) {
  const int mbits = e4m3 ? 3 : 2, ebits = 7 - mbits, bias = e4m3 ? 7 : 15;
  const int e = (b >> mbits) & ((1 << ebits) - 1), m = b & ((1 << mbits) - 1);
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  if (e == 0) return sign * std::ldexp(m, 1 - bias - mbits);
  return sign * std::ldexp(1.0 + static_cast<double>(m) / (1 << mbits), e - bias);
}
inline std::uint8_t to_fp8(double v, bool e4m3) {
  // Magnitudes of the finite codes, increasing with the code; a binary search finds the
  // two neighbours of |v| (a linear search made filling 64 MiB take minutes).
  static const std::array<std::array<double, 128>, 2> kMagnitude = [] {
    std::array<std::array<double, 128>, 2> t{};
    for (int c = 0; c < 128; ++c) {
      t[0][static_cast<std::size_t>(c)] = from_fp8(static_cast<std::uint8_t>(c), true);
      t[1][static_cast<std::size_t>(c)] = from_fp8(static_cast<std::uint8_t>(c), false);
    }
    return t;
  }();
  const int maxcode = e4m3 ? 0x7e : 0x7b;
  const auto& mag = kMagnitude[e4m3 ? 0 : 1];
  const double a = std::fabs(v);
  if (a != a) return 0;
  const int hi = static_cast<int>(std::lower_bound(mag.begin(), mag.begin() + maxcode + 1, a) - mag.begin());
  int best = 0;
  if (hi > maxcode) {
    best = maxcode;  // saturate
  } else if (hi > 0) {
    const double below = a - mag[static_cast<std::size_t>(hi - 1)], above = mag[static_cast<std::size_t>(hi)] - a;
    best = below < above ? hi - 1 : above < below ? hi : (hi % 2 == 0 ? hi : hi - 1);  // ties to the even code
  }
  return static_cast<std::uint8_t>(best | (v < 0 ? 0x80 : 0));
}

/// Rank `rank`'s input element `i` (sums of a few hundred ranks stay exact even in bf16;
/// in fp8 only the first 8 ranks contribute to sums, so every partial sum is exact).
inline double input_value(Op op, int rank, std::size_t i, Type t) {
  const auto k = static_cast<long long>((static_cast<std::size_t>(rank) * 7 + i * 13) % 5);
  if (op == Op::prod) return (k == 0 && t != Type::u8) ? -1.0 : 1.0;
  if (t == Type::u8) return static_cast<double>(k % 3);
  if ((t == Type::f8e4m3 || t == Type::f8e5m2) && (op == Op::sum || op == Op::avg) && rank >= 8) return 0.0;
  return static_cast<double>(k % 3 - 1);  // -1, 0, 1
}

inline void store_value(Type t, void* buf, std::size_t i, double v) {
  switch (t) {
    case Type::f32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case Type::f64: static_cast<double*>(buf)[i] = v; break;
    case Type::f16: static_cast<std::uint16_t*>(buf)[i] = to_half(static_cast<float>(v)); break;
    case Type::bf16: static_cast<std::uint16_t*>(buf)[i] = to_bf16(static_cast<float>(v)); break;
    case Type::i8: static_cast<std::int8_t*>(buf)[i] = static_cast<std::int8_t>(v); break;
    case Type::u8: static_cast<std::uint8_t*>(buf)[i] = static_cast<std::uint8_t>(v); break;
    case Type::i32: static_cast<std::int32_t*>(buf)[i] = static_cast<std::int32_t>(v); break;
    case Type::i64: static_cast<std::int64_t*>(buf)[i] = static_cast<std::int64_t>(v); break;
    case Type::f8e4m3: static_cast<std::uint8_t*>(buf)[i] = to_fp8(v, true); break;
    case Type::f8e5m2: static_cast<std::uint8_t*>(buf)[i] = to_fp8(v, false); break;
  }
}

/// The bits of `op` over every rank's element `i`, written at out[0] (avg: the exact sum
/// divided once, in the type's arithmetic, as braid does).
inline void expected_value(Type t, Op op, int world, std::size_t i, void* out) {
  double acc = input_value(op, 0, i, t);
  for (int r = 1; r < world; ++r) {
    const double v = input_value(op, r, i, t);
    switch (op) {
      case Op::sum: case Op::avg: acc += v; break;
      case Op::prod: acc *= v; break;
      case Op::min: acc = std::min(acc, v); break;
      case Op::max: acc = std::max(acc, v); break;
    }
  }
  if (op != Op::avg) {
    store_value(t, out, 0, acc);
    return;
  }
  switch (t) {
    case Type::f32: static_cast<float*>(out)[0] = static_cast<float>(acc) / static_cast<float>(world); break;
    case Type::f64: static_cast<double*>(out)[0] = acc / world; break;
    case Type::f16:
      static_cast<std::uint16_t*>(out)[0] = to_half(from_half(to_half(static_cast<float>(acc))) / static_cast<float>(world));
      break;
    case Type::bf16:
      static_cast<std::uint16_t*>(out)[0] = to_bf16(from_bf16(to_bf16(static_cast<float>(acc))) / static_cast<float>(world));
      break;
    case Type::f8e4m3:
    case Type::f8e5m2: {  // the sum rounded to fp8, divided in f32, rounded again
      const bool e4 = t == Type::f8e4m3;
      const float q = static_cast<float>(from_fp8(to_fp8(acc, e4), e4)) / static_cast<float>(world);
      static_cast<std::uint8_t*>(out)[0] = to_fp8(q, e4);
      break;
    }
    default: store_value(t, out, 0, static_cast<double>(static_cast<long long>(acc) / world)); break;
  }
}

/// Elements of `out` (`count` elements of `es` bytes) that differ from the all-reduce
/// (`op`) of element i over every rank's input.
inline long long count_wrong_allreduce(Type t, Op op, int world, const std::byte* out, std::size_t count,
                                       std::size_t es) {
  std::byte want[8];
  long long wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    expected_value(t, op, world, i, want);
    wrong += std::memcmp(want, out + i * es, es) != 0;
  }
  return wrong;
}

// --- the sweep -----------------------------------------------------------------------

/// Where a call reads and writes (in-place layouts differ between collectives and, for
/// reduce_scatter and broadcast, between braid and MPI).
struct Layout {
  std::byte* in;
  std::byte* out;
};

/// What a library provides to the sweep. `count` is the per-rank element count of the
/// call (nccl-tests' "count" argument: allgather sends count, alltoall count per peer).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual std::string banner() const = 0;  ///< "braid 0.1.0" / "Open MPI v4.1.4"
  virtual void barrier() = 0;
  virtual double max(double v) = 0;
  virtual long long sum(long long v) = 0;
  /// Runs `iters` calls, each waited for before the next when `blocking`, all done on return.
  virtual void run(Coll c, const Layout& l, std::size_t count, const TypeInfo& t, Op op, int root, int iters,
                   bool blocking) = 0;
  /// In-place layout (the default is braid's: allgather's input is this rank's block of
  /// the output; reduce_scatter's output is this rank's block of the input; others alias).
  virtual Layout in_place(Coll c, std::byte* send, std::byte* recv, std::size_t count, std::size_t es) {
    (void)send;
    if (c == Coll::allgather || c == Coll::gather) return {recv + static_cast<std::size_t>(rank()) * count * es, recv};
    if (c == Coll::allgatherv)
      return {recv + v_offsets(v_counts(c, count, world(), rank()))[static_cast<std::size_t>(rank())] * es, recv};
    if (c == Coll::reduce_scatter || c == Coll::scatter)
      return {recv, recv + static_cast<std::size_t>(rank()) * count * es};
    return {recv, recv};
  }
  /// Out-of-place layout.
  virtual Layout out_of_place(Coll c, std::byte* send, std::byte* recv) {
    (void)c;
    return {send, recv};
  }
  /// Device memory for the sweep's buffer `which` (0 send, 1 recv) of `bytes`, owned by the
  /// backend; nullptr (the default): the sweep uses host memory of its own.
  virtual std::byte* device_buffer(int which, std::size_t bytes) {
    (void)which;
    (void)bytes;
    return nullptr;
  }
  /// Copies between host memory and a device_buffer(), synchronously.
  virtual void copy(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
  /// A line for the table's header (what the buffers are), or "".
  virtual std::string memory_note() const { return ""; }
};

struct SweepOptions {
  const CollInfo* coll;
  const TypeInfo* type;
  Op op = Op::sum;
  std::string op_name = "sum";
  int root = 0;
  std::size_t lo = 1024, hi = 1 << 20;
  double factor = 2;
  int iters = 20, warmup = 5, check = 1;
  bool blocking = false;
  std::string csv;
  std::string program;  ///< for the header line
};

/// Input element i of `rank`'s send buffer; collectives without a reduction use sum's values.
inline void fill(const SweepOptions& o, int rank, std::byte* in, std::size_t elems) {
  for (std::size_t i = 0; i < elems; ++i) store_value(o.type->type, in, i, input_value(o.op, rank, i, o.type->type));
}

/// Elements of `out` that differ from what the collective must leave there.
inline long long count_wrong(const SweepOptions& o, int rank, int world, const std::byte* out, std::size_t count) {
  const Type t = o.type->type;
  const std::size_t es = o.type->size;
  std::byte want[8];
  long long wrong = 0;
  auto at = [&](std::size_t k) { return out + k * es; };
  auto check_input = [&](std::size_t k, int from, std::size_t i) {
    store_value(t, want, 0, input_value(o.op, from, i, t));
    wrong += std::memcmp(want, at(k), es) != 0;
  };
  switch (o.coll->coll) {
    case Coll::allreduce:
    case Coll::reduce:
      if (o.coll->coll == Coll::reduce && rank != o.root) return 0;
      wrong = count_wrong_allreduce(t, o.op, world, out, count, es);
      break;
    case Coll::reduce_scatter:
      for (std::size_t i = 0; i < count; ++i) {
        expected_value(t, o.op, world, static_cast<std::size_t>(rank) * count + i, want);
        wrong += std::memcmp(want, at(i), es) != 0;
      }
      break;
    case Coll::allgather:
      for (int j = 0; j < world; ++j)
        for (std::size_t i = 0; i < count; ++i) check_input(static_cast<std::size_t>(j) * count + i, j, i);
      break;
    case Coll::broadcast:
      for (std::size_t i = 0; i < count; ++i) check_input(i, o.root, i);
      break;
    case Coll::alltoall:
      for (int j = 0; j < world; ++j)
        for (std::size_t i = 0; i < count; ++i)
          check_input(static_cast<std::size_t>(j) * count + i, j, static_cast<std::size_t>(rank) * count + i);
      break;
    case Coll::gather:
      if (rank != o.root) return 0;
      for (int j = 0; j < world; ++j)
        for (std::size_t i = 0; i < count; ++i) check_input(static_cast<std::size_t>(j) * count + i, j, i);
      break;
    case Coll::scatter:
      for (std::size_t i = 0; i < count; ++i) check_input(i, o.root, static_cast<std::size_t>(rank) * count + i);
      break;
    case Coll::sendrecv:
      for (std::size_t i = 0; i < count; ++i) check_input(i, (rank + world - 1) % world, i);
      break;
    case Coll::allgatherv: {
      const auto counts = v_counts(Coll::allgatherv, count, world, rank);
      const auto off = v_offsets(counts);
      for (int j = 0; j < world; ++j)
        for (std::size_t i = 0; i < counts[static_cast<std::size_t>(j)]; ++i) check_input(off[static_cast<std::size_t>(j)] + i, j, i);
      break;
    }
    case Coll::alltoallv: {
      const auto mine = v_counts(Coll::alltoallv, count, world, rank);
      const auto off = v_offsets(mine);
      for (int j = 0; j < world; ++j) {
        const auto from = v_offsets(v_counts(Coll::alltoallv, count, world, j));  // rank j's send offsets
        for (std::size_t i = 0; i < mine[static_cast<std::size_t>(j)]; ++i)
          check_input(off[static_cast<std::size_t>(j)] + i, j, from[static_cast<std::size_t>(rank)] + i);
      }
      break;
    }
  }
  return wrong;
}

/// Runs the sweep and prints nccl-tests' table on rank 0; returns 0 when every checked
/// element was right, 1 otherwise.
inline int sweep(Backend& b, const SweepOptions& o) {
  const int rank = b.rank(), world = b.world();
  const Coll c = o.coll->coll;
  const std::size_t es = o.type->size;
  const int nb = blocks(c, world);
  std::ofstream csvf;
  if (rank == 0) {
    std::printf("# %s %s: %s, %d ranks, type %s, op %s, root %d, iters %d, warmup %d, check %d%s\n",
                b.banner().c_str(), o.program.c_str(), o.coll->name, world, o.type->name,
                o.coll->reduces ? o.op_name.c_str() : "none", o.coll->rooted ? o.root : -1, o.iters, o.warmup,
                o.check, o.blocking ? ", blocking" : "");
    const std::string note = b.memory_note();
    if (!note.empty()) std::printf("# %s\n", note.c_str());
    std::printf("#%84s%38s\n", "out-of-place", "in-place");
    std::printf("#%12s %12s %8s %6s %6s %10s %8s %8s %6s %10s %8s %8s %6s\n", "size", "count", "type", "redop", "root",
                "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    std::printf("#%12s %12s %8s %6s %6s %10s %8s %8s %6s %10s %8s %8s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
                "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    if (!o.csv.empty()) {
      csvf.open(o.csv);
      if (csvf)
        csvf << "collective,size,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,wrong,inplace_time_us,"
                "inplace_algbw_GBps,inplace_busbw_GBps,inplace_wrong\n";
    }
  }
  // Host buffers; when the backend gives device buffers, the host side of fills and checks.
  std::vector<std::byte> send(o.hi + 64), recv(o.hi + 64);
  std::byte* const dsend = b.device_buffer(0, send.size());
  std::byte* const drecv = b.device_buffer(1, recv.size());
  const bool device = dsend != nullptr && drecv != nullptr;
  std::byte* const sendp = device ? dsend : send.data();
  std::byte* const recvp = device ? drecv : recv.data();
  // The host twin of an address inside the call's buffers.
  auto host_of = [&](std::byte* p) -> std::byte* {
    if (!device) return p;
    const auto a = reinterpret_cast<std::uintptr_t>(p), s0 = reinterpret_cast<std::uintptr_t>(dsend);
    if (a >= s0 && a < s0 + send.size()) return send.data() + (a - s0);
    return recv.data() + (a - reinterpret_cast<std::uintptr_t>(drecv));
  };
  auto fill_in = [&](std::byte* in, std::size_t elems) {
    fill(o, rank, host_of(in), elems);
    if (device) b.copy(in, host_of(in), elems * es);
  };
  long long total_wrong = 0;
  double busbw_sum = 0;
  int nsizes = 0;
  for (double size_d = static_cast<double>(o.lo);; size_d *= o.factor) {
    const std::size_t size = std::min(o.hi, static_cast<std::size_t>(size_d));
    const std::size_t count = size / es / static_cast<std::size_t>(nb);  // per rank
    const std::size_t total = count * static_cast<std::size_t>(nb);      // elements of the largest buffer
    double time_us[2] = {0, 0};
    long long wrong[2] = {-1, -1};
    for (int inplace = 0; inplace < 2; ++inplace) {
      if (inplace && c == Coll::sendrecv) break;  // no in-place form
      const Layout l = inplace ? b.in_place(c, sendp, recvp, count, es) : b.out_of_place(c, sendp, recvp);
      // The input: a whole buffer of `total` elements for reduce_scatter and alltoall,
      // `count` for the others.
      std::size_t in_elems = (c == Coll::reduce_scatter || c == Coll::alltoall || c == Coll::scatter) ? total : count;
      std::size_t out_elems = (c == Coll::allgather || c == Coll::alltoall || c == Coll::gather) ? total : count;
      if (c == Coll::allgatherv || c == Coll::alltoallv) {
        const auto v = v_counts(c, count, world, rank);
        std::size_t sum = 0;
        for (const std::size_t x : v) sum += x;
        in_elems = c == Coll::allgatherv ? v[static_cast<std::size_t>(rank)] : sum;
        out_elems = sum;
      }
      fill_in(l.in, in_elems);
      b.barrier();
      if (o.warmup > 0) b.run(c, l, count, *o.type, o.op, o.root, o.warmup, o.blocking);
      fill_in(l.in, in_elems);
      b.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      b.run(c, l, count, *o.type, o.op, o.root, o.iters, o.blocking);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                        o.iters;
      time_us[inplace] = b.max(us);
      if (o.check) {
        fill_in(l.in, in_elems);
        b.barrier();
        b.run(c, l, count, *o.type, o.op, o.root, 1, true);
        if (device) b.copy(host_of(l.out), l.out, out_elems * es);
        wrong[inplace] = b.sum(count_wrong(o, rank, world, host_of(l.out), count));
        total_wrong += wrong[inplace];
      }
    }
    if (rank == 0) {
      const double bytes = static_cast<double>(total * es);
      double algbw[2], busbw[2];
      for (int k = 0; k < 2; ++k) {
        algbw[k] = time_us[k] > 0 ? bytes / (time_us[k] * 1e3) : 0.0;
        busbw[k] = algbw[k] * bus_factor(c, world);
      }
      auto cols = [&](int k, char* buf, std::size_t n) {
        if (k == 1 && c == Coll::sendrecv) {
          std::snprintf(buf, n, "%10s %8s %8s %6s", "-", "-", "-", "-");
          return;
        }
        const std::string w = wrong[k] < 0 ? std::string("N/A") : std::to_string(wrong[k]);
        std::snprintf(buf, n, "%10.1f %8.3f %8.3f %6s", time_us[k], algbw[k], busbw[k], w.c_str());
      };
      char a[96], bb[96];
      cols(0, a, sizeof a);
      cols(1, bb, sizeof bb);
      std::printf(" %12zu %12zu %8s %6s %6d %s %s\n", total * es, total, o.type->name,
                  o.coll->reduces ? o.op_name.c_str() : "none", o.coll->rooted ? o.root : -1, a, bb);
      std::fflush(stdout);
      if (csvf)
        csvf << o.coll->name << ',' << total * es << ',' << total << ',' << o.type->name << ','
             << (o.coll->reduces ? o.op_name : "none") << ',' << (o.coll->rooted ? o.root : -1) << ',' << time_us[0]
             << ',' << algbw[0] << ',' << busbw[0] << ',' << wrong[0] << ',' << time_us[1] << ',' << algbw[1] << ','
             << busbw[1] << ',' << wrong[1] << '\n';
      busbw_sum += busbw[0];
    }
    ++nsizes;
    if (size >= o.hi) break;
  }
  if (rank == 0) print_sweep_summary(total_wrong, busbw_sum, nsizes);
  return total_wrong ? 1 : 0;
}

}  // namespace braid::bench
