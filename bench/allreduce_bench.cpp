// allreduce_bench: nccl-tests-style all-reduce benchmark over braid.
//
//   braidrun -n 4 -- allreduce_bench -b 1K -e 64M -f 2 -c 1
//
// Flags follow nccl-tests' all_reduce_perf: -b/-e min/max size in bytes (K/M/G
// suffixes), -f multiplication factor, -n iterations, -w warm-up iterations, -c check,
// -d type, -o op; plus --algo, --codec and --csv. Sizes are rounded down to whole elements, so
// a count of 0 happens for tiny sizes. algbw = size / time; busbw = algbw * 2(n-1)/n,
// the bytes each rank's busiest link carries, comparable across world sizes and with
// nccl-tests. Time is the slowest rank's average per iteration.
//
// Launch: under braidrun, torchrun or srun the communicator comes from the environment
// (Communicator::from_env). Under Open MPI's mpirun, when the bench is built with MPI
// (BRAID_BENCH_MPI), it bootstraps as nccl-tests does: MPI_Init, then braid::from_mpi
// (braid/mpi.hpp: rank 0 creates a UniqueId, MPI_Bcast, every rank from_unique_id).
// MPI is used for nothing else. Without MPI in the build, mpirun works through
// from_env when BRAID_MASTER_ADDR/BRAID_MASTER_PORT are exported to the ranks (-x).
// When stderr is a terminal, rank 0 shows the size being measured there (--quiet: not).
//
// --device: the buffers live in device memory (braid::device::alloc on device local rank
// modulo the device count, as nccl-tests gives each rank a GPU; ranks may share one), each
// rank issues on its own stream (CollectiveOptions::stream) and the time runs until that
// stream is synchronized (stream semantics, as nccl-tests); fills and checks go through
// host copies. Without a device runtime it prints why and exits 0.
// --backend nccl: also runs ncclAllReduce, from libnccl.so.2 loaded at run time
// (nccl_library.hpp; never a build dependency), on the same ranks, sizes, device buffers
// and streams, and prints its table after braid's. NCCL's unique id travels over braid's
// own broadcast. It needs CUDA device memory; where it cannot run (no CUDA, no NCCL,
// NCCL refusing the layout) it says why, braid's rows stand, and the exit status is
// braid's. Not yet run on a GPU in this project (scripts/gpu_check.sh runs it).
#include <braid/braid.hpp>
#include <braid/device.hpp>
#ifdef BRAID_BENCH_MPI
#include <braid/mpi.hpp>
#endif

#include <CLI/CLI.hpp>

#include "bench_args.hpp"
#include "collective_perf.hpp"
#include "nccl_library.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

