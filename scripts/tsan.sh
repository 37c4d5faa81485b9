#!/usr/bin/env bash
# scripts/tsan.sh [--full]: the tests that exercise braid's threads (the progress engine and
# the waiting threads that help it, transports, stores, the failure paths) under
# ThreadSanitizer. Configures build-tsan/ (RelWithDebInfo, -fsanitize=thread, no CUDA, no
# Python, tools, benches or examples), builds the library and only the test executables
# below, and runs them with ctest under TSAN_OPTIONS halt_on_error=1 and tests/tsan.supp.
# Exits non-zero when a test fails or when any process wrote a ThreadSanitizer report
# (printed at the end, from build-tsan/tsan-reports/). docs/reliability.md,
# "ThreadSanitizer", has the times.
#
# Three passes: every selected test with the default progress (the engine thread drives),
# then the multirank tests again with BRAID_WAIT_HELPS=1 (waiting threads take the engine's
# drive lock and run its loop: the hand-off TSan should see most), then the fault matrix
# (tests/faults, label faults: forked ranks killed, aborted, stopped or leaving mid
# collective, the store's server or host stopped, killed or cut off), where the engine's
# failure paths run: a failed step, the error's hand-over, the deadline's chase of waits
# through the store on threads of its own, the closing of a failed communicator.
#
# Default (CI): every store, transport and conformance test; the multirank tests outside
# the transport x world grids; of the grids, the points of world 3 (every transport and
# auto: odd, neither a pair nor a power of two). Pass 2 runs the shm points of world 3 and
# the tests outside the grids. Pass 3 runs the fault matrix's CI subset (below).
# --full: every point of every grid, the dtype x op x count grid (AllreduceThreads.
# EveryTypeOpAndCount) included, and the ucx points again over UCX_TLS=sm,self (the
# *_ucx_sm tests); pass 2 as tests/CMakeLists.txt's *_wait_helps tests (every point but
# tcp and auto) without EveryTypeOpAndCount; pass 3 the whole fault matrix (95 tests, 289 s
# with -j2 under TSan). About 30 minutes on 2 cores, plus the build.
#
# The fault matrix's CI subset (faults_ci below: 56 of its 95 tests; 2 min with -j2 under
# TSan, 123 to 127 s measured, where the whole matrix takes 4.8 min): every distinct failure path over shm and tcp
# (every collective with a rank killed and aborted; a stalled peer; a rank that leaves; the
# store's server killed during and after bootstrap; the rank serving the store stopped and
# killed; the store stopped, killed or cut off from one rank, then a rank killed, and once a
# rank stopped; mismatched calls), and over ucx and ibverbs a rank killed and aborted in the
# ring and a rank that leaves. Left out of CI, and why:
# - the kill and abort points of ucx and ibverbs in the other seven collectives (28 tests,
#   1 to 5 s each): the engine's failure path is the one the shm and tcp points run, and each
#   transport's detection of a dead peer is the ring point's.
# - a stopped peer over ucx and ibverbs, StoreHostFails/shm_stopped, and the StoreLost
#   points with rank 1 stopped other than tcp_store_stopped (8 tests): each waits out a
#   deadline scaled to 20 s under TSan (21 to 27 s a test), on a path another point in the
#   subset runs (the stall's chase is transport-independent; how the store is reached does
#   not depend on the transport).
# - MismatchedCalls over tcp, ucx and ibverbs (22, 42 and 44 s): the argument check and the
#   guard zones do not depend on the transport; shm runs.
#
# Left out, and why:
# - Processes.AllreduceOverFileStoreIsBitwiseIdentical: under TSan the measured tuner's
#   trials (about a thousand calls per size bucket, a bucket per dtype x op, worlds 1 to 8
#   as processes) take longer than the test's 300 s limit; its threads are those of
#   Processes.AllreduceOverTcpStoreServedByRankZero and the grids, which run.
# - the *_wait_helps tests (whole executables, grids included, over 900 s under TSan):
#   pass 2 replaces them; the dtype x op x count grid stays out of it (3 min a point).
# - test_device_collectives_direct (the device suite on the direct path): world 3 of its grid
#   only (its ctest entry's filter in a TSan build), in pass 1 only (90 s whole, under TSan).
# - pass 2 leaves the tcp, auto and ucx points to pass 1: tests/CMakeLists.txt's
#   *_wait_helps leave tcp and auto out too, and over ucx no waiting thread helps.
# - tests that run no braid code in threads: unit tests of pure functions (codecs, plans,
#   verifier, cost model, kernels, config), layering, package and library checks.
# - the gpu label (CUDA kernels and runtime: the static CUDA runtime does not mix with
#   TSan, so the build has no CUDA), python (the installed extension is not
#   instrumented), launcher and cluster (braidrun, mpirun and Open MPI processes), and
#   bench_smoke (the benches are not built).
# UCX: UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no, as under ASan (scripts/test.sh): with
# UCX's memory hooks on, libucm patches madvise, which glibc calls as a thread exits,
# after TSan has let go of the thread, and the hook's lock crashes the process (SIGSEGV
# in __tsan::MutexPreReadLock under ucm_madvise).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
full=0
case "${1:-}" in
  --full) full=1 ;;
  "") ;;
  *) echo "usage: scripts/tsan.sh [--full]" >&2; exit 2 ;;
esac
jobs=$(nproc 2>/dev/null || echo 2)
out=build-tsan
start=$SECONDS

