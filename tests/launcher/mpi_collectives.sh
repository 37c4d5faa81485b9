#!/usr/bin/env bash
# The side-by-side pair for every collective under Open MPI's mpirun, 3 ranks on this host:
# mpi_collective_bench (MPI_Allgather, MPI_Reduce_scatter_block, ...) and collective_bench
# (bootstrapped through braid::from_mpi) must both check every element right, out of place
# and in place, root 2 where there is one. Skips (77) without Open MPI's mpirun.
#   tests/launcher/mpi_collectives.sh COLLECTIVE_BENCH MPI_COLLECTIVE_BENCH
set -uo pipefail
braid_bench=$1
mpi_bench=$2
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (scripts/setup.sh installs Open MPI)"; exit 77; }
mpirun --version 2>/dev/null | grep -q "Open MPI" || { echo "SKIP: mpirun is not Open MPI's"; exit 77; }
# ASan build: Open MPI's own allocations show as leaks at exit (see from_mpi.sh).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
unset BRAID_MASTER_ADDR BRAID_MASTER_PORT MASTER_ADDR MASTER_PORT BRAID_RANK BRAID_WORLD_SIZE RANK WORLD_SIZE
mpi() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 100 \
    mpirun --oversubscribe --bind-to none -np 3 --mca pml ob1 --mca btl self,tcp \
    --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -x BRAID_TIMEOUT=60s "$@" 2>&1
}
for c in allreduce allgather reduce_scatter broadcast reduce alltoall gather scatter sendrecv; do
  for bench in "$mpi_bench" "$braid_bench"; do
    out=$(mpi "$bench" --coll "$c" -b 4 -e 256K -f 16 -n 2 -w 1 -c 1 -d int32 -o max -r 2)
    rc=$?
    if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out"; then
      echo "$out"
      echo "FAIL: $(basename "$bench") --coll $c (exit $rc)"
      exit 1
    fi
  done
done
echo "PASS: every collective, braid and MPI, under mpirun"
