#!/usr/bin/env bash
# scripts/perf_guard.sh [BUILD_DIR]: the performance guard scripts/test.sh runs after the
# Release suite (issue 32: a 3x small-message regression landed once and no test saw it).
#
# braid's allreduce_bench (under braidrun, shared memory) against Open MPI's
# MPI_Allreduce (mpi_allreduce_bench under mpirun, vader), 2 ranks on this machine,
# interleaved run by run, 7 pairs of runs:
#   - 4 KiB f32 sum, each call waited (-z 1): median time per call;
#   - 64 MiB f32 sum: median busbw.
# The ratio judged is, for the 4 KiB time, the median over the pairs of braid's figure over
# Open MPI's; for the 64 MiB busbw, braid's best run over Open MPI's best (see round()).
# It fails only on a clear regression: braid's 4 KiB time above 3x Open MPI's, or its
# 64 MiB busbw below 1.5x Open MPI's. A round beyond a limit is measured again, twice at
# most, the last after a minute's pause, and the guard fails only when every round is
# beyond it, so that a slow stretch of the machine does not fail CI while a real regression
# (which shows in every round) does. Such stretches happen: right after heavy work (a test
# suite, a build) braid's 64 MiB busbw here has read 1.5-3.7 GB/s for minutes against
# 4.0-4.4 idle, while Open MPI's moved 5 % (braid runs near the machine's copy bandwidth,
# Open MPI far below it). Each round prints the machine's memcpy bandwidth beside it
# (bench_reduce, when built) so that such a stretch can be told from a regression. The figures
# are printed either way; docs/performance.md says what they were when it was written.
# Without Open MPI (mpirun, mpi_allreduce_bench) it says so and exits 0: there is nothing
# to compare against (scripts/setup.sh installs it). PERF_GUARD_RUNS sets the runs per
# round (default 7).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
b=${1:-$root/build}
runs=${PERF_GUARD_RUNS:-7}
braidrun=$b/tools/braidrun bench=$b/bench/allreduce_bench mpibench=$b/bench/mpi_allreduce_bench
for f in "$braidrun" "$bench"; do [ -x "$f" ] || { echo "perf_guard: $f not built" >&2; exit 1; }; done
if ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$mpibench" ]; then
  echo "perf_guard: SKIPPED: no Open MPI to compare against (mpirun or $mpibench missing; scripts/setup.sh installs it)"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# One run: prints "time_us busbw" of the size's out-of-place row, or nothing.
