// mpi_allreduce_bench: allreduce_bench's sweep over MPI_Allreduce, for side-by-side runs.
//
//   mpirun -np 4 --bind-to none mpi_allreduce_bench -b 4K -e 64M -f 2 -c 1
//
// Same flags, input values, checking, columns and CSV header as allreduce_bench, so the
// two tables compare line by line (scripts/compare.sh runs both on the same ranks).
// Timing: the iterations run back to back (blocking MPI_Allreduce in a loop: MPI forbids
// several outstanding non-blocking collectives on one buffer), time is the slowest rank's
// average per iteration, algbw = size / time, busbw = algbw * 2(n-1)/n. In-place uses
// MPI_IN_PLACE. MPI has no standard half or bfloat16 type and no avg op: those exit 2.
#include <mpi.h>

#include <CLI/CLI.hpp>

#include "bench_args.hpp"
#include "collective_perf.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using braid::bench::add_sweep_flags;
using braid::bench::print_sweep_row;
using braid::bench::print_sweep_summary;
using braid::bench::read_sweep;
using braid::bench::SweepFlags;

// Types, inputs and expected results are collective_bench's (collective_perf.hpp).
using braid::bench::count_wrong_allreduce;
using braid::bench::input_value;
using braid::bench::Op;
using braid::bench::store_value;
using braid::bench::Type;

struct TypeInfo {
  const char* name;
  Type type;
  MPI_Datatype mpi;
  std::size_t size;
};

