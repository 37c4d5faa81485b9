// The command line of collective_bench and mpi_collective_bench: nccl-tests' flags, read
// the same way by both (collective_perf.hpp runs the sweep).
#pragma once

#include "bench_args.hpp"
#include "collective_perf.hpp"

#include <CLI/CLI.hpp>

#include <string>

namespace braid::bench {

struct SweepArgs : SweepFlags {
  std::string coll = "allreduce", dtype = "float", op = "sum", csv;
  int root = 0, blocking = 0;
  bool quiet = false;
};

/// Adds nccl-tests' flags; `dtypes`, `ops` and `blocking` are the help texts that differ.
inline void add_sweep_options(CLI::App& app, SweepArgs& a, const char* dtypes, const char* ops, const char* blocking) {
  app.add_option("--coll", a.coll, "allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall, gather, scatter or sendrecv")
      ->capture_default_str();
  add_sweep_flags(app, a);
  app.add_option("-d,--datatype", a.dtype, dtypes)->capture_default_str();
  app.add_option("-o,--op", a.op, ops)->capture_default_str();
  app.add_option("-r,--root", a.root, "root rank of broadcast, reduce, gather and scatter")->capture_default_str();
  app.add_option("-z,--blocking", a.blocking, blocking)->capture_default_str();
  app.add_option("--csv", a.csv, "also write the table as CSV to this file (rank 0)");
  app.add_flag("--quiet", a.quiet, "accepted for compatibility with allreduce_bench (this bench prints no progress lines)");
}

/// Fills `o` from `a`; returns what is wrong, "; "-separated ("" when nothing is). The
/// root is checked against the world size by the caller, which knows it.
inline std::string resolve(const SweepArgs& a, const char* program, SweepOptions* o) {
  std::string err;
  o->coll = find_coll(a.coll);
  o->type = find_type(a.dtype);
  o->op_name = a.op;
  o->root = a.root;
  o->factor = a.factor;
  o->iters = a.iters;
  o->warmup = a.warmup;
  o->check = a.check;
  o->blocking = a.blocking != 0;
  o->csv = a.csv;
  o->program = program;
  if (!o->coll) err += "unknown --coll " + a.coll + "; ";
  if (!o->type) err += "unknown -d " + a.dtype + "; ";
  if (!parse_op(a.op, &o->op)) err += "unknown -o " + a.op + "; ";
  err += read_sweep(a, &o->lo, &o->hi);
  return err;
}

}  // namespace braid::bench
