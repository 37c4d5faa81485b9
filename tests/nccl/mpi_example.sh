#!/usr/bin/env bash
# examples/nccl/allreduce_mpi.c (an NCCL program linked against libbraid_nccl) under Open
# MPI's mpirun, 3 ranks on this host: every size's result must check. Skips (77) without
# Open MPI's mpirun.
#   tests/nccl/mpi_example.sh NCCL_ALLREDUCE_MPI
set -uo pipefail
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (scripts/setup.sh installs Open MPI)"; exit 77; }
mpirun --version 2>/dev/null | grep -q "Open MPI" || { echo "SKIP: mpirun is not Open MPI's"; exit 77; }
# ASan build: Open MPI's own allocations show as leaks at exit (see tests/launcher/from_mpi.sh).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
unset BRAID_MASTER_ADDR BRAID_MASTER_PORT MASTER_ADDR MASTER_PORT BRAID_RANK BRAID_WORLD_SIZE RANK WORLD_SIZE
out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 100 \
  mpirun --oversubscribe --bind-to none -np 3 --mca pml ob1 --mca btl self,tcp \
  --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -x BRAID_TIMEOUT=60s "$1" 4194304 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
# 8 B to 2 MiB by factors of 8: seven sizes, each checked on every rank
[ "$(grep -c ' ok$' <<<"$out")" -eq 7 ] || { echo "FAIL: not every size checked ok"; exit 1; }