using Result = braid::bench::SweepResult;

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  auto finish = [](int rc) {
    MPI_Finalize();
    return rc;
  };

  CLI::App app{"mpi_allreduce_bench: allreduce_bench's sweep over MPI_Allreduce. Run under mpirun."};
  std::string dname = "float", oname = "sum", aname = "auto", csv;
  SweepFlags sweep;
  add_sweep_flags(app, sweep);
  app.add_option("-d,--datatype", dname, "float, double, int8, uint8, int32, int64 (no half/bfloat16 in MPI)")->capture_default_str();
  app.add_option("-o,--op", oname, "sum, prod, min, max (no avg in MPI)")->capture_default_str();
  app.add_option("--algo", aname, "accepted for compatibility and ignored: MPI picks its own algorithm")->capture_default_str();
  int blocking = 1;
  app.add_option("-z,--blocking", blocking,
                 "accepted for compatibility with allreduce_bench: MPI_Allreduce always blocks (as -z 1)")
      ->capture_default_str();
  app.add_option("--csv", csv, "also write the table as CSV to this file (rank 0)");
  bool quiet = false;
  app.add_flag("--quiet", quiet, "no progress lines on stderr (shown only when stderr is a terminal)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank == 0) return finish(app.exit(e));
    return finish(e.get_exit_code());
  }

  // Every rank validates the same arguments, so all leave together; rank 0 explains.
  std::string err;
  const TypeInfo types[] = {{"float", Type::f32, MPI_FLOAT, 4},  {"double", Type::f64, MPI_DOUBLE, 8},
                            {"int8", Type::i8, MPI_INT8_T, 1},   {"uint8", Type::u8, MPI_UINT8_T, 1},
                            {"int32", Type::i32, MPI_INT32_T, 4}, {"int64", Type::i64, MPI_INT64_T, 8}};
  const TypeInfo* ti = nullptr;
  for (const auto& t : types)
    if (dname == t.name) ti = &t;
  if (!ti) {
    if (dname == "half" || dname == "bfloat16")
      err += "-d " + dname + " is unsupported by MPI (no standard half-precision type; use float, double, int8, uint8, int32 or int64); ";
    else
      err += "unknown -d " + dname + "; ";
  }
  Op op = Op::sum;
  MPI_Op mop = MPI_SUM;
  if (oname == "sum") op = Op::sum, mop = MPI_SUM;
  else if (oname == "prod") op = Op::prod, mop = MPI_PROD;
  else if (oname == "min") op = Op::min, mop = MPI_MIN;
  else if (oname == "max") op = Op::max, mop = MPI_MAX;
  else if (oname == "avg") err += "-o avg is unsupported by MPI (MPI_Allreduce has no average; use sum); ";
  else err += "unknown -o " + oname + "; ";
  std::size_t lo = 0, hi = 0;
  err += read_sweep(sweep, &lo, &hi);
  if (ti && hi / ti->size > static_cast<std::size_t>(INT_MAX)) err += "-e too large for an MPI int count; ";
  if (!err.empty()) {
    if (rank == 0) std::cerr << "mpi_allreduce_bench: " << err.substr(0, err.size() - 2) << "\n";
    return finish(2);
  }

  const MPI_Datatype dt = ti->mpi;
  const std::size_t es = ti->size;
  std::ofstream csvf;
  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string libname(lib, static_cast<std::size_t>(len));
    libname = libname.substr(0, libname.find_first_of(",\n"));
    std::printf("# %s mpi_allreduce_bench: %d ranks, type %s, op %s, algo mpi, iters %d, warmup %d, check %d\n",
                libname.c_str(), world, ti->name, oname.c_str(), sweep.iters, sweep.warmup, sweep.check);
    if (aname != "auto") std::printf("# --algo %s ignored: MPI picks its own algorithm\n", aname.c_str());
    std::printf("#%77s%38s\n", "out-of-place", "in-place");
    std::printf("#%12s %12s %8s %6s %10s %8s %8s %6s %10s %8s %8s %6s\n", "size", "count", "type", "redop", "time",
                "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    std::printf("#%12s %12s %8s %6s %10s %8s %8s %6s %10s %8s %8s %6s\n", "(B)", "(elements)", "", "", "(us)",
                "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    if (!csv.empty()) {
      csvf.open(csv);
      if (!csvf) std::cerr << "mpi_allreduce_bench: cannot write --csv file " << csv << "\n";
      else
        csvf << "size,count,type,redop,time_us,algbw_GBps,busbw_GBps,wrong,"
                "inplace_time_us,inplace_algbw_GBps,inplace_busbw_GBps,inplace_wrong\n";
    }
  }
  int csv_ok = csv.empty() || static_cast<bool>(csvf);
  MPI_Bcast(&csv_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!csv_ok) return finish(1);

  std::vector<std::byte> send(hi + 64), recv(hi + 64);
  long long total_wrong = 0;
  double busbw_sum = 0;
  int nsizes = 0;
  const bool progress = rank == 0 && !quiet && isatty(STDERR_FILENO) == 1;
  for (double size_d = static_cast<double>(lo);; size_d *= sweep.factor) {
    const std::size_t size = std::min(hi, static_cast<std::size_t>(size_d));
    const std::size_t count = size / es;
    const int n = static_cast<int>(count);
    Result res[2];
    if (progress) {
      std::fprintf(stderr, "\r\033[K# measuring %zu bytes...", (size / ti->size) * ti->size);
      std::fflush(stderr);
    }
    for (int inplace = 0; inplace < 2; ++inplace) {
      void* in = inplace ? recv.data() : send.data();
      void* out = recv.data();
      const void* sendarg = inplace ? MPI_IN_PLACE : in;
      auto fill = [&] {
        for (std::size_t i = 0; i < count; ++i) store_value(ti->type, in, i, input_value(op, rank, i, ti->type));
      };
      fill();
      MPI_Barrier(MPI_COMM_WORLD);
      for (int w = 0; w < sweep.warmup; ++w) MPI_Allreduce(sendarg, out, n, dt, mop, MPI_COMM_WORLD);
      if (inplace) fill();
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < sweep.iters; ++it) MPI_Allreduce(sendarg, out, n, dt, mop, MPI_COMM_WORLD);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / sweep.iters;
      double slowest = us;
      MPI_Allreduce(MPI_IN_PLACE, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      Result& r = res[inplace];
      r.time_us = slowest;
      r.algbw = static_cast<double>(count * es) / (slowest * 1e3);
      r.busbw = world > 1 ? r.algbw * 2.0 * (world - 1) / world : r.algbw;
      if (sweep.check) {
        fill();
        MPI_Allreduce(sendarg, out, n, dt, mop, MPI_COMM_WORLD);
        long long wrong = count_wrong_allreduce(ti->type, op, world, static_cast<std::byte*>(out), count, es);
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        r.wrong = wrong;
        total_wrong += wrong;
      }
    }
    if (progress) std::fprintf(stderr, "\r\033[K");
    if (rank == 0) print_sweep_row(count, es, ti->name, oname, res, csvf);
    busbw_sum += res[0].busbw;
    ++nsizes;
    if (size >= hi) break;
  }
  if (rank == 0) print_sweep_summary(total_wrong, busbw_sum, nsizes);
  return finish(total_wrong ? 1 : 0);
}
