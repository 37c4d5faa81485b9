// gloo_allreduce_bench: allreduce_bench's sweep over Gloo's all-reduce algorithms, for
// side-by-side runs with braid and MPI (bench/compare/run.sh).
//
//   mpirun -np 4 --bind-to none gloo_allreduce_bench --algo ring_chunked -b 4K -e 64M -c 1
//
// Same flags, input values, checking, columns and CSV header as allreduce_bench. Launch:
// under mpirun; MPI gives rank and size and broadcasts the rendezvous directory (rank 0
// creates a fresh one under /tmp unless --store names one), and is used for nothing
// else: Gloo's ranks meet through a gloo::rendezvous::FileStore in that directory (a
// shared file system works across emulated hosts and, on NFS, across real ones) and talk
// over Gloo's TCP transport, bound to --iface's address, else the address --hostname (by
// default this host's name) resolves to.
//
// Algorithms (--algo): ring, ring_chunked, halving_doubling, bcube (the classic
// in-place algorithm classes) and allreduce_ring, allreduce_bcube (the newer
// gloo::allreduce() with its algorithm option, which takes separate input and output).
// The classic ones work in place only: their out-of-place time includes copying the
// input into the output buffer first (as a caller would have to). Timing as
// mpi_allreduce_bench: iterations back to back, time = slowest rank's average,
// algbw = size / time, busbw = algbw * 2(n-1)/n. Types: float, double, int8, uint8,
// int32, int64; ops: sum, prod, min, max.
#include <gloo/algorithm.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <mpi.h>

#include <CLI/CLI.hpp>

#include "bench_args.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

namespace {


enum class Op { sum, prod, min, max };

struct Args : braid::bench::SweepFlags {
  std::string dname = "float", oname = "sum", algo = "ring_chunked", csv, store, iface, hostname;
  int timeout_s = 300;
  bool quiet = false;
};

// The same inputs as allreduce_bench: small integers, exact in every type.
template <typename T>
T input_value(Op op, int rank, std::size_t i) {
  const auto k = static_cast<long long>((static_cast<std::size_t>(rank) * 7 + i * 13) % 5);
  const bool unsigned_t = std::is_unsigned<T>::value;
  if (op == Op::prod) return static_cast<T>((k == 0 && !unsigned_t) ? -1 : 1);
  if (unsigned_t) return static_cast<T>(k % 3);
  return static_cast<T>(k % 3 - 1);
}

template <typename T>
T expected_value(Op op, int world, std::size_t i) {
  T acc = input_value<T>(op, 0, i);
  for (int r = 1; r < world; ++r) {
    const T v = input_value<T>(op, r, i);
    switch (op) {
      case Op::sum: acc = static_cast<T>(acc + v); break;
      case Op::prod: acc = static_cast<T>(acc * v); break;
      case Op::min: acc = std::min(acc, v); break;
      case Op::max: acc = std::max(acc, v); break;
    }
  }
  return acc;
}

template <typename T>
const gloo::ReductionFunction<T>* reduction(Op op) {
  switch (op) {
    case Op::sum: return gloo::ReductionFunction<T>::sum;
    case Op::prod: return gloo::ReductionFunction<T>::product;
    case Op::min: return gloo::ReductionFunction<T>::min;
    case Op::max: return gloo::ReductionFunction<T>::max;
  }
  return nullptr;
}

template <typename T>
gloo::AllreduceOptions::Func reduce_func(Op op) {
  using F = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case Op::sum: return static_cast<F>(&gloo::sum<T>);
    case Op::prod: return static_cast<F>(&gloo::product<T>);
    case Op::min: return static_cast<F>(&gloo::min<T>);
    case Op::max: return static_cast<F>(&gloo::max<T>);
  }
  return nullptr;
}

bool is_classic(const std::string& a) {
  return a == "ring" || a == "ring_chunked" || a == "halving_doubling" || a == "bcube";
}

