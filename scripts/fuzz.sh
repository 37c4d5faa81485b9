#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] [TARGET...]: builds the libFuzzer targets (tests/fuzz, clang,
# ASan + UBSan) into build-fuzz/ and runs each for SECONDS (default 20), seeded with
# tests/fuzz/corpus/<name>/; what a run finds is kept in build-fuzz/corpus/<name>/.
# Without TARGET, every target runs. Fails on any crash, leak, timeout or oversized
# allocation (the input is kept in build-fuzz/artifacts/); prints a table of executions,
# seconds and corpus sizes (docs/reliability.md, "Fuzzing"). BRAID_FUZZ_JOBS targets run
# at once (default: the number of cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${1:-20}
shift || true
jobs=${BRAID_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
out=build-fuzz

cxx=${BRAID_FUZZ_CXX:-clang++}
command -v "$cxx" >/dev/null || { echo "fuzz.sh: $cxx not found (scripts/setup.sh installs clang)" >&2; exit 1; }
echo "== libFuzzer targets (clang, ASan + UBSan) into $out/ =="
scripts/build.sh "$out" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBRAID_FUZZ=ON \
  -DBRAID_WITH_CUDA=OFF -DBRAID_BUILD_PYTHON=OFF -DBRAID_BUILD_TESTS=OFF -DBRAID_BUILD_BENCH=OFF \
  -DBRAID_BUILD_TOOLS=OFF -DBRAID_BUILD_EXAMPLES=OFF -DBRAID_SHARED=OFF -DBRAID_INSTALL=OFF

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.cpp; do t=$(basename "$f" .cpp); targets+=("${t#fuzz_}"); done
fi
mkdir -p "$out/artifacts" "$out/logs"

# One target: its log holds libFuzzer's final statistics. -malloc_limit_mb: no single
# allocation may exceed 512 MiB (a store value is at most 64 MiB), so one sized by an
# unchecked field fails the run; -timeout: one input may not take 10 s.
run_one() {
  local name=$1 bin=$out/tests/fuzz/fuzz_$1
  local seeds=tests/fuzz/corpus/$1 work=$out/corpus/$1
  mkdir -p "$work" "$seeds"
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2560 -malloc_limit_mb=512 -print_final_stats=1 \
      -artifact_prefix="$out/artifacts/$1-" "$work" "$seeds" >"$out/logs/$1.log" 2>&1
}

pids=() names=() failed=()
start=$SECONDS
for name in "${targets[@]}"; do
  [ -x "$out/tests/fuzz/fuzz_$name" ] || { echo "fuzz.sh: no target fuzz_$name" >&2; exit 1; }
  run_one "$name" &
  pids+=($!) names+=("$name")
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || failed+=("${names[0]}")
    pids=("${pids[@]:1}") names=("${names[@]:1}")
  fi
done
for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed+=("${names[$i]}"); done

printf '%-16s %12s %8s %8s %8s\n' target executions seconds crashes corpus
total=0
for name in "${targets[@]}"; do
  log=$out/logs/$name.log
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  secs=$(sed -n 's/^stat::total_run_time: *//p' "$log" 2>/dev/null | tail -1)
  [ -n "$secs" ] || secs=$seconds
  crashes=0
  for f in "${failed[@]:-}"; do [ "$f" = "$name" ] && crashes=1; done
  corpus=$(find "$out/corpus/$name" -type f | wc -l)
  printf '%-16s %12s %8s %8s %8s\n' "$name" "${execs:-?}" "$secs" "$crashes" "$corpus"
  total=$((total + ${execs:-0}))
done
echo "total executions: $total in $((SECONDS - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
  for name in "${failed[@]}"; do
    echo "== fuzz_$name FAILED; its log ($out/logs/$name.log) ends:" >&2
    tail -40 "$out/logs/$name.log" >&2
  done
  echo "fuzz.sh: ${#failed[@]} target(s) failed; reproduce with $out/tests/fuzz/fuzz_NAME $out/artifacts/NAME-..." >&2
  exit 1
fi
echo "== fuzzing: no crash, leak or timeout =="