namespace {

using braid::bench::add_sweep_flags;
using braid::bench::parse_size;
using braid::bench::print_sweep_summary;
using braid::bench::SweepFlags;

using braid::DataType;
using braid::ReduceOp;

// Types, inputs and expected results are collective_bench's (collective_perf.hpp), whose
// enums list braid's types and ops in braid's order.
namespace perf = braid::bench;
static_assert(static_cast<int>(DataType::f16) == static_cast<int>(perf::Type::f16) &&
              static_cast<int>(DataType::i64) == static_cast<int>(perf::Type::i64) &&
              static_cast<int>(DataType::f8e5m2) == static_cast<int>(perf::Type::f8e5m2) &&
              static_cast<int>(ReduceOp::avg) == static_cast<int>(perf::Op::avg));
perf::Type to_perf(DataType t) { return static_cast<perf::Type>(t); }
perf::Op to_perf(ReduceOp op) { return static_cast<perf::Op>(op); }

const char* nccl_type_name(DataType t) {
  for (const auto& ti : perf::kTypes)
    if (ti.type == to_perf(t)) return ti.name;
  return "?";
}

double input_value(ReduceOp op, int rank, std::size_t i, DataType t) {
  return perf::input_value(to_perf(op), rank, i, to_perf(t));
}
void store_value(DataType t, void* buf, std::size_t i, double v) { perf::store_value(to_perf(t), buf, i, v); }
/// Elements of the all-reduce result `out` (`count` of them) that are wrong.
long long count_wrong(DataType t, ReduceOp op, int world, const void* out, std::size_t count) {
  return perf::count_wrong_allreduce(to_perf(t), to_perf(op), world, static_cast<const std::byte*>(out), count,
                                     braid::dtype_size(t));
}

struct Result : braid::bench::SweepResult {
  double relerr = 0;  ///< --codec: relative L2 error against the exact all-reduce
  /// --device: the device runtime's work per call over the timed calls (braid::device::
  /// counts(), the largest of any rank): host functions, runtime calls of the progress
  /// thread, host synchronisations and kernel launches (docs/gpu.md, "Budgets"); -1: not
  /// measured (host buffers).
  double hostfn = -1, api = -1, sync = -1, launch = -1;
};

// --codec inputs: deterministic, gradient-like (a spread of magnitudes and signs).
float gradient_value(int rank, std::size_t i) {
  std::uint64_t z = (static_cast<std::uint64_t>(rank) << 40) ^ (i * 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
  return static_cast<float>((u - 0.5) * (1.0 + static_cast<double>(i % 7)));
}

// --codec buffers hold f32, bf16 or f16 (what the codecs take).
bool codec_dtype(DataType t) { return t == DataType::f32 || t == DataType::bf16 || t == DataType::f16; }

// Rank r's --codec input i as a buffer of `t` holds it (rounded to bf16/f16).
double codec_input(DataType t, int r, std::size_t i) {
  const float v = gradient_value(r, i);
  if (t == DataType::bf16) return perf::from_bf16(perf::to_bf16(v));
  if (t == DataType::f16) return perf::from_half(perf::to_half(v));
  return v;
}

// Element i of a --codec buffer of `t`.
double codec_load(DataType t, const void* buf, std::size_t i) {
  if (t == DataType::f32) return static_cast<const float*>(buf)[i];
  std::uint16_t h;
  std::memcpy(&h, static_cast<const std::byte*>(buf) + 2 * i, 2);
  return t == DataType::bf16 ? perf::from_bf16(h) : perf::from_half(h);
}

// MPI for the bootstrap only: initialized under mpirun, finalized after the
// communicator is gone, and only on success (after a failure some ranks never reach
// MPI_Finalize, whose fence would then hang the others).
struct MpiBootstrap {
  bool active = false;
  void init(int* argc, char*** argv) {
#ifdef BRAID_BENCH_MPI
    if (braid::launcher() == "mpirun") {
      MPI_Init(argc, argv);
      active = true;
    }
#else
    (void)argc;
    (void)argv;
#endif
  }
  braid::Communicator communicator() const {
#ifdef BRAID_BENCH_MPI
    if (active) {
      return braid::from_mpi(MPI_COMM_WORLD);
    }
#endif
    return braid::Communicator::from_env();
  }
  int finish(int rc) const {
#ifdef BRAID_BENCH_MPI
    if (active && rc == 0) MPI_Finalize();
#endif
    return rc;
  }
};

int run(int argc, char** argv, const MpiBootstrap& mpi);

}  // namespace

int main(int argc, char** argv) {
  MpiBootstrap mpi;
  mpi.init(&argc, &argv);
  const int rc = run(argc, argv, mpi);
  return mpi.finish(rc);
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// "a,b,c" -> {"a", "b", "c"} (the --algo and --codec lists).
std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  for (std::size_t p = 0;;) {
    const auto q = text.find(',', p);
    out.push_back(text.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) return out;
    p = q + 1;
  }
}

// Opens --csv FILE (when given) and writes its header line.
void open_csv(std::ofstream& f, const std::string& path, const char* header) {
  if (path.empty()) return;
  f.open(path);
  if (!f) throw braid::Error(braid::ErrorCode::System, "cannot write --csv file " + path);
  f << header << '\n';
}

// The order in which a side-by-side run visits its n entries in each round: as listed in
// round 0, then a fresh shuffle per round from a generator seeded with `seed` (the same
// on every rank, so that all ranks issue the same calls).
std::vector<std::vector<std::size_t>> round_orders(std::size_t n, int rounds, unsigned seed) {
  std::vector<std::size_t> order(n);
  for (std::size_t k = 0; k < n; ++k) order[k] = k;
  std::mt19937 rng(seed);
  std::vector<std::vector<std::size_t>> out;
  for (int round = 0; round < rounds; ++round) {
    if (round > 0) std::shuffle(order.begin(), order.end(), rng);
    out.push_back(order);
  }
  return out;
}

// One round of a side-by-side run: `warmup` untimed calls, a barrier, `iters` timed ones;
// returns the slowest rank's mean time per call in microseconds.
double time_round(braid::Communicator& comm, const void* send, void* recv, std::size_t count, DataType dtype,
                  ReduceOp op, const braid::AllreduceOptions& opts, int warmup, int iters, bool blocking) {
  for (int i = 0; i < warmup; ++i) comm.allreduce(send, recv, count, dtype, op, opts).wait();
  comm.barrier().wait();
  const auto t0 = std::chrono::steady_clock::now();
  braid::Work last;
  for (int it = 0; it < iters; ++it) {
    last = comm.allreduce(send, recv, count, dtype, op, opts);
    if (blocking) last.wait();
  }
  last.wait();
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
  comm.allreduce(&us, &us, 1, DataType::f64, ReduceOp::max).wait();
  return us;
}

// --codec a,b,...: every size runs each codec `rounds` times, interleaved in a fresh
// random order each round (the same on every rank), out of place on gradient-like f32
// (or, with -d, bf16/f16) inputs, with error feedback (keyed per codec and size) unless --no-ef. The table has a
// row per codec: the median over rounds, its ratio to the median of `none` (when
// listed), the effective busbw of the median, and the relative L2 error of one fresh
// step (residuals reset) against the exact all-reduce. With --device (`dsend` set), the
// buffers are device memory (dsend, drecv of at least hi bytes) and the calls join
// `stream`; inputs and the error check go through host copies.
int codec_side_by_side(braid::Communicator& comm, const std::vector<std::string>& codecs, std::size_t lo,
                       std::size_t hi, double factor, int iters, int warmup, int rounds, int check, bool blocking,
                       bool no_ef, DataType dtype, ReduceOp op, const std::string& oname, const std::string& csv,
                       void* dsend = nullptr, void* drecv = nullptr, void* stream = nullptr) {
  const int rank = comm.rank(), world = comm.size();
  const std::size_t nc = codecs.size();
  const std::size_t es = braid::dtype_size(dtype);
  const perf::Type pt = to_perf(dtype);
  std::ofstream csvf;
  if (rank == 0) {
    std::printf("# braid %s allreduce_bench codecs side by side: %d ranks, %s, op %s, iters %d, warmup %d, "
                "rounds %d%s, %s\n",
                braid::version().c_str(), world, nccl_type_name(dtype), oname.c_str(), iters, warmup, rounds,
                blocking ? ", blocking" : "",
                no_ef ? "no error feedback" : "error feedback");
    std::printf("# out-of-place; time (us) = median over rounds of the slowest rank's mean per iteration; codecs "
                "interleaved, in a fresh random order each round; busbw effective (uncompressed bytes / time)\n");
    if (dsend)
      std::printf("# device runtime: %s; buffers in device memory, one stream per rank\n",
                  braid::device::runtime().c_str());
    std::printf("#%12s %12s %12s %8s %8s %10s\n", "size(B)", "codec", "time(us)", "vs none", "busbw", "rel.L2 err");
    open_csv(csvf, csv, "size,count,codec,round,time_us");
  }
  std::vector<std::byte> send(hi + 64), recv(hi + 64);
  void* const in = dsend ? dsend : send.data();
  void* const out = dsend ? drecv : recv.data();
  long long total_wrong = 0;
  for (double size_d = static_cast<double>(lo);; size_d *= factor) {
    const std::size_t size = std::min(hi, static_cast<std::size_t>(size_d));
    const std::size_t count = size / es;
    for (std::size_t i = 0; i < count; ++i) perf::store_value(pt, send.data(), i, gradient_value(rank, i));
    if (dsend) braid::device::copy(dsend, send.data(), count * es);
    std::vector<braid::AllreduceOptions> opts(nc);
    for (std::size_t c = 0; c < nc; ++c) {
      if (dsend) {
        opts[c].stream = stream;
        opts[c].memory = braid::MemoryKind::device;
      }
      opts[c].codec = codecs[c];
      if (no_ef) opts[c].allow_biased = true;
      else opts[c].ef_key = "bench-" + codecs[c] + "-" + std::to_string(count);
    }
    std::vector<std::vector<double>> times(nc);
    const auto orders = round_orders(nc, rounds, static_cast<unsigned>(count));
    for (int round = 0; round < rounds; ++round) {
      for (const std::size_t c : orders[static_cast<std::size_t>(round)]) {
        times[c].push_back(time_round(comm, in, out, count, dtype, op, opts[c],
                                      round == 0 ? warmup : 1, iters, blocking));
        if (csvf) csvf << count * es << ',' << count << ',' << codecs[c] << ',' << round << ',' << times[c].back() << '\n';
      }
    }
    std::size_t none = nc;
    for (std::size_t c = 0; c < nc; ++c)
      if (codecs[c] == "none") none = c;
    const double none_med = none < nc ? median(times[none]) : 0.0;
    for (std::size_t c = 0; c < nc; ++c) {
      double relerr = -1;
      if (check) {
        if (!opts[c].ef_key.empty()) comm.reset_error_feedback(opts[c].ef_key);
        comm.allreduce(in, out, count, dtype, op, opts[c]).wait();
        if (dsend) braid::device::copy(recv.data(), drecv, count * es);
        double sq[2] = {0, 0};  // |out - exact|^2, |exact|^2
        for (std::size_t i = 0; i < count; ++i) {
          double exact = 0;
          for (int k = 0; k < world; ++k) exact += codec_input(dtype, k, i);
          if (op == ReduceOp::avg) exact /= world;
          const double d = codec_load(dtype, recv.data(), i) - exact;
          sq[0] += d * d;
          sq[1] += exact * exact;
        }
        comm.allreduce(sq, sq, 2, DataType::f64, ReduceOp::sum).wait();
        relerr = sq[1] > 0 ? std::sqrt(sq[0] / sq[1]) : std::sqrt(sq[0]);
        if (!std::isfinite(relerr)) ++total_wrong;
      }
      if (rank == 0) {
        const double med = median(times[c]);
        const double busbw = static_cast<double>(count * es) / (med * 1e3) * (world > 1 ? 2.0 * (world - 1) / world : 1.0);
        char ratio[16] = "-", err[16] = "-";
        if (none_med > 0) std::snprintf(ratio, sizeof ratio, "%.3f", med / none_med);
        if (relerr >= 0) std::snprintf(err, sizeof err, "%.1e", relerr);
        std::printf(" %12zu %12s %12.1f %8s %8.3f %10s\n", count * es, codecs[c].c_str(), med, ratio, busbw, err);
      }
    }
    if (rank == 0) std::fflush(stdout);
    if (size >= hi) break;
  }
  if (rank == 0) std::printf("# Out of bounds values : %lld %s\n#\n", total_wrong, total_wrong ? "FAILED" : "OK");
  return total_wrong ? 1 : 0;
}

// --algo a,b,...: every size runs each algorithm `rounds` times, interleaved (in a new
// random order each round, the same on every rank), so that all of them see the same machine. Each round is
// `iters` timed iterations (after `warmup` untimed ones the first time an algorithm
// meets a size, one afterwards); its time is the slowest rank's mean per iteration.
// The table gives the median over rounds per algorithm, the best forced one, auto's
// ratio to it, the algorithm auto runs at that size and its forced median's ratio to the
// best (auto/best also carries the noise between two runs of the same plan; pick/best
// isolates the choice), and the tuner's explanation.
int side_by_side(braid::Communicator& comm, const std::vector<std::string>& names,
                 const std::vector<braid::Algorithm>& algos, std::size_t lo, std::size_t hi, double factor, int iters,
                 int warmup, int rounds, int check, bool blocking, DataType dtype, ReduceOp op, const std::string& oname,
                 const std::string& csv) {
  const int rank = comm.rank(), world = comm.size();
  const std::size_t es = braid::dtype_size(dtype);
  const std::size_t na = algos.size();
  std::ofstream csvf;
  if (rank == 0) {
    std::printf("# braid %s allreduce_bench side by side: %d ranks, type %s, op %s, iters %d, warmup %d, rounds %d%s\n",
                braid::version().c_str(), world, nccl_type_name(dtype), oname.c_str(), iters, warmup, rounds,
                blocking ? ", blocking" : "");
    std::printf("# out-of-place; time (us) = median over rounds of the slowest rank's mean per iteration; "
                "algorithms interleaved, in a fresh random order each round\n");
    std::printf("#%12s", "size(B)");
    for (const auto& n : names) std::printf(" %10s", n.c_str());
    std::printf(" %8s %9s %7s %9s  %s\n", "best", "auto/best", "picked", "pick/best", "tuner (model; measured)");
    open_csv(csvf, csv, "size,count,algo,round,time_us");
  }
  std::vector<std::byte> send(hi + 64), recv(hi + 64);
  long long total_wrong = 0;
  for (double size_d = static_cast<double>(lo);; size_d *= factor) {
    const std::size_t size = std::min(hi, static_cast<std::size_t>(size_d));
    const std::size_t count = size / es;
    for (std::size_t i = 0; i < count; ++i) store_value(dtype, send.data(), i, input_value(op, rank, i, dtype));
    std::vector<std::vector<double>> times(na);
    const auto orders = round_orders(na, rounds, static_cast<unsigned>(count));
    for (int round = 0; round < rounds; ++round) {
      for (const std::size_t a : orders[static_cast<std::size_t>(round)]) {
        braid::AllreduceOptions opts;
        opts.algorithm = algos[a];
        const double us = time_round(comm, send.data(), recv.data(), count, dtype, op, opts, round == 0 ? warmup : 1,
                                     iters, blocking);
        times[a].push_back(us);
        if (csvf) csvf << count * es << ',' << count << ',' << names[a] << ',' << round << ',' << us << '\n';
        if (check && round == 0) {
          long long wrong = count_wrong(dtype, op, world, recv.data(), count);
          comm.allreduce(&wrong, &wrong, 1, DataType::i64, ReduceOp::sum).wait();
          if (wrong && rank == 0)
            std::printf("# %zu bytes, %s: %lld wrong elements\n", count * es, names[a].c_str(), wrong);
          total_wrong += wrong;
        }
      }
    }
    if (rank == 0) {
      std::vector<double> med(na);
      std::printf(" %12zu", count * es);
      for (std::size_t a = 0; a < na; ++a) std::printf(" %10.1f", med[a] = median(times[a]));
      std::size_t best = na, autoi = na;
      for (std::size_t a = 0; a < na; ++a) {
        if (algos[a] == braid::Algorithm::automatic) autoi = a;
        else if (best == na || med[a] < med[best]) best = a;
      }
      std::printf(" %8s", best < na ? names[best].c_str() : "-");
      if (best < na && autoi < na && med[best] > 0) std::printf(" %9.2f", med[autoi] / med[best]);
      else std::printf(" %9s", "-");
      // What auto ran (the verdict after "-> "), and that algorithm's forced time over the best.
      const std::string why = comm.explain_allreduce(count, dtype, op);
      const auto to = why.rfind("-> ");
      const std::string picked = to == std::string::npos ? "-" : why.substr(to + 3, why.find_first_of(" (", to + 3) - to - 3);
      std::size_t pi = na;
      for (std::size_t a = 0; a < na; ++a)
        if (algos[a] != braid::Algorithm::automatic && braid::parse_algorithm(picked) == algos[a]) pi = a;
      std::printf(" %7s", picked.c_str());
      if (pi < na && best < na && med[best] > 0) std::printf(" %9.2f", med[pi] / med[best]);
      else std::printf(" %9s", "-");
      const auto colon = why.find(": ");
      std::printf("  %s\n", colon == std::string::npos ? why.c_str() : why.c_str() + colon + 2);
      std::fflush(stdout);
    }
    if (size >= hi) break;
  }
  if (rank == 0) std::printf("# Out of bounds values : %lld %s\n#\n", total_wrong, total_wrong ? "FAILED" : "OK");
  return total_wrong ? 1 : 0;
}

// --- --device and --backend nccl -------------------------------------------------------

/// The device runtime's one line (braid::device::runtime()), or why there is none.
std::string device_runtime_text() {
  try {
    return braid::device::runtime();
  } catch (const std::exception& e) {
    return std::string("none: ") + e.what();
  }
}

/// A rank's device buffers and stream (--device), released on scope exit (also after a
/// partial open()).
struct DeviceSide {
  int device = 0;
  void* stream = nullptr;
  std::byte* send = nullptr;
  std::byte* recv = nullptr;

