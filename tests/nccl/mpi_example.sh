#!/usr/bin/env bash
# examples/nccl/allreduce_mpi.c (an NCCL program linked against libbraid_nccl) under Open
# MPI's mpirun, 3 ranks on this host: every size's result must check. Skips (77) without
# Open MPI's mpirun.
#   tests/nccl/mpi_example.sh NCCL_ALLREDUCE_MPI
set -uo pipefail
. "$(dirname "$0")/../launcher/open_mpi.sh"
out=$(mpi3 "$1" 4194304)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
# 8 B to 2 MiB by factors of 8: seven sizes, each checked on every rank
[ "$(grep -c ' ok$' <<<"$out")" -eq 7 ] || { echo "FAIL: not every size checked ok"; exit 1; }
