// Under mpirun: braid::from_mpi over MPI_COMM_WORLD and over an MPI_Comm_split half,
// with no BRAID_* or MASTER_* variable set; each communicator's ranks and size equal
// MPI's, and an all-reduce over it is exact. Prints "from_mpi ok" on every rank.
#include <braid/braid.hpp>
#include <braid/mpi.hpp>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {
int check(braid::Communicator& c, MPI_Comm comm, const char* what) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (c.rank() != rank || c.size() != size) {
    std::fprintf(stderr, "%s: braid rank %d/%d, MPI rank %d/%d\n", what, c.rank(), c.size(), rank, size);
    return 1;
  }
  std::vector<double> x(1000, rank + 1.0);
  c.allreduce(x.data(), x.data(), x.size(), braid::DataType::f64, braid::ReduceOp::sum).wait();
  const double want = size * (size + 1) / 2.0;
  for (double v : x)
    if (v != want) {
      std::fprintf(stderr, "%s: all-reduce gave %g, want %g\n", what, v, want);
      return 1;
    }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  for (const char* v : {"BRAID_MASTER_ADDR", "BRAID_MASTER_PORT", "MASTER_ADDR", "MASTER_PORT"})
    if (std::getenv(v) != nullptr) {  // the point is that none is needed
      std::fprintf(stderr, "%s is set; this test runs without it\n", v);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  int rc = 0;
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  try {
    braid::Communicator world = braid::from_mpi(MPI_COMM_WORLD);
    rc |= check(world, MPI_COMM_WORLD, "MPI_COMM_WORLD");
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half);
    braid::Communicator sub = braid::from_mpi(half);
    rc |= check(sub, half, "split half");
    MPI_Comm_free(&half);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", world_rank, e.what());
    rc = 1;
  }
  if (rc == 0) std::printf("rank %d: from_mpi ok\n", world_rank);
  MPI_Finalize();
  return rc;
}