// One all-reduce of `count` elements from `in` into `out` (in == out: in place), set up
// once per size so the timed loop measures only the collective.
template <typename T>
std::function<void()> make_op(const std::shared_ptr<gloo::Context>& ctx, const std::string& algo, Op op, T* in,
                              T* out, std::size_t count, std::uint32_t tag) {
  const int n = static_cast<int>(count);
  if (is_classic(algo)) {
    std::vector<T*> ptrs{out};
    std::shared_ptr<gloo::Algorithm> a;
    if (algo == "ring") a = std::make_shared<gloo::AllreduceRing<T>>(ctx, ptrs, n, reduction<T>(op));
    else if (algo == "ring_chunked") a = std::make_shared<gloo::AllreduceRingChunked<T>>(ctx, ptrs, n, reduction<T>(op));
    else if (algo == "halving_doubling")
      a = std::make_shared<gloo::AllreduceHalvingDoubling<T>>(ctx, ptrs, n, reduction<T>(op));
    else a = std::make_shared<gloo::AllreduceBcube<T>>(ctx, ptrs, n, reduction<T>(op));
    if (in == out) return [a] { a->run(); };
    return [a, in, out, count] {
      std::memcpy(out, in, count * sizeof(T));
      a->run();
    };
  }
  const auto kind = algo == "allreduce_bcube" ? gloo::AllreduceOptions::Algorithm::BCUBE
                                              : gloo::AllreduceOptions::Algorithm::RING;
  const auto fn = reduce_func<T>(op);
  return [ctx, kind, fn, in, out, count, tag] {
    gloo::AllreduceOptions o(ctx);
    o.setAlgorithm(kind);
    if (in != out) o.setInput(in, count);
    o.setOutput(out, count);
    o.setReduceFunction(fn);
    o.setTag(tag);
    gloo::allreduce(o);
  };
}

double slowest(const std::shared_ptr<gloo::Context>& ctx, double v) {
  std::vector<double*> p{&v};
  gloo::AllreduceRing<double>(ctx, p, 1, gloo::ReductionFunction<double>::max).run();
  return v;
}

long long total(const std::shared_ptr<gloo::Context>& ctx, long long v) {
  std::vector<long long*> p{&v};
  gloo::AllreduceRing<long long>(ctx, p, 1, gloo::ReductionFunction<long long>::sum).run();
  return v;
}

void barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions o(ctx);
  gloo::barrier(o);
}

using Result = braid::bench::SweepResult;

