#!/usr/bin/env bash
# The device path's work per all-reduce call, per algorithm and codec (docs/gpu.md, "Budgets"):
# allreduce_bench --device on 2 and 4 ranks of this host, its hostfn/api/sync/launch columns
# (per call, the most of any rank) as one markdown table.
#
#   scripts/device_budgets.sh [BUILD_DIR]      (default build/)
#
# The device runtime is BRAID_GPU_BACKEND's (emulated unless set: the counts are the
# runtime calls braid makes, the same on CUDA; the times are not and are not printed).
# About 1 minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench=$build/bench/allreduce_bench
run=$build/tools/braidrun
[[ -x $bench && -x $run ]] || { echo "device_budgets.sh: build $bench and $run first (scripts/build.sh $build)" >&2; exit 2; }
export BRAID_GPU_BACKEND=${BRAID_GPU_BACKEND:-emulated}

echo "| ranks | algorithm | codec | bytes | hostfn | api | sync | launch |"
echo "|---:|---|---|---:|---:|---:|---:|---:|"
for n in 2 4; do
  # Compressed all-reduce has its own algorithm (two-phase, sparse all-gather for topk).
  for entry in ring:none tree:none rhd:none hier:none auto:fp16 auto:int8 auto:sign1 auto:topk:0.01; do
    algo=${entry%%:*} codec=${entry#*:}
    {
      if ! out=$("$run" -n "$n" "$bench" --device --quiet --algo "$algo" --codec "$codec" -b 64K -e 8M -f 128 -n 4 \
                 -w 4 2>&1); then
        echo "device_budgets.sh: $n ranks, $algo, $codec failed:" >&2
        echo "$out" >&2
        exit 1
      fi
      # Rows: size count type op (4 out-of-place) (4 in-place) hostfn api sync launch.
      awk -v n="$n" -v a="$algo" -v c="$codec" '/^ +[0-9]/ && NF >= 16 {
        printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", n, a, c, $1, $(NF-3), $(NF-2), $(NF-1), $NF }' <<<"$out"
    }
  done
done
