#!/usr/bin/env bash
# scripts/compare.sh [-n RANKS] [-r REPS] [--coll C] [--out DIR] [--inplace] [--] [bench args...]
#
# braid's allreduce_bench (under build/tools/braidrun) against MPI_Allreduce
# (mpi_allreduce_bench under Open MPI's mpirun, shared-memory path) on the same number
# of ranks on this machine: a shorthand for
#   bench/compare/run.sh --local -n RANKS -r REPS --systems braid,mpi --out-of-place -- ARGS
# (the harness also runs Gloo, and emulated hosts: see bench/compare/run.sh --help).
# Writes every run's CSV and log, medians, ratios and a plot into DIR.
#
#   scripts/compare.sh -n 2                       # 4K..64M, f32 sum, 3 repetitions
#   scripts/compare.sh -n 4 -r 5 -- -b 1M -e 1M -n 50 -d int32 -o max
#   scripts/compare.sh -n 4 --coll allgather       # any collective: collective_bench vs MPI
#
# Put `--` before bench args when they include -n (iterations), which would otherwise
# mean RANKS. Environment: BUILD_DIR, TIMEOUT as for the harness.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "compare: $*" >&2; exit 1; }
ranks=2 reps=3 out="" mode=--out-of-place coll=allreduce
while [ $# -gt 0 ]; do
  case $1 in
    -n|--ranks) [ $# -ge 2 ] || die "$1 needs a value"; ranks=$2; shift 2 ;;
    -r|--reps) [ $# -ge 2 ] || die "$1 needs a value"; reps=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "$1 needs a value"; out=$2; shift 2 ;;
    --coll) [ $# -ge 2 ] || die "$1 needs a value"; coll=$2; shift 2 ;;
    --inplace) mode=--inplace; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
exec "$root/bench/compare/run.sh" --local -n "$ranks" -r "$reps" --systems braid,mpi --coll "$coll" "$mode" ${out:+--out "$out"} -- "$@"