template <typename T>
int sweep(const std::shared_ptr<gloo::Context>& ctx, const Args& a, Op op, std::size_t lo, std::size_t hi) {
  const int rank = ctx->rank, world = ctx->size;
  const std::size_t es = sizeof(T);
  std::ofstream csvf;
  if (rank == 0) {
    std::printf("# gloo %d.%d.%d gloo_allreduce_bench: %d ranks, type %s, op %s, algo %s, iters %d, warmup %d, "
                "check %d\n",
                GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH, world, a.dname.c_str(),
                a.oname.c_str(), a.algo.c_str(), a.iters, a.warmup, a.check);
    std::printf("#%77s%38s\n", "out-of-place", "in-place");
    std::printf("#%12s %12s %8s %6s %10s %8s %8s %6s %10s %8s %8s %6s\n", "size", "count", "type", "redop", "time",
                "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    std::printf("#%12s %12s %8s %6s %10s %8s %8s %6s %10s %8s %8s %6s\n", "(B)", "(elements)", "", "", "(us)",
                "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    if (!a.csv.empty()) {
      csvf.open(a.csv);
      if (!csvf) {
        std::cerr << "gloo_allreduce_bench: cannot write --csv file " << a.csv << "\n";
        return 1;
      }
      csvf << "size,count,type,redop,time_us,algbw_GBps,busbw_GBps,wrong,"
              "inplace_time_us,inplace_algbw_GBps,inplace_busbw_GBps,inplace_wrong\n";
    }
  }
  const bool progress = rank == 0 && !a.quiet && isatty(STDERR_FILENO) == 1;
  const std::size_t maxcount = hi / es + 1;
  std::vector<T> send(maxcount), recv(maxcount);
  long long total_wrong = 0;
  double busbw_sum = 0;
  int nsizes = 0;
  std::uint32_t tag = 1;
  for (double size_d = static_cast<double>(lo);; size_d *= a.factor) {
    const std::size_t size = std::min(hi, static_cast<std::size_t>(size_d));
    const std::size_t count = size / es;
    if (progress) {
      std::fprintf(stderr, "\r\033[K# measuring %zu bytes...", count * es);
      std::fflush(stderr);
    }
    Result res[2];
    for (int inplace = 0; inplace < 2; ++inplace) {
      T* in = inplace ? recv.data() : send.data();
      T* out = recv.data();
      auto fill = [&] {
        for (std::size_t i = 0; i < count; ++i) in[i] = input_value<T>(op, rank, i);
      };
      fill();
      Result& r = res[inplace];
      if (count == 0) {  // Gloo's algorithms want at least one element; nothing moves.
        r.wrong = a.check ? 0 : -1;
        continue;
      }
      auto run = make_op<T>(ctx, a.algo, op, in, out, count, tag++);
      barrier(ctx);
      for (int w = 0; w < a.warmup; ++w) run();
      if (inplace) fill();
      barrier(ctx);
      const auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < a.iters; ++it) run();
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / a.iters;
      r.time_us = slowest(ctx, us);
      r.algbw = static_cast<double>(count * es) / (r.time_us * 1e3);
      r.busbw = world > 1 ? r.algbw * 2.0 * (world - 1) / world : r.algbw;
      if (a.check) {
        fill();
        run();
        long long wrong = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const T e = expected_value<T>(op, world, i);
          if (std::memcmp(&e, &out[i], es) != 0) ++wrong;
        }
        r.wrong = total(ctx, wrong);
        total_wrong += r.wrong;
      }
    }
    if (progress) std::fprintf(stderr, "\r\033[K");
    if (rank == 0) braid::bench::print_sweep_row(count, es, a.dname, a.oname, res, csvf);
    busbw_sum += res[0].busbw;
    ++nsizes;
    if (size >= hi) break;
  }
  if (rank == 0) braid::bench::print_sweep_summary(total_wrong, busbw_sum, nsizes);
  return total_wrong ? 1 : 0;
}

