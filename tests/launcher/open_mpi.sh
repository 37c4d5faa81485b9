# Sourced by the tests that run ranks under Open MPI's mpirun on this host
# (from_mpi.sh, mpi_collectives.sh, tests/nccl/mpi_example.sh): skips (77) without Open
# MPI's mpirun, clears the launcher address variables, and defines mpi3, which runs its
# arguments as 3 ranks over loopback (ob1/tcp) with output on stdout.
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (scripts/setup.sh installs Open MPI)"; exit 77; }
mpirun --version 2>/dev/null | grep -q "Open MPI" || { echo "SKIP: mpirun is not Open MPI's"; exit 77; }
# ASan build: leak checking off for these ranks only. Open MPI does not free its
# component tables at MPI_Finalize and dlcloses the components, so LeakSanitizer reports
# dozens of leaks in "<unknown module>" that no suppression can name. Memory errors are
# still caught; braid's own leak checks run in every other test of that build.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
unset BRAID_MASTER_ADDR BRAID_MASTER_PORT MASTER_ADDR MASTER_PORT BRAID_RANK BRAID_WORLD_SIZE RANK WORLD_SIZE
mpi3() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 100 \
    mpirun --oversubscribe --bind-to none -np 3 --mca pml ob1 --mca btl self,tcp \
    --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -x BRAID_TIMEOUT=60s "$@" 2>&1
}
