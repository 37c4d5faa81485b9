#!/usr/bin/env bash
# scripts/compare.sh [-n RANKS] [-r REPS] [--out DIR] [--inplace] [--] [bench args...]
#
# braid's allreduce_bench (under build/tools/braidrun) against MPI_Allreduce
# (mpi_allreduce_bench under Open MPI's mpirun, shared-memory path) on the same number
# of ranks on this machine, back to back, alternating which goes first, REPS times.
# Writes every run's CSV and log into DIR and prints the per-size medians side by side:
# busbw of each, their ratio (braid / MPI: >1 means braid is faster), time of each and
# the latency ratio (braid / MPI: <1 means braid is faster).
#
#   scripts/compare.sh -n 2                       # 4K..64M, f32 sum, 3 repetitions
#   scripts/compare.sh -n 4 -r 5 -- -b 1M -e 1M -n 50 -d int32 -o max
#
# Bench args are passed to both benches as they are (allreduce_bench's flags); sizes,
# type and op default to -b 4K -e 64M -f 2 -d float -o sum where not given. Put `--`
# before them when they include -n (iterations), which would otherwise mean RANKS.
# Environment: BUILD_DIR (default build), MPIRUN (default mpirun), MPIRUN_ARGS (extra
# mpirun options), TIMEOUT (seconds per run, default 900).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "compare: $*" >&2; exit 1; }

ranks=2 reps=3 out="" inplace=0
while [ $# -gt 0 ]; do
  case $1 in
    -n|--ranks) [ $# -ge 2 ] || die "$1 needs a value"; ranks=$2; shift 2 ;;
    -r|--reps) [ $# -ge 2 ] || die "$1 needs a value"; reps=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "$1 needs a value"; out=$2; shift 2 ;;
    --inplace) inplace=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[[ $ranks =~ ^[1-9][0-9]*$ ]] || die "-n RANKS must be a positive integer, got '$ranks'"
[[ $reps =~ ^[1-9][0-9]*$ ]] || die "-r REPS must be a positive integer, got '$reps'"

# Defaults for the flags the caller did not give (the benches reject a flag given twice).
user=("$@")
has() {  # has SHORT LONG: the caller gave -x, -xVALUE, --long or --long=VALUE
  local a
  for a in "${user[@]+"${user[@]}"}"; do
    case $a in "$1"|"$1"?*|"$2"|"$2"=*) return 0 ;; esac
  done
  return 1
}
bench_args=()
has -b --minbytes || bench_args+=(-b 4K)
has -e --maxbytes || bench_args+=(-e 64M)
has -f --stepfactor || bench_args+=(-f 2)
has -d --datatype || bench_args+=(-d float)
has -o --op || bench_args+=(-o sum)
bench_args+=("${user[@]+"${user[@]}"}")

# Open MPI's mpirun, first: without it there is nothing to compare against.
mpirun=${MPIRUN:-mpirun}
command -v "$mpirun" >/dev/null 2>&1 ||
  die "'$mpirun' not found: install Open MPI (scripts/setup.sh installs openmpi-bin and libopenmpi-dev, as root), or set MPIRUN"
"$mpirun" --version 2>/dev/null | grep -q "Open MPI" ||
  die "'$mpirun' is not Open MPI's mpirun (the options used here are Open MPI's); set MPIRUN to Open MPI's"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# Build (incremental; a no-op when up to date). Release when configuring afresh.
build=${BUILD_DIR:-build}
braidrun=$build/tools/braidrun braid_bench=$build/bench/allreduce_bench mpi_bench=$build/bench/mpi_allreduce_bench
jobs=$(nproc 2>/dev/null || echo 2)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
else
  cmake -S "$root" -B "$build" >/dev/null  # picks up MPI installed since the last configure
fi
if ! blog=$(cmake --build "$build" -j "$jobs" --target allreduce_bench braidrun mpi_allreduce_bench 2>&1); then
  if [ -x "$braidrun" ] && [ -x "$braid_bench" ] && [ -x "$mpi_bench" ]; then
    echo "compare: warning: the build failed; measuring the binaries already in $build" >&2
    echo "$blog" | tail -n 5 >&2
  else
    echo "$blog" | tail -n 30 >&2
    die "build failed (see above)"
  fi
fi
[ -x "$mpi_bench" ] || die "$mpi_bench was not built: CMake did not find MPI (install libopenmpi-dev, then rerun)"
grep -q "CMAKE_BUILD_TYPE:STRING=Release" "$build/CMakeCache.txt" ||
  echo "compare: warning: $build is not a Release build; numbers will be low" >&2

