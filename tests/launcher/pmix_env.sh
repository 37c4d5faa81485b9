#!/usr/bin/env bash
# mpirun without hand-set addresses, for programs that do not use MPI: three ranks of a
# plain braid program (pmix_helper) under Open MPI's mpirun with no BRAID_*/MASTER_*
# address find rank 0's store through mpirun's PMIx server, twice in a row, and
# all-reduce exactly. Then the same with BRAID_PMIX_LIBRARY pointing at nothing: every
# rank must fail with an error that names the fix (BRAID_MASTER_ADDR), not hang. Last, a
# rank that never creates its communicator: the others get braid's Timeout from the PMIx
# fence within BRAID_TIMEOUT (3 s here; mpirun itself then complains about that rank).
# Skips (77) without Open MPI's mpirun.
set -u
helper=$1
# ASan builds: libpmix's own allocations outlive PMIx_Finalize; suppress only those. The
# slow unwinder sees through glibc's vasprintf (no frame pointers), which libpmix calls,
# so those stacks show libpmix too; these ranks are short, the cost is nothing.
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(cd "$(dirname "$0")" && pwd)/lsan_pmix.supp"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (scripts/setup.sh installs Open MPI)"; exit 77; }
mpirun --version 2>/dev/null | grep -q "Open MPI" || { echo "SKIP: mpirun is not Open MPI's"; exit 77; }
for v in $(env | sed -n 's/^\(BRAID_[A-Z_]*\|MASTER_[A-Z]*\|RANK\|WORLD_SIZE\|LOCAL_RANK\|SLURM_[A-Z_]*\|PMIX_[A-Z_]*\)=.*/\1/p'); do
  unset "$v"
done
run() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 100 \
    mpirun --oversubscribe --bind-to none -np 3 --mca oob_tcp_if_include lo -x BRAID_TIMEOUT=60s "$@" 2>&1
}
out=$(run "$helper")
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: mpirun exited $rc"; exit 1; }
n=$(grep -c "pmix ok" <<<"$out")
[ "$n" -eq 3 ] || { echo "FAIL: $n of 3 ranks said pmix ok"; exit 1; }

out=$(run -x BRAID_PMIX_LIBRARY=/nonexistent/libpmix.so.2 "$helper" expect-error)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: with no PMIx library, mpirun exited $rc"; exit 1; }
n=$(grep -c "pmix error after .*cannot load /nonexistent/libpmix.so.2.*BRAID_MASTER_ADDR" <<<"$out")
[ "$n" -eq 3 ] || { echo "FAIL: $n of 3 ranks named the missing library and the fix"; exit 1; }

out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 100 \
  mpirun --oversubscribe --bind-to none -np 3 --mca oob_tcp_if_include lo -x BRAID_TIMEOUT=3s "$helper" absent 2 2>&1)
echo "$out"
n=$(grep -c "pmix error after [0-9.]* s: braid Timeout: PMIx fence" <<<"$out")
[ "$n" -eq 2 ] || { echo "FAIL: $n of the 2 waiting ranks got braid's Timeout from the fence"; exit 1; }
slow=$(sed -n 's/^pmix error after \([0-9.]*\) s.*/\1/p' <<<"$out" | awk '$1 > 7 {print}')
[ -z "$slow" ] || { echo "FAIL: the timeout (3 s) took $slow s to report"; exit 1; }
echo "PASS: 3 mpirun ranks without MPI found the store through PMIx (twice); a missing libpmix and an absent rank are clear errors"