  DeviceSide() = default;
  DeviceSide(const DeviceSide&) = delete;
  DeviceSide& operator=(const DeviceSide&) = delete;
  ~DeviceSide() {
    braid::device::destroy_stream(stream);
    braid::device::free(send);
    braid::device::free(recv);
  }
  /// Two buffers of `bytes` on `dev` (the calling thread's current device) and a stream.
  void open(int dev, std::size_t bytes) {
    device = dev;
    stream = braid::device::create_stream();
    send = static_cast<std::byte*>(braid::device::alloc(bytes, dev));
    recv = static_cast<std::byte*>(braid::device::alloc(bytes, dev));
  }
};

/// One size's row (out of place, then in place) in rank 0's table and, when open, its CSV.
void print_row(std::size_t count, std::size_t es, DataType dtype, const std::string& oname, const Result (&res)[2],
               bool compressed, const std::string& codec, std::ofstream& csvf) {
  auto col = [&](const Result& x) {
    if (!compressed || x.wrong < 0) return braid::bench::wrong_text(x.wrong);
    char b[32];
    std::snprintf(b, sizeof b, "%.1e", x.relerr);
    return std::string(b);
  };
  std::printf(" %12zu %12zu %8s %6s %10.1f %8.3f %8.3f %6s %10.1f %8.3f %8.3f %6s", count * es, count,
              nccl_type_name(dtype), oname.c_str(), res[0].time_us, res[0].algbw, res[0].busbw, col(res[0]).c_str(),
              res[1].time_us, res[1].algbw, res[1].busbw, col(res[1]).c_str());
  if (res[0].api >= 0) std::printf(" %6.1f %6.1f %6.1f %6.1f", res[0].hostfn, res[0].api, res[0].sync, res[0].launch);
  std::printf("\n");
  std::fflush(stdout);
  if (csvf)
    csvf << count * es << ',' << count << ',' << nccl_type_name(dtype) << ',' << oname << ',' << res[0].time_us << ','
         << res[0].algbw << ',' << res[0].busbw << ',' << res[0].wrong << ',' << res[1].time_us << ','
         << res[1].algbw << ',' << res[1].busbw << ',' << res[1].wrong << ','
         << (compressed ? codec : std::string("none")) << ',' << res[0].relerr << ',' << res[1].relerr << ','
         << res[0].hostfn << ',' << res[0].api << ',' << res[0].sync << ',' << res[0].launch << '\n';
}

const char* const kCsvHeader =
    "size,count,type,redop,time_us,algbw_GBps,busbw_GBps,wrong,inplace_time_us,inplace_algbw_GBps,"
    "inplace_busbw_GBps,inplace_wrong,codec,relerr,inplace_relerr,hostfn,api,sync,launch";

/// The column headings of the sweep table; with `counts` (--device), the device runtime's
/// work per out-of-place call too (Result::hostfn, ...).
void print_table_head(bool counts = false) {
  std::printf("#%77s%38s%s\n", "out-of-place", "in-place", counts ? "     device work per call (out-of-place)" : "");
  std::printf("#%12s %12s %8s %6s %10s %8s %8s %6s %10s %8s %8s %6s", "size", "count", "type", "redop", "time",
              "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  if (counts) std::printf(" %6s %6s %6s %6s", "hostfn", "api", "sync", "launch");
  std::printf("\n#%12s %12s %8s %6s %10s %8s %8s %6s %10s %8s %8s %6s\n", "(B)", "(elements)", "", "", "(us)",
              "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

/// Every rank learns whether some rank failed (its `why` not empty) and, if so, the first
/// such rank's reason as "rank R: why". Collective: every rank calls it.
std::optional<std::string> first_failure(braid::Communicator& comm, const std::string& why) {
  std::int32_t first = why.empty() ? comm.size() : comm.rank();
  comm.allreduce(&first, &first, 1, DataType::i32, ReduceOp::min).wait();
  if (first == comm.size()) return std::nullopt;
  char text[512] = {};
  if (comm.rank() == first) std::snprintf(text, sizeof text, "%s", why.c_str());
  braid::BroadcastOptions o;
  o.root = first;
  comm.broadcast(text, text, sizeof text, DataType::u8, o).wait();
  text[sizeof text - 1] = '\0';
  return "rank " + std::to_string(first) + ": " + text;
}

/// --csv FILE's twin for NCCL's rows: FILE with ".csv" -> ".nccl.csv" (else FILE.nccl.csv).
std::string nccl_csv_path(const std::string& csv) {
  if (csv.empty()) return csv;
  const std::string ext = ".csv";
  if (csv.size() > ext.size() && csv.compare(csv.size() - ext.size(), ext.size(), ext) == 0)
    return csv.substr(0, csv.size() - ext.size()) + ".nccl.csv";
  return csv + ".nccl.csv";
}

/// An NCCL communicator, destroyed on scope exit (aborted unless the sweep finished).
struct NcclComm {
  const braid::bench::nccl::Library& lib;
  braid::bench::nccl::Comm comm = nullptr;
  bool finished = false;
  explicit NcclComm(const braid::bench::nccl::Library& l) : lib(l) {}
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm() {
    if (comm) (finished ? lib.CommDestroy : lib.CommAbort)(comm);
  }
};

// --backend nccl: after braid's table, the same sweep (sizes, iterations, out of place
// then in place, inputs, checks) through ncclAllReduce on the same device buffers and
// stream, as a second table. NCCL's unique id comes from rank 0 over braid's broadcast.
// Returns 1 when a checked NCCL result was wrong, else 0, also when NCCL cannot run here
// (no CUDA device memory, no libnccl, NCCL refusing the layout): the reason is printed.
int nccl_sweep(braid::Communicator& comm, DeviceSide& ds, std::vector<std::byte>& hsend,
               std::vector<std::byte>& hrecv, const std::string& library, std::size_t lo, std::size_t hi,
               const SweepFlags& sweep, bool blocking, DataType dtype, ReduceOp op, const std::string& oname,
               const std::string& csv) {
  namespace nccl = braid::bench::nccl;
  const int rank = comm.rank(), world = comm.size();
  auto say = [&](const std::string& line) {
    if (rank != 0) return;
    std::printf("# nccl: %s\n#\n", line.c_str());
    std::fflush(stdout);
  };
  const std::string rt = device_runtime_text();
  if (rt.rfind("cuda", 0) != 0) {
    say("not run: NCCL needs CUDA device memory, and this process's device runtime is " + rt);
    return 0;
  }
  nccl::Library lib;
  if (auto bad = first_failure(comm, lib.load(library))) {
    say("not run: " + *bad + " (--nccl-library names another)");
    return 0;
  }
  nccl::UniqueId id{};
  std::string why;
  if (rank == 0) {
    const nccl::Result r = lib.GetUniqueId(&id);
    if (r != nccl::kSuccess) why = "ncclGetUniqueId failed: " + lib.error(r);
  }
  if (auto bad = first_failure(comm, why)) {
    say("not run: " + *bad);
    return 0;
  }
  comm.broadcast(&id, &id, sizeof id, DataType::u8).wait();
  NcclComm nc(lib);
  const nccl::Result r = lib.CommInitRank(&nc.comm, world, id, rank);
  if (r != nccl::kSuccess) {
    // A communicator whose init failed is still handed back and freed by ncclCommAbort
    // (NcclComm's destructor); one refused before that comes back null.
    why = "ncclCommInitRank failed: " + lib.error(r);
    if (r == nccl::kInvalidUsage)
      why += " (NCCL before 2.30 refuses several ranks on one GPU: \"Duplicate GPU detected\")";
  }
  if (auto bad = first_failure(comm, why)) {
    say("not run: NCCL " + lib.version() + " from " + library + ": " + *bad + "; braid's rows above stand");
    return 0;
  }
  auto check = [&](nccl::Result x, const char* what) {
    if (x != nccl::kSuccess)
      throw braid::Error(braid::ErrorCode::System,
                         std::string(what) + " failed on rank " + std::to_string(rank) + ": " + lib.error(x, nc.comm));
  };

  const std::size_t es = braid::dtype_size(dtype);
  const int ndt = nccl::data_type(dtype), nop = nccl::red_op(op);
  std::ofstream csvf;
  if (rank == 0) {
    std::printf("# nccl %s (%s, loaded at run time) ncclAllReduce: %d ranks, type %s, op %s, iters %d, warmup %d, "
                "check %d%s; the same device buffers and streams as braid's rows\n",
                lib.version().c_str(), library.c_str(), world, nccl_type_name(dtype), oname.c_str(), sweep.iters,
                sweep.warmup, sweep.check, blocking ? ", blocking" : "");
    print_table_head();
    open_csv(csvf, nccl_csv_path(csv), kCsvHeader);
  }
  long long total_wrong = 0;
  double busbw_sum = 0;
  int nsizes = 0;
  for (double size_d = static_cast<double>(lo);; size_d *= sweep.factor) {
    const std::size_t size = std::min(hi, static_cast<std::size_t>(size_d));
    const std::size_t count = size / es;
    Result res[2];
    for (int inplace = 0; inplace < 2; ++inplace) {
      std::byte* in = inplace ? ds.recv : ds.send;
      std::byte* out = ds.recv;
      std::vector<std::byte>& hin = inplace ? hrecv : hsend;
      auto fill = [&] {
        for (std::size_t i = 0; i < count; ++i) store_value(dtype, hin.data(), i, input_value(op, rank, i, dtype));
        braid::device::copy(in, hin.data(), count * es);
      };
      auto allreduce = [&] { check(lib.AllReduce(in, out, count, ndt, nop, nc.comm, ds.stream), "ncclAllReduce"); };
      fill();
      comm.barrier().wait();
      for (int w = 0; w < sweep.warmup; ++w) allreduce();
      braid::device::synchronize(ds.stream);
      if (inplace) fill();
      comm.barrier().wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < sweep.iters; ++it) {
        allreduce();
        if (blocking) braid::device::synchronize(ds.stream);
      }
      braid::device::synchronize(ds.stream);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / sweep.iters;
      nccl::Result async = nccl::kSuccess;
      check(lib.CommGetAsyncError(nc.comm, &async), "ncclCommGetAsyncError");
      check(async, "an ncclAllReduce (asynchronous error)");
      double slowest = us;
      comm.allreduce(&slowest, &slowest, 1, DataType::f64, ReduceOp::max).wait();
      Result& x = res[inplace];
      x.time_us = slowest;
      x.algbw = static_cast<double>(count * es) / (slowest * 1e3);
      x.busbw = world > 1 ? x.algbw * 2.0 * (world - 1) / world : x.algbw;
      if (sweep.check) {
        fill();
        allreduce();
        braid::device::synchronize(ds.stream);
        braid::device::copy(hrecv.data(), out, count * es);
        long long wrong = count_wrong(dtype, op, world, hrecv.data(), count);
        comm.allreduce(&wrong, &wrong, 1, DataType::i64, ReduceOp::sum).wait();
        x.wrong = wrong;
        total_wrong += wrong;
      }
    }
    if (rank == 0) print_row(count, es, dtype, oname, res, false, "", csvf);
    busbw_sum += res[0].busbw;
    ++nsizes;
    if (size >= hi) break;
  }
  if (rank == 0) print_sweep_summary(total_wrong, busbw_sum, nsizes);
  nc.finished = true;
  return total_wrong ? 1 : 0;
}

int run(int argc, char** argv, const MpiBootstrap& mpi) {
  CLI::App app{"allreduce_bench: all-reduce bandwidth and correctness, nccl-tests style. Run under braidrun, "
               "mpirun, torchrun or srun."};
  std::string dname = "float", oname = "sum", aname = "auto", csv;
  SweepFlags sweep;
  add_sweep_flags(app, sweep);
  bool blocking = false;
  app.add_option("-z,--blocking", blocking,
                 "1: wait for each all-reduce before posting the next (a training step's pattern; the time is then "
                 "the latency of one call); 0: post all iterations, then wait (nccl-tests' default)")
      ->capture_default_str();
  app.add_option("-d,--datatype", dname, "float, half, bfloat16, double, int8, uint8, int32, int64, f8e4m3, f8e5m2")->capture_default_str();
  app.add_option("-o,--op", oname, "sum, prod, min, max, avg, premul_sum (factor 1: the cost of its scale pass)")->capture_default_str();
  app.add_option("--algo", aname,
                 "auto, ring, tree, rhd, hier; or a comma-separated list (auto,ring,tree,rhd) to run them side by "
                 "side: every size runs each algorithm --rounds times, interleaved, and the table gives the median "
                 "of each and auto's ratio to the best forced one")
      ->capture_default_str();
  int rounds = 7;
  app.add_option("--rounds", rounds, "with a list of --algo or --codec: interleaved rounds per size and entry")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--csv", csv, "also write the table as CSV to this file (rank 0)");
  double idle_seconds = 0;
  app.add_option("--idle-seconds", idle_seconds,
                 "instead of the sweep: connect, then wait this long with the communicator idle and report the "
                 "CPU the job used meanwhile (all ranks, % of one core)");
  std::string codec = "none";
  app.add_option("--codec", codec,
                 "compression inside the all-reduce: none, fp16, bf16, fp8e4m3, fp8e5m2, int8, int4, sign1, mxfp8, mxfp4, "
                 "topk:RATIO, auto (f32, sum/avg). busbw is then effective (uncompressed bytes / time) and the "
                 "#wrong column shows the relative L2 error against the exact all-reduce; or a comma-separated "
                 "list (none,fp16,int8,sign1) to run them side by side: every size runs each codec --rounds times, "
                 "interleaved, and the table gives the median of each, its ratio to none and its error")
      ->capture_default_str();
  bool no_ef = false;
  app.add_flag("--no-ef", no_ef, "with --codec: no error feedback (sign1/topk are then allowed as biased)");
  bool quiet = false;
  app.add_flag("--quiet", quiet, "no progress lines on stderr (shown only when stderr is a terminal)");
  bool device = false;
  app.add_flag("--device", device,
               "buffers in device memory (device = local rank modulo the device count), one stream per rank; the "
               "time waits for the stream (stream semantics, as nccl-tests); fills and checks copy through the "
               "host. Without a device runtime: says so (skipped) and exits 0");
  std::string backend = "braid";
  app.add_option("--backend", backend,
                 "braid; or nccl: after braid's table, ncclAllReduce (libnccl loaded at run time) on the same ranks, "
                 "sizes, device buffers and streams, as a second table (implies --device; needs CUDA: elsewhere "
                 "it says why and exits with braid's status). --csv FILE.csv: NCCL's rows go to FILE.nccl.csv")
      ->capture_default_str()
      ->check(CLI::IsMember({"braid", "nccl"}));
  std::string nccl_library = "libnccl.so.2";
  app.add_option("--nccl-library", nccl_library, "with --backend nccl: the NCCL library to load (name or path)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const bool nccl = backend == "nccl";
  if (nccl) device = true;

  const auto dtype = braid::parse_dtype(dname);
  const auto op = braid::parse_op(oname);
  // --algo a,b,c: side-by-side mode.
  const std::vector<std::string> anames = split_commas(aname);
  std::vector<braid::Algorithm> algos;
  bool algos_ok = true;
  for (const auto& a : anames) {
    const auto x = braid::parse_algorithm(a);
    if (!x) algos_ok = false;
    else algos.push_back(*x);
  }
  const bool algo = algos_ok && !algos.empty();
  std::size_t lo = 0, hi = 0;
  try {
    lo = parse_size(sweep.minb);
    hi = parse_size(sweep.maxb);
  } catch (const std::exception& e) {
    std::cerr << "allreduce_bench: " << e.what() << "\n";
    return 2;
  }
  if (device && (anames.size() > 1 || (nccl && codec.find(',') != std::string::npos) || idle_seconds > 0)) {
    std::cerr << "allreduce_bench: bad arguments: --device runs the plain sweep or a --codec list (not with --backend "
                 "nccl); drop the --algo list and --idle-seconds\n";
    return 2;
  }
  if (!dtype || !op || !algo || sweep.factor <= 1.0 || hi < lo) {
    std::cerr << "allreduce_bench: bad arguments: " << (!dtype ? "unknown -d " + dname + "; " : "")
              << (!op ? "unknown -o " + oname + "; " : "") << (!algo ? "unknown --algo " + aname + "; " : "")
              << (sweep.factor <= 1.0 ? "-f must be > 1; " : "") << (hi < lo ? "-e must be >= -b; " : "") << "\n";
    return 2;
  }

  try {
    // --device: pick this rank's device before the communicator exists (it takes the
    // current device), from the launcher's local rank (else its rank), as nccl-tests.
    DeviceSide ds;
    if (device) {
      const braid::LaunchEnvironment env = braid::launch_environment();
      const int ndev = braid::device::count();
      if (ndev == 0) {
        if (env.rank <= 0)
          std::printf("# allreduce_bench --device: skipped: no device runtime (%s)%s\n", device_runtime_text().c_str(),
                      nccl ? "; --backend nccl not run either: NCCL needs CUDA device memory" : "");
        return 0;
      }
      const int local = env.local_rank >= 0 ? env.local_rank : std::max(env.rank, 0);
      braid::device::set_device(local % ndev);
      ds.open(local % ndev, hi + 64);
    }
    braid::Communicator comm = mpi.communicator();
    const int rank = comm.rank(), world = comm.size();
    const std::size_t es = braid::dtype_size(*dtype);
    braid::AllreduceOptions opts;
    if (device) {
      opts.stream = ds.stream;
      opts.memory = braid::MemoryKind::device;
    }
    opts.algorithm = algos[0];
    const bool compressed = codec != "none" && !codec.empty();
    if (algos.size() > 1) {
      if (compressed || idle_seconds > 0)
        throw braid::Error(braid::ErrorCode::InvalidUsage,
                           "a list of --algo runs uncompressed sweeps only; drop --codec / --idle-seconds or give "
                           "one algorithm");
      return side_by_side(comm, anames, algos, lo, hi, sweep.factor, sweep.iters, sweep.warmup, rounds, sweep.check,
                          blocking, *dtype, *op, oname, csv);
    }
    if (codec.find(',') != std::string::npos) {
      if (algos.size() > 1 || idle_seconds > 0 || !codec_dtype(*dtype) ||
          (*op != ReduceOp::sum && *op != ReduceOp::avg))
        throw braid::Error(braid::ErrorCode::InvalidUsage,
                           "a list of --codec runs float/bfloat16/half sum/avg sweeps with one --algo; drop "
                           "--idle-seconds, the other -d or the --algo list");
      return codec_side_by_side(comm, split_commas(codec), lo, hi, sweep.factor, sweep.iters, sweep.warmup, rounds,
                                sweep.check, blocking, no_ef, *dtype, *op, oname, csv, device ? ds.send : nullptr,
                                device ? ds.recv : nullptr, device ? ds.stream : nullptr);
    }
    if (compressed) {
      // Its inputs are gradient-like floats (fill, below): refused here, before any byte
      // moves, rather than written as floats into a buffer of another type.
      if (!codec_dtype(*dtype))
        throw braid::Error(braid::ErrorCode::InvalidUsage,
                           "--codec takes -d float, bfloat16 or half (what the codecs compress), got " +
                               std::string(nccl_type_name(*dtype)));
      opts.codec = codec;
      if (no_ef) opts.allow_biased = true;
    }

    if (idle_seconds > 0) {
      // Connections up first (one all-reduce), then measure CPU time over an idle window.
      float warm = 1;
      comm.allreduce(&warm, &warm, 1, DataType::f32, ReduceOp::sum).wait();
      comm.barrier().wait();
      auto cpu_seconds = [] {
        rusage ru{};
        getrusage(RUSAGE_SELF, &ru);
        return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
      };
      const double c0 = cpu_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      std::this_thread::sleep_for(std::chrono::duration<double>(idle_seconds));
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      double used = cpu_seconds() - c0;
      comm.allreduce(&used, &used, 1, DataType::f64, ReduceOp::sum).wait();
      if (rank == 0)
        std::printf("# idle: %d ranks used %.4f CPU-seconds in %.2f s idle = %.3f%% of one core (all ranks)\n", world,
                    used, wall, 100.0 * used / wall);
      return 0;
    }

    std::ofstream csvf;
    if (rank == 0) {
      std::printf("# braid %s allreduce_bench: %d ranks, type %s, op %s, algo %s, iters %d, warmup %d, check %d%s\n",
                  braid::version().c_str(), world, nccl_type_name(*dtype), oname.c_str(), aname.c_str(), sweep.iters,
                  sweep.warmup, sweep.check, blocking ? ", blocking" : "");
      if (compressed)
        std::printf("# codec %s%s: busbw is effective (uncompressed bytes / time); #wrong shows the relative L2 "
                    "error against the exact all-reduce\n",
                    codec.c_str(), no_ef ? " without error feedback" : " with error feedback");
      if (device)
        std::printf("# device runtime: %s; buffers in device memory (rank 0 on device %d), one stream per rank, "
                    "time until the stream is synchronized\n",
                    device_runtime_text().c_str(), ds.device);
      if (device)
        std::printf("# device work per call, the most of any rank: hostfn = host functions enqueued, api = runtime "
                    "calls of braid's progress thread, sync = host waits for a stream, launch = kernel launches "
                    "(docs/gpu.md, \"Budgets\")\n");
      print_table_head(device);
      open_csv(csvf, csv, kCsvHeader);
    }

    const bool progress = rank == 0 && !quiet && isatty(STDERR_FILENO) == 1;
    // Host buffers; with --device, the host side of fills and checks of ds's buffers.
    std::vector<std::byte> send(hi + 64), recv(hi + 64);
    std::byte* const sendp = device ? ds.send : send.data();
    std::byte* const recvp = device ? ds.recv : recv.data();
    long long total_wrong = 0;
    double busbw_sum = 0;
    int nsizes = 0;
    for (double size_d = static_cast<double>(lo);; size_d *= sweep.factor) {
      const std::size_t size = std::min(hi, static_cast<std::size_t>(size_d));
      const std::size_t count = size / es;
      Result res[2];
      if (progress) {
        std::fprintf(stderr, "\r\033[K# measuring %zu bytes (%d+%d iterations, out-of-place and in-place)...",
                     (size / es) * es, sweep.warmup, sweep.iters);
        std::fflush(stderr);
      }
      for (int inplace = 0; inplace < 2; ++inplace) {
        void* in = inplace ? recvp : sendp;
        void* out = recvp;
        void* const hin = inplace ? recv.data() : send.data();
        const void* hout = recv.data();
        auto fill = [&] {
          if (compressed) {  // gradient-like values: codecs are exact on small integers
            for (std::size_t i = 0; i < count; ++i) store_value(*dtype, hin, i, gradient_value(rank, i));
          } else {
            for (std::size_t i = 0; i < count; ++i) store_value(*dtype, hin, i, input_value(*op, rank, i, *dtype));
          }
          if (device) braid::device::copy(in, hin, count * es);
        };
        // The result where the host can read it (--device: copied back).
        auto result = [&] {
          if (device) braid::device::copy(recv.data(), out, count * es);
        };
        // A fresh error-feedback key per size and placement, so that residuals never
        // mismatch in count.
        if (compressed && !no_ef) opts.ef_key = "bench-" + std::to_string(count) + (inplace ? "-in" : "-out");
        fill();
        comm.barrier().wait();
        if (device) {
          // As the timed calls are issued (back to back, then one wait), so that what a call
          // in flight holds (its pinned slots, docs/gpu.md "Memory") is pooled before timing.
          braid::Work warm;
          for (int w = 0; w < sweep.warmup; ++w) warm = comm.allreduce(in, out, count, *dtype, *op, opts);
          braid::device::synchronize(ds.stream);
          warm.wait();
        } else {
          for (int w = 0; w < sweep.warmup; ++w) comm.allreduce(in, out, count, *dtype, *op, opts).wait();
        }
        if (inplace) fill();
        comm.barrier().wait();
        const braid::device::Counts c0 = braid::device::counts();
        const auto t0 = std::chrono::steady_clock::now();
        braid::Work last;
        for (int it = 0; it < sweep.iters; ++it) {
          last = comm.allreduce(in, out, count, *dtype, *op, opts);
          if (blocking && device) braid::device::synchronize(ds.stream);
          else if (blocking) last.wait();
        }
        if (device) braid::device::synchronize(ds.stream);  // stream semantics: the stream is done
        last.wait();                                        // (and a failed call throws here)
        const double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / sweep.iters;
        const braid::device::Counts c1 = braid::device::counts();
        double slowest = us;
        comm.allreduce(&slowest, &slowest, 1, DataType::f64, ReduceOp::max).wait();
        Result& r = res[inplace];
        if (device) {
          // Per call, less the benchmark's own synchronisations (one per call with
          // --blocking, one at the end).
          const double bench_syncs = 1.0 + (blocking ? sweep.iters : 0);
          double work[4] = {static_cast<double>(c1.hostfn - c0.hostfn),
                            static_cast<double>(c1.progress_api - c0.progress_api),
                            static_cast<double>(c1.sync - c0.sync) - bench_syncs,
                            static_cast<double>(c1.launch - c0.launch)};
          for (double& w : work) w /= sweep.iters;
          comm.allreduce(work, work, 4, DataType::f64, ReduceOp::max).wait();
          r.hostfn = work[0];
          r.api = work[1];
          r.sync = work[2];
          r.launch = work[3];
        }
        r.time_us = slowest;
        r.algbw = static_cast<double>(count * es) / (slowest * 1e3);
        r.busbw = world > 1 ? r.algbw * 2.0 * (world - 1) / world : r.algbw;
        if (sweep.check && compressed) {
          // One fresh step (residuals reset, so the error is the codec's, not history's).
          comm.reset_error_feedback(opts.ef_key);
          fill();
          comm.allreduce(in, out, count, *dtype, *op, opts).wait();
          result();
          double sq[2] = {0, 0};  // |out - exact|^2, |exact|^2
          for (std::size_t i = 0; i < count; ++i) {
            double exact = 0;
            for (int k = 0; k < world; ++k) exact += codec_input(*dtype, k, i);
            if (*op == ReduceOp::avg) exact /= world;
            const double d = codec_load(*dtype, hout, i) - exact;
            sq[0] += d * d;
            sq[1] += exact * exact;
          }
          comm.allreduce(sq, sq, 2, DataType::f64, ReduceOp::sum).wait();
          r.relerr = sq[1] > 0 ? std::sqrt(sq[0] / sq[1]) : std::sqrt(sq[0]);
          r.wrong = std::isfinite(r.relerr) ? 0 : 1;
          total_wrong += r.wrong;
        } else if (sweep.check) {
          fill();
          comm.allreduce(in, out, count, *dtype, *op, opts).wait();
          result();
          long long wrong = count_wrong(*dtype, *op, world, hout, count);
          comm.allreduce(&wrong, &wrong, 1, DataType::i64, ReduceOp::sum).wait();
          r.wrong = wrong;
          total_wrong += wrong;
        }
      }
      if (progress) std::fprintf(stderr, "\r\033[K");
      if (rank == 0) print_row(count, es, *dtype, oname, res, compressed, codec, csvf);
      busbw_sum += res[0].busbw;
      ++nsizes;
      if (size >= hi) break;
    }
    if (rank == 0) print_sweep_summary(total_wrong, busbw_sum, nsizes);
    int rc = total_wrong ? 1 : 0;
    if (nccl && compressed) {
      if (rank == 0) std::printf("# nccl: not run: NCCL has no --codec (compression inside the all-reduce)\n#\n");
    } else if (nccl) {
      rc |= nccl_sweep(comm, ds, send, recv, nccl_library, lo, hi, sweep, blocking, *dtype, *op, oname, csv);
    }
    return rc;
  } catch (const braid::Error& e) {
    std::cerr << "allreduce_bench: " << e.what() << "\n";
    return e.code() == braid::ErrorCode::InvalidUsage || e.code() == braid::ErrorCode::Unsupported ? 2 : 1;
  }
}

}  // namespace