cores=$(nproc 2>/dev/null || echo 1)
# shellcheck disable=SC2054  # the commas belong to the --mca value
mpi_opts=(-np "$ranks" --bind-to none --mca pml ob1 --mca btl self,vader --mca mpi_yield_when_idle 1)
[ "$ranks" -le "$cores" ] || mpi_opts+=(--oversubscribe)
# shellcheck disable=SC2206
mpi_opts+=(${MPIRUN_ARGS:-})
timeout_s=${TIMEOUT:-900}

out=${out:-$build/compare/$(date +%Y%m%d-%H%M%S)-n$ranks}
mkdir -p "$out"
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD 2>/dev/null || commit="$commit+dirty"
{
  echo "date: $(date -Is)"
  echo "commit: $commit"
  echo "host: $(hostname), $cores cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "ranks: $ranks, repetitions: $reps"
  echo "bench args: ${bench_args[*]}"
  echo "braid: $braidrun -n $ranks --timeout $timeout_s -- $braid_bench ${bench_args[*]} --csv FILE"
  echo "mpi: $mpirun ${mpi_opts[*]} $mpi_bench ${bench_args[*]} --csv FILE"
} >"$out/info.txt"

run_one() {  # run_one braid|mpi REP
  local who=$1 rep=$2 csv="$out/$1-$2.csv" log="$out/$1-$2.log" rc=0
  if [ "$who" = braid ]; then
    "$braidrun" -n "$ranks" --timeout "$timeout_s" -- "$braid_bench" "${bench_args[@]}" --csv "$csv" >"$log" 2>&1 || rc=$?
  else
    timeout -k 10 "$timeout_s" "$mpirun" "${mpi_opts[@]}" "$mpi_bench" "${bench_args[@]}" --csv "$csv" >"$log" 2>&1 || rc=$?
  fi
  if [ "$rc" -ne 0 ] || [ ! -s "$csv" ]; then
    tail -n 20 "$log" >&2
    die "$who run $rep failed (exit $rc; log $log)"
  fi
}

echo "compare: $ranks ranks, $reps repetitions, args: ${bench_args[*]} (results in $out)"
for rep in $(seq 1 "$reps"); do
  if [ $((rep % 2)) -eq 1 ]; then order=(braid mpi); else order=(mpi braid); fi
  for who in "${order[@]}"; do
    printf 'compare: rep %d/%d %-5s ... ' "$rep" "$reps" "$who"
    s=$SECONDS
    run_one "$who" "$rep"
    echo "$((SECONDS - s)) s"
  done
done

# Medians per size over the repetitions, side by side.
tcol=5 bcol=7 mode=out-of-place
if [ "$inplace" -eq 1 ]; then tcol=9 bcol=11 mode=in-place; fi
{
  echo "# $(date -Is), commit $commit, $(cut -d' ' -f1 /proc/loadavg) load: $ranks ranks, $mode, medians of $reps runs"
  awk -F, -v tcol="$tcol" -v bcol="$bcol" -v reps="$reps" '
    function median(key, who,   n, i, j, v, a) {
      n = cnt[who, key]
      for (i = 1; i <= n; i++) a[i] = val[who, key, i]
      for (i = 2; i <= n; i++) { v = a[i]; for (j = i - 1; j >= 1 && a[j] > v; j--) a[j + 1] = a[j]; a[j + 1] = v }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    FNR == 1 { who = FILENAME; sub(/.*\//, "", who); sub(/-[0-9]+\.csv$/, "", who); next }
    {
      key = $1
      if (!(key in seen)) { seen[key] = 1; order[++nk] = key; type[key] = $3; op[key] = $4 }
      i = ++cnt[who "_t", key]; val[who "_t", key, i] = $tcol
      i = ++cnt[who "_b", key]; val[who "_b", key, i] = $bcol
    }
    END {
      printf "%12s %8s %6s %12s %12s %8s %12s %12s %8s\n", "size(B)", "type", "redop", "braid_busbw", "mpi_busbw", \
             "bw_ratio", "braid_us", "mpi_us", "lat_ratio"
      for (k = 1; k <= nk; k++) {
        key = order[k]
        bb = median(key, "braid_b"); mb = median(key, "mpi_b"); bt = median(key, "braid_t"); mt = median(key, "mpi_t")
        printf "%12s %8s %6s %12.3f %12.3f %8.2f %12.1f %12.1f %8.2f\n", key, type[key], op[key], bb, mb, \
               (mb > 0 ? bb / mb : 0), bt, mt, (mt > 0 ? bt / mt : 0)
      }
    }' "$out"/braid-*.csv "$out"/mpi-*.csv
} | tee "$out/summary.txt"
echo "# busbw in GB/s; bw_ratio = braid/MPI busbw (>1: braid faster); lat_ratio = braid/MPI time (<1: braid faster)"
