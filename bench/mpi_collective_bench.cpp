// mpi_collective_bench: collective_bench's sweep over MPI, for side-by-side runs on the
// same ranks (same flags, inputs, checks and columns: collective_perf.hpp).
//
//   mpirun -np 4 --bind-to none mpi_collective_bench --coll allgather -b 1K -e 64M
//
// MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Bcast, MPI_Reduce,
// MPI_Alltoall and MPI_Sendrecv, called back to back (blocking). In-place forms use
// MPI_IN_PLACE with MPI's layouts (reduce_scatter's result lands at the start of the
// buffer; broadcast has one buffer). MPI has no standard half or bfloat16 type and no avg
// op: those exit 2.
#include <mpi.h>

#include <CLI/CLI.hpp>

#include "collective_args.hpp"

#include <climits>
#include <iostream>
#include <string>

namespace {

using namespace braid::bench;

MPI_Datatype mpi_type(Type t) {
  switch (t) {
    case Type::f32: return MPI_FLOAT;
    case Type::f64: return MPI_DOUBLE;
    case Type::i8: return MPI_INT8_T;
    case Type::u8: return MPI_UINT8_T;
    case Type::i32: return MPI_INT32_T;
    case Type::i64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(Op op) {
  switch (op) {
    case Op::sum: return MPI_SUM;
    case Op::prod: return MPI_PROD;
    case Op::min: return MPI_MIN;
    case Op::max: return MPI_MAX;
    default: return MPI_OP_NULL;
  }
}

class MpiBackend final : public Backend {
 public:
  MpiBackend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string banner() const override {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    const std::string s(lib, static_cast<std::size_t>(len));
    return s.substr(0, s.find_first_of(",\n"));
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  double max(double v) override {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
  }
  long long sum(long long v) override {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    return v;
  }
  Layout in_place(Coll c, std::byte* send, std::byte* recv, std::size_t count, std::size_t es) override {
    if (c == Coll::reduce_scatter) return {recv, recv};  // MPI leaves the block at the start
    return Backend::in_place(c, send, recv, count, es);
  }
  Layout out_of_place(Coll c, std::byte* send, std::byte* recv) override {
    if (c == Coll::broadcast) return {recv, recv};  // one buffer
    return {send, recv};
  }
  void run(Coll c, const Layout& l, std::size_t count, const TypeInfo& t, Op op, int root, int iters,
           bool) override {
    const MPI_Datatype dt = mpi_type(t.type);
    const MPI_Op mop = mpi_op(op);
    const int n = static_cast<int>(count);
    const bool aliased = l.in == l.out;
    for (int it = 0; it < iters; ++it) {
      switch (c) {
        case Coll::allreduce:
          MPI_Allreduce(aliased ? MPI_IN_PLACE : l.in, l.out, n, dt, mop, MPI_COMM_WORLD);
          break;
        case Coll::allgather:
          // In place: this rank's block already sits in the output.
          if (l.in != l.out && l.in > l.out && l.in < l.out + static_cast<std::size_t>(world_) * count * t.size)
            MPI_Allgather(MPI_IN_PLACE, n, dt, l.out, n, dt, MPI_COMM_WORLD);
          else
            MPI_Allgather(l.in, n, dt, l.out, n, dt, MPI_COMM_WORLD);
          break;
        case Coll::reduce_scatter:
          MPI_Reduce_scatter_block(aliased ? MPI_IN_PLACE : l.in, l.out, n, dt, mop, MPI_COMM_WORLD);
          break;
        case Coll::broadcast: MPI_Bcast(l.out, n, dt, root, MPI_COMM_WORLD); break;
        case Coll::reduce:
          MPI_Reduce(aliased && rank_ == root ? MPI_IN_PLACE : l.in, l.out, n, dt, mop, root, MPI_COMM_WORLD);
          break;
        case Coll::alltoall:
          MPI_Alltoall(aliased ? MPI_IN_PLACE : l.in, n, dt, l.out, n, dt, MPI_COMM_WORLD);
          break;
        case Coll::gather:
          // In place on the root: its block already sits in the output (braid's layout).
          if (rank_ == root && l.in != l.out && l.in > l.out &&
              l.in < l.out + static_cast<std::size_t>(world_) * count * t.size)
            MPI_Gather(MPI_IN_PLACE, n, dt, l.out, n, dt, root, MPI_COMM_WORLD);
          else
            MPI_Gather(l.in, n, dt, l.out, n, dt, root, MPI_COMM_WORLD);
          break;
        case Coll::scatter:
          if (rank_ == root && l.out != l.in && l.out > l.in &&
              l.out < l.in + static_cast<std::size_t>(world_) * count * t.size)
            MPI_Scatter(l.in, n, dt, MPI_IN_PLACE, n, dt, root, MPI_COMM_WORLD);
          else
            MPI_Scatter(l.in, n, dt, l.out, n, dt, root, MPI_COMM_WORLD);
          break;
        case Coll::allgatherv:
        case Coll::alltoallv: {
          const auto v = v_counts(c, count, world_, rank_);
          const auto at = v_offsets(v);
          std::vector<int> vc(v.begin(), v.end()), va(at.begin(), at.end());
          if (c == Coll::allgatherv)
            // In place: this rank's block already sits in the output.
            MPI_Allgatherv(l.in > l.out && l.in < l.out + static_cast<std::size_t>(world_) * count * t.size ? MPI_IN_PLACE
                                                                                                     : l.in,
                           vc[static_cast<std::size_t>(rank_)], dt,
                           l.out, vc.data(), va.data(), dt, MPI_COMM_WORLD);
          else
            MPI_Alltoallv(aliased ? MPI_IN_PLACE : l.in, vc.data(), va.data(), dt, l.out, vc.data(), va.data(), dt,
                          MPI_COMM_WORLD);
          break;
        }
        case Coll::sendrecv:
          MPI_Sendrecv(l.in, n, dt, (rank_ + 1) % world_, 0, l.out, n, dt, (rank_ + world_ - 1) % world_, 0,
                       MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          break;
      }
    }
  }

 private:
  int rank_ = 0, world_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MpiBackend b;
  auto finish = [](int rc) {
    MPI_Finalize();
    return rc;
  };
  CLI::App app{"mpi_collective_bench: collective_bench's sweep over MPI. Run under mpirun."};
  SweepArgs args;
  args.blocking = 1;
  add_sweep_options(app, args, "float, double, int8, uint8, int32, int64 (no half/bfloat16 in MPI)",
                    "sum, prod, min, max (no avg in MPI)",
                    "accepted for compatibility: MPI's blocking calls always wait (as -z 1)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return finish(b.rank() == 0 ? app.exit(e) : e.get_exit_code());
  }
  // Every rank validates the same arguments, so all leave together; rank 0 explains.
  SweepOptions o;
  std::string err = resolve(args, "mpi_collective_bench", &o);
  o.blocking = true;
  if (o.type && mpi_type(o.type->type) == MPI_DATATYPE_NULL)
    err += "-d " + args.dtype + " is unsupported by MPI (no standard half-precision or fp8 type); ";
  if (Op op{}; parse_op(args.op, &op) && mpi_op(op) == MPI_OP_NULL)
    err += "-o " + args.op + " is unsupported by MPI (no average; use sum); ";
  if (o.type && o.hi / o.type->size > static_cast<std::size_t>(INT_MAX)) err += "-e too large for an MPI int count; ";
  if (o.root < 0 || o.root >= b.world()) err += "-r " + std::to_string(o.root) + " is not a rank; ";
  if (!err.empty()) {
    if (b.rank() == 0) std::cerr << "mpi_collective_bench: bad arguments: " << err << "\n";
    return finish(2);
  }
  return finish(sweep(b, o));
}