// Rank 0 makes a fresh rendezvous directory (unless --store gave one) and tells the others.
std::string rendezvous_dir(int rank, const std::string& given) {
  char buf[4096] = {};
  int ok = 1;
  if (rank == 0) {
    std::string dir = given;
    if (dir.empty()) {
      char tmpl[] = "/tmp/gloo-bench-XXXXXX";
      if (::mkdtemp(tmpl) == nullptr) ok = 0;
      dir = tmpl;
    }
    if (dir.size() >= sizeof buf) ok = 0;
    else std::memcpy(buf, dir.c_str(), dir.size());
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return ok ? std::string(buf) : std::string();
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  auto finish = [](int rc) {
    if (rc == 0) MPI_Finalize();  // after a failure the others may never reach its fence
    return rc;
  };

  Args a;
  CLI::App app{"gloo_allreduce_bench: allreduce_bench's sweep over Gloo's all-reduce. Run under mpirun."};
  braid::bench::add_sweep_flags(app, a);
  app.add_option("-d,--datatype", a.dname, "float, double, int8, uint8, int32, int64")->capture_default_str();
  app.add_option("-o,--op", a.oname, "sum, prod, min, max")->capture_default_str();
  app.add_option("--algo", a.algo, "ring, ring_chunked, halving_doubling, bcube, allreduce_ring, allreduce_bcube")
      ->capture_default_str();
  int blocking = 1;
  app.add_option("-z,--blocking", blocking,
                 "accepted for compatibility with allreduce_bench: Gloo's all-reduce always blocks (as -z 1)")
      ->capture_default_str();
  app.add_option("--csv", a.csv, "also write the table as CSV to this file (rank 0)");
  app.add_option("--store", a.store, "rendezvous directory shared by all ranks (default: a fresh one under /tmp)");
  app.add_option("--iface", a.iface, "network interface whose address Gloo binds (default: see --hostname)");
  app.add_option("--hostname", a.hostname, "address or name Gloo binds (default: this host's name, resolved)");
  app.add_option("--timeout", a.timeout_s, "seconds Gloo waits for any operation")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--quiet", a.quiet, "no progress lines on stderr (shown only when stderr is a terminal)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = rank == 0 ? app.exit(e) : e.get_exit_code();
    return finish(rc);
  }

  std::string err;
  Op op = Op::sum;
  if (a.oname == "sum") op = Op::sum;
  else if (a.oname == "prod") op = Op::prod;
  else if (a.oname == "min") op = Op::min;
  else if (a.oname == "max") op = Op::max;
  else err += "unknown -o " + a.oname + " (sum, prod, min, max); ";
  const std::string algos[] = {"ring", "ring_chunked", "halving_doubling", "bcube", "allreduce_ring", "allreduce_bcube"};
  if (std::find(std::begin(algos), std::end(algos), a.algo) == std::end(algos))
    err += "unknown --algo " + a.algo + " (ring, ring_chunked, halving_doubling, bcube, allreduce_ring, allreduce_bcube); ";
  std::size_t lo = 0, hi = 0;
  err += braid::bench::read_sweep(a, &lo, &hi);
  if (hi > static_cast<std::size_t>(INT_MAX)) err += "-e must be below 2 GiB (Gloo counts elements in int); ";
  const char* types[] = {"float", "double", "int8", "uint8", "int32", "int64"};
  if (std::find_if(std::begin(types), std::end(types), [&](const char* t) { return a.dname == t; }) == std::end(types))
    err += "unknown -d " + a.dname + " (float, double, int8, uint8, int32, int64; Gloo has no bfloat16 here); ";
  if (!err.empty()) {
    if (rank == 0) std::cerr << "gloo_allreduce_bench: bad arguments: " << err << "\n";
    return finish(2);
  }

  const std::string dir = rendezvous_dir(rank, a.store);
  if (dir.empty()) {
    if (rank == 0) std::cerr << "gloo_allreduce_bench: cannot create a rendezvous directory under /tmp\n";
    return finish(1);
  }
  int rc = 1;
  try {
    gloo::transport::tcp::attr attr;
    if (!a.iface.empty()) attr.iface = a.iface;
    else if (!a.hostname.empty()) attr.hostname = a.hostname;
    else {
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      attr.hostname = host;
    }
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore fstore(dir);
    gloo::rendezvous::PrefixStore store("gloo-bench", fstore);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
    ctx->setTimeout(std::chrono::seconds(a.timeout_s));
    ctx->connectFullMesh(store, dev);
    std::shared_ptr<gloo::Context> base = ctx;
    if (a.dname == "float") rc = sweep<float>(base, a, op, lo, hi);
    else if (a.dname == "double") rc = sweep<double>(base, a, op, lo, hi);
    else if (a.dname == "int8") rc = sweep<std::int8_t>(base, a, op, lo, hi);
    else if (a.dname == "uint8") rc = sweep<std::uint8_t>(base, a, op, lo, hi);
    else if (a.dname == "int32") rc = sweep<std::int32_t>(base, a, op, lo, hi);
    else rc = sweep<std::int64_t>(base, a, op, lo, hi);
    barrier(base);
  } catch (const std::exception& e) {
    std::cerr << "gloo_allreduce_bench: rank " << rank << ": " << e.what() << "\n";
    rc = 1;
  }
  if (rc == 0 && a.store.empty()) {
    MPI_Barrier(MPI_COMM_WORLD);  // every rank is done with the rendezvous files
    std::error_code ec;
    if (rank == 0) std::filesystem::remove_all(dir, ec);
  }
  return finish(rc);
}
