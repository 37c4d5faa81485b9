/* An NCCL program, as NCCL's documentation writes one ("one device per process"), run on
 * braid by linking libbraid_nccl instead of libnccl. MPI only carries the unique id.
 *
 *   mpirun -np 4 build/examples/nccl/nccl_allreduce_mpi [max_bytes]
 *
 * With no GPU (or BRAID_GPU_BACKEND=none) the buffers are host memory, which braid takes
 * where NCCL would not; a CUDA program would cudaMalloc them and pass its stream. Prints, per
 * size, the median time of 20 all-reduces and the bus bandwidth as nccl-tests defines it. */
#include <braid/nccl.h>
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>

#define NCCLCHECK(cmd)                                                                  \
  do {                                                                                  \
    ncclResult_t r = (cmd);                                                             \
    if (r != ncclSuccess) {                                                             \
      fprintf(stderr, "%s:%d '%s': %s\n", __FILE__, __LINE__, ncclGetErrorString(r),    \
              ncclGetLastError(NULL));                                                  \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                     \
    }                                                                                   \
  } while (0)

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  int rank = 0, nranks = 1;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  size_t max_bytes = argc > 1 ? (size_t)strtoull(argv[1], NULL, 0) : ((size_t)1 << 24);

  ncclUniqueId id;
  if (rank == 0) NCCLCHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));

  float* buf = malloc(max_bytes);
  if (rank == 0) printf("%12s %12s %12s %8s\n", "bytes", "time_us", "busbw_GB/s", "check");
  for (size_t bytes = 8; bytes <= max_bytes; bytes *= 8) {
    size_t count = bytes / sizeof(float);
    double t[20];
    int wrong = 0;
    for (int it = 0; it < 20; ++it) {
      for (size_t i = 0; i < count; ++i) buf[i] = (float)(rank + 1);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      NCCLCHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL));
      t[it] = MPI_Wtime() - t0;
      for (size_t i = 0; i < count; ++i) wrong += buf[i] != (float)(nranks * (nranks + 1) / 2);
    }
    qsort(t, 20, sizeof(double), by_value);
    double median = (t[9] + t[10]) / 2;
    double busbw = (double)bytes / median * 2.0 * (nranks - 1) / nranks / 1e9;
    int all_wrong = 0;
    MPI_Reduce(&wrong, &all_wrong, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("%12zu %12.1f %12.2f %8s\n", bytes, median * 1e6, busbw, all_wrong ? "WRONG" : "ok");
    if (all_wrong) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  free(buf);
  NCCLCHECK(ncclCommFinalize(comm));
  NCCLCHECK(ncclCommDestroy(comm));
  MPI_Finalize();
  return 0;
}
