#!/usr/bin/env bash
# braid::from_mpi (include/braid/mpi.hpp) under Open MPI's mpirun on this host, 3 ranks,
# with no BRAID_* or MASTER_* address set: MPI_COMM_WORLD and a split half each become
# a braid communicator and all-reduce exactly. Skips (77) without Open MPI's mpirun.
set -u
helper=$1
. "$(dirname "$0")/open_mpi.sh"
out=$(mpi3 "$helper")
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: mpirun exited $rc"; exit 1; }
n=$(grep -c "from_mpi ok" <<<"$out")
[ "$n" -eq 3 ] || { echo "FAIL: $n of 3 ranks said from_mpi ok"; exit 1; }
echo "PASS: braid::from_mpi on 3 MPI ranks and a split half"
