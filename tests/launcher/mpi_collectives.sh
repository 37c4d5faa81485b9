#!/usr/bin/env bash
# The side-by-side pair for every collective under Open MPI's mpirun, 3 ranks on this host:
# mpi_collective_bench (MPI_Allgather, MPI_Reduce_scatter_block, ...) and collective_bench
# (bootstrapped through braid::from_mpi) must both check every element right, out of place
# and in place, root 2 where there is one. Skips (77) without Open MPI's mpirun.
#   tests/launcher/mpi_collectives.sh COLLECTIVE_BENCH MPI_COLLECTIVE_BENCH
set -uo pipefail
braid_bench=$1
mpi_bench=$2
. "$(dirname "$0")/open_mpi.sh"
for c in allreduce allgather reduce_scatter broadcast reduce alltoall gather scatter sendrecv; do
  for bench in "$mpi_bench" "$braid_bench"; do
    out=$(mpi3 "$bench" --coll "$c" -b 4 -e 256K -f 16 -n 2 -w 1 -c 1 -d int32 -o max -r 2)
    rc=$?
    if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out"; then
      echo "$out"
      echo "FAIL: $(basename "$bench") --coll $c (exit $rc)"
      exit 1
    fi
  done
done
echo "PASS: every collective, braid and MPI, under mpirun"