braid_run() { timeout -k 5 120 "$braidrun" -n 2 --timeout 100 -- "$bench" --quiet "$@" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ { print $5, $7; exit }'; }
mpi_run() { timeout -k 5 120 mpirun -np 2 --bind-to none --mca btl self,vader "$mpibench" "$@" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ { print $5, $7; exit }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# round NAME COLUMN ARGS...: $runs pairs of runs (braid, then Open MPI right after);
# sets braid_m and mpi_m (medians of COLUMN: 1 = time, 2 = busbw) and ratio, the median
# of the pairs' braid/MPI ratios: a slow moment of the machine slows both runs of a pair
# and leaves their ratio, where it would move one median and not the other. Prints them.
round() {
  local name=$1 col=$2 i a m x y bs=() ms=() rs=()
  shift 2
  for ((i = 0; i < runs; i++)); do
    a=$(braid_run "$@"); m=$(mpi_run "$@")
    [ -n "$a" ] || { echo "perf_guard: braid's run failed: $braidrun -n 2 -- $bench $*" >&2; exit 1; }
    [ -n "$m" ] || { echo "perf_guard: Open MPI's run failed: mpirun -np 2 $mpibench $*" >&2; exit 1; }
    x=$(cut -d' ' -f"$col" <<<"$a"); y=$(cut -d' ' -f"$col" <<<"$m")
    bs+=("$x"); ms+=("$y"); rs+=("$(awk -v a="$x" -v m="$y" 'BEGIN { printf "%.3f", a / m }')")
  done
  braid_m=$(printf '%s\n' "${bs[@]}" | median); mpi_m=$(printf '%s\n' "${ms[@]}" | median)
  ratio=$(printf '%s\n' "${rs[@]}" | median | awk '{ printf "%.2f", $1 }')
  printf 'perf_guard: %-34s braid %8s  Open MPI %8s  ratio %5s  (braid runs: %s; MPI runs: %s)\n' \
    "$name" "$braid_m" "$mpi_m" "$ratio" "${bs[*]}" "${ms[*]}"
  if [ "$col" = 2 ]; then
    # Bandwidth: the best run of each over the round. This machine's slow stretches (seconds to
    # minutes; their cause, in the VM's host, is not established) halve braid's 64 MiB busbw, which runs
    # near the copy bound, and hardly move Open MPI's, so they do not cancel within a pair:
    # on 2026-11-28 one CI round read braid 2.0-4.1 GB/s against Open MPI's steady 1.7, pair
    # median 1.31x, three rounds running, with no change to the code (the same build read
    # 2.42x minutes later). Noise only slows a bandwidth; a regression caps every run.
    local best_b best_m
    best_b=$(printf '%s\n' "${bs[@]}" | sort -g | tail -1); best_m=$(printf '%s\n' "${ms[@]}" | sort -g | tail -1)
    ratio=$(awk -v a="$best_b" -v m="$best_m" 'BEGIN { printf "%.2f", a / m }')
    echo "perf_guard: $name: judged on the best runs: braid $best_b over Open MPI $best_m, ratio $ratio"
  fi
}

# quiet: waits (up to 120 s) until the machine's CPUs have been at least 90% idle over a
# second, so that a round measures braid and not what the suite before it left running
# (processes winding down, kernel threads reclaiming and writing back). Right after the
# Release suite in CI, with the load average at 4.8, braid's 64 MiB busbw was 1.8 GB/s in 12
# runs of 14 and 4.5 GB/s in the last two, minutes later, and 4.6 GB/s in every run of a
# rerun on the same build. (How braid degrades under load is issue 32's separate measure.)
quiet() {
  local waited=0 a b idle total
  while [ "$waited" -lt 120 ]; do
    a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
    idle=$(( (b[4] + b[5]) - (a[4] + a[5]) ))
    total=0
    for i in 1 2 3 4 5 6 7 8; do total=$(( total + b[i] - a[i] )); done
    waited=$((waited + 1))
    if [ "$total" -gt 0 ] && [ $(( idle * 100 / total )) -ge 90 ]; then
      [ "$waited" -gt 1 ] && echo "perf_guard: waited ${waited} s for the machine to be idle"
      return
    fi
  done
  echo "perf_guard: the machine was still busy after 120 s (load $(cut -d' ' -f1-3 /proc/loadavg)); measuring anyway"
}

# check NAME COLUMN OP LIMIT ARGS...: a round, and a second one when the first is beyond
# LIMIT (OP gt: ratio must not exceed it; lt: must not fall below it).
# The machine's copy bandwidth now (one core, 64 MiB memcpy: docs/performance.md's bound
# is 0.44x it for braid's design), printed before each round.
copy_bandwidth() {
  local bw
  [ -x "$b/bench/bench_reduce" ] || return 0
  bw=$(timeout 60 "$b/bench/bench_reduce" --benchmark_filter='memcpy/67108864$' --benchmark_min_time=0.3 2>/dev/null |
         grep -o 'out_B/s=[0-9.]*[GM]' | head -1)
  [ -n "$bw" ] && echo "perf_guard: memcpy of 64 MiB on one core: ${bw#out_B/s=}B/s (written)"
  return 0
}

status=0
check() {
  local name=$1 col=$2 op=$3 limit=$4 try
  shift 4
  for try in 1 2 3; do
    [ "$try" -eq 3 ] && sleep 60
    quiet
    copy_bandwidth
    round "$name" "$col" "$@"
    if awk -v r="$ratio" -v l="$limit" -v op="$op" 'BEGIN { exit !(op == "gt" ? r <= l : r >= l) }'; then
      echo "perf_guard: ok: $name ratio $ratio (limit: $([ "$op" = gt ] && echo at most || echo at least) $limit)"
      return
    fi
    [ "$try" -lt 3 ] && echo "perf_guard: $name ratio $ratio is beyond $limit; measuring again"
  done
  echo "perf_guard: FAILED: $name: braid/Open MPI = $ratio in three rounds (limit $limit): a performance regression (docs/performance.md has the figures it had)"
  status=1
}

# After a build and a test suite the kernel is still writing their files back, which
# took cores and memory bandwidth from the first runs in CI (braid's 64 MiB busbw varied
# 2.1-4.4 GB/s right after the Release suite): flush first.
timeout 120 sync || true
echo "perf_guard: braid against Open MPI, 2 ranks, $runs interleaved pairs of runs per round, load $(cut -d' ' -f1-3 /proc/loadavg)"
# One pair unmeasured: the first launches after a build or a test suite pay for cold caches.
braid_run -b 4K -e 4K -c 0 -z 1 -n 200 -w 20 >/dev/null; mpi_run -b 4K -e 4K -c 0 -z 1 -n 200 -w 20 >/dev/null
check "4 KiB all-reduce time (us, -z 1)" 1 gt 3 -b 4K -e 4K -c 0 -z 1 -n 2000 -w 200
check "64 MiB all-reduce busbw (GB/s)" 2 lt 1.5 -b 64M -e 64M -c 0 -n 5 -w 2
exit $status