tests=(
  test_allreduce test_collectives test_compressed_allreduce test_debug_checks  # multirank
  test_device_collectives test_device_hazards test_processes_and_failures     # (and the engine)
  test_observability
  test_store test_store_tls test_tls                                           # TcpStore (TLS too), FileStore, PrefixStore
  test_transport_conformance test_transport_registry                           # transports
  test_shm_transport test_tcp_transport test_ucx_lib
  test_faults                                                                  # the fault matrix
  test_agreement test_shrink                                                   # shrink: the agreement, survivors going on
)

# The fault matrix's CI subset (the header says what is left out), as one ctest -R (whose
# regular expressions allow 9 groups at most).
faults_ci=(
  '^StoreServer\.'                                                   # the store server killed, during and after bootstrap
  '^DevShm\.'                                                        # /dev/shm full (root only, else skipped)
  '^Kill/.*/(shm|tcp)_'                                              # a rank killed or aborted in every collective
  '^Kill/.*/(ucx|ibverbs)_(killed|aborted)_in_ring'                  # ... and in the ring over ucx and ibverbs
  '^Silent/.*/(shm|tcp)_stopped_in_ring'                             # a stalled peer, found by the deadline
  '^Silent/.*_left_in_ring'                                          # a rank that leaves, every transport
  '^Faults/StoreHostFails\..*/(tcp_stopped|shm_killed|tcp_killed)'   # the store's host stopped or killed
  '^Faults/StoreLost\..*_rank1_killed'                               # the store stopped, killed, cut off; a rank killed
  '^Faults/StoreLost\..*/tcp_store_stopped_rank1_stopped'            # ... and a rank stopped
  '^Transports/MismatchedCalls\..*/shm'                              # mismatched calls, checked and unchecked
  '^Faults/Shrink\..*/tcp_ring_4ranks_'                              # survivors shrink: one, two, rank 0 killed; a revoke
  '^(Grow|ShrinkArguments)\.'                                        # ... grow back with a newcomer
)

echo "== ThreadSanitizer build ($out/) =="
cmake -S "$root" -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBRAID_SANITIZE=thread \
  -DBRAID_WITH_CUDA=OFF -DBRAID_BUILD_PYTHON=OFF -DBRAID_BUILD_BENCH=OFF -DBRAID_BUILD_TOOLS=OFF \
  -DBRAID_BUILD_EXAMPLES=OFF -DBRAID_SHARED=OFF -DBRAID_INSTALL=OFF >/dev/null
cmake --build "$out" -j "$jobs" --target "${tests[@]}"
echo "built in $((SECONDS - start)) s"

# Only the executables above are built: the others appear to ctest as *_NOT_BUILT.
skip='_NOT_BUILT$|^layering$|_wait_helps$|^Processes\.AllreduceOverFileStoreIsBitwiseIdentical$'
if [ "$full" = 0 ]; then
  # Grid points other than world 3 ("…/tcp_n5  # GetParam() = …"), the dtype grid, the
  # ucx_sm reruns.
  skip+='|/[a-z]+_n([0-24-9]|[0-9][0-9]+)( |$)|EveryTypeOpAndCount|_ucx_sm$'
fi

reports=$root/$out/tsan-reports
rm -rf "$reports"
mkdir -p "$reports"
# halt_on_error: a process stops at its first report (exit 66), so its test fails; every
# process, forked ranks included, writes its reports to $reports/report.<pid>.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/tsan.supp:log_path=$reports/report"
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no

# A test that fails gets a second run: under TSan braid runs 5 to 15 times slower, and on a
# busy machine a test may fail on time alone (a transport's dead-peer detection once fired on
# a forked rank that had read nothing for 5 s). A report still fails the run, retry or not: it
# stays in $reports. The Release and ASan suites give no second run.
retry=(--repeat until-pass:2)
rc=0
t=$SECONDS
echo "== pass 1: unit (stores, transports) and multirank tests =="
(cd "$out" && ctest -j "$jobs" --output-on-failure "${retry[@]}" -L '^(unit|multirank)$' -E "$skip") || rc=1
echo "pass 1: $((SECONDS - t)) s"

t=$SECONDS
echo "== pass 2: multirank tests with BRAID_WAIT_HELPS=1 =="
(cd "$out" && BRAID_WAIT_HELPS=1 ctest -j "$jobs" --output-on-failure "${retry[@]}" -L '^multirank$' \
   -E "$skip|EveryTypeOpAndCount|_ucx_sm$|_direct$|/(tcp|auto|ucx)_n") || rc=1
echo "pass 2: $((SECONDS - t)) s"

t=$SECONDS
echo "== pass 3: the fault matrix ($([ "$full" = 1 ] && echo every test || echo the CI subset)) =="
faults_only=()
if [ "$full" = 0 ]; then
  faults_only=(-R "$(IFS='|'; echo "${faults_ci[*]}")")
fi
(cd "$out" && ctest -j "$jobs" --output-on-failure "${retry[@]}" -L '^faults$' "${faults_only[@]}" -E '_NOT_BUILT$') || rc=1
echo "pass 3: $((SECONDS - t)) s"

found=0
for f in "$reports"/report.*; do
  [ -s "$f" ] || continue
  found=$((found + 1))
  echo "== ThreadSanitizer report: $f"
  head -c 20000 "$f"
done
if [ "$found" -gt 0 ]; then
  echo "tsan.sh: $found process(es) wrote ThreadSanitizer reports (above; all in $reports/)" >&2
  rc=1
fi
echo "tsan.sh: $((SECONDS - start)) s in all ($([ "$full" = 1 ] && echo full || echo CI) selection)"
[ "$rc" = 0 ] && echo "== ThreadSanitizer: clean ==" || echo "== ThreadSanitizer: FAILED ==" >&2
exit "$rc"
