#!/usr/bin/env bash
# End-to-end runs of allreduce_bench as users run it: under braidrun, and with
# torchrun-style variables set by hand. Exits non-zero on any wrong result.
#   tests/bench_smoke.sh BUILD_DIR
set -euo pipefail
b=$1
run=$b/tools/braidrun
bench=$b/bench/allreduce_bench
# Every type and op on an odd world size, tiny to multi-slice sizes (count 0 included).
for d in float half bfloat16 double int8 uint8 int32 int64; do
  for o in sum prod min max avg; do
    "$run" -n 3 --timeout 120 -- "$bench" -b 2 -e 300K -f 13 -n 1 -w 0 -c 1 -d "$d" -o "$o" >/tmp/braid-smoke-$$.txt ||
      { cat /tmp/braid-smoke-$$.txt; echo "FAILED: -d $d -o $o"; exit 1; }
  done
done
grep -q "Out of bounds values : 0 OK" /tmp/braid-smoke-$$.txt
# CSV output names the columns.
csv=/tmp/braid-smoke-$$.csv
"$run" -n 2 -- "$bench" -b 1K -e 4K -n 2 -w 0 --csv "$csv" >/dev/null
head -1 "$csv" | grep -q "^size,count,type,redop,time_us,algbw_GBps,busbw_GBps,wrong,"
[ "$(wc -l <"$csv")" -eq 4 ]
# Auto mode goes without a transport whose library is absent (UCX not installed); forcing
# it fails with the loader's reason.
BRAID_UCX_LIBRARY=/nonexistent/libucp.so.0 "$run" -n 2 --timeout 120 -- "$bench" -b 4K -e 64K -n 2 -w 0 -c 1 \
  >/tmp/braid-smoke-$$.txt 2>&1 || { cat /tmp/braid-smoke-$$.txt; echo "FAILED: auto mode without UCX"; exit 1; }
grep -q "Out of bounds values : 0 OK" /tmp/braid-smoke-$$.txt
if "$b/tools/braid_info" | grep -qE "^ +ucx +yes"; then
  if BRAID_TRANSPORT=ucx BRAID_UCX_LIBRARY=/nonexistent/libucp.so.0 "$run" -n 2 --timeout 120 -- "$bench" -b 4K -e 4K \
    -n 1 -w 0 >/tmp/braid-smoke-$$.txt 2>&1; then
    echo "FAILED: BRAID_TRANSPORT=ucx ran without UCX"; exit 1
  fi
  grep -q "cannot load /nonexistent/libucp.so.0" /tmp/braid-smoke-$$.txt ||
    { cat /tmp/braid-smoke-$$.txt; echo "FAILED: no loader reason"; exit 1; }
fi
# The ibverbs transport, forced, over the test provider (built with the verbs headers).
if [ -f "$b/tests/libfakeverbs.so" ]; then
  BRAID_TRANSPORT=ibverbs BRAID_IBVERBS_LIBRARY="$b/tests/libfakeverbs.so" "$run" -n 3 --timeout 120 -- "$bench" \
    -b 1 -e 4M -f 16 -n 2 -w 1 -c 1 >/tmp/braid-smoke-$$.txt 2>&1 ||
    { cat /tmp/braid-smoke-$$.txt; echo "FAILED: allreduce_bench over ibverbs (fakeverbs)"; exit 1; }
  grep -q "Out of bounds values : 0 OK" /tmp/braid-smoke-$$.txt
fi
# torchrun-style environment, no braidrun: two processes, rank 0 serves the store.
port=$((20000 + RANDOM % 20000))
pids=()
for r in 0 1; do
  env -u BRAID_RANK RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$bench" -b 1K -e 64K -f 8 -n 2 -w 0 -c 1 >/tmp/braid-smoke-t$r-$$.txt 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { cat /tmp/braid-smoke-t*-$$.txt; echo "FAILED: torchrun-style env"; exit 1; }; done
grep -q "Out of bounds values : 0 OK" /tmp/braid-smoke-t0-$$.txt
# Bad arguments are refused before anything runs.
if "$run" -n 1 -- "$bench" -d float17 >/dev/null 2>&1; then echo "FAILED: bad -d accepted"; exit 1; fi
if "$run" -n 2 -- "$bench" --algo bogus -b 1K -e 1K >/dev/null 2>&1; then echo "FAILED: --algo bogus accepted"; exit 1; fi
# Every algorithm, forced, gives correct results (4 ranks on 2 emulated hosts).
for a in auto ring tree rhd hier; do
  "$run" -n 4 --hosts 2 --timeout 120 -- "$bench" -b 4 -e 1M -f 32 -n 1 -w 0 -c 1 --algo "$a" >/tmp/braid-smoke-$$.txt ||
    { cat /tmp/braid-smoke-$$.txt; echo "FAILED: --algo $a"; exit 1; }
done
# Compression inside the all-reduce: every codec runs and reports a finite, small error.
for c in fp16 bf16 int8 int4 fp8e4m3 sign1 topk:0.1 auto; do
  "$run" -n 3 --timeout 120 -- "$bench" -b 1K -e 256K -f 16 -n 2 -w 1 -c 1 --codec "$c" >/tmp/braid-smoke-$$.txt ||
    { cat /tmp/braid-smoke-$$.txt; echo "FAILED: --codec $c"; exit 1; }
  grep -q "Out of bounds values : 0 OK" /tmp/braid-smoke-$$.txt
done
awk '$1 == 262144 { e = $8 + 0; if (e <= 0 || e > 0.02) exit 1 }' <(
  "$run" -n 2 -- "$bench" -b 256K -e 256K -n 1 -w 0 --codec int8) || { echo "FAILED: int8 error out of range"; exit 1; }
if "$run" -n 2 -- "$bench" -b 1K -e 1K --codec int9 >/dev/null 2>&1; then echo "FAILED: --codec int9 accepted"; exit 1; fi
# An idle 4-rank job must not burn a core (the engine sleeps in epoll).
line=$("$run" -n 4 -- "$bench" --idle-seconds 2)
echo "$line"
pct=$(echo "$line" | sed -E 's/.*= ([0-9.]+)% .*/\1/')
awk -v p="$pct" 'BEGIN { exit !(p < 10.0) }' || { echo "FAILED: idle job used $pct% of a core"; exit 1; }
# nccl-tests for every collective (collective_bench): each collective with a reduction
# type/op mix and a non-zero root, odd world size, tiny to multi-slice sizes; then the
# nccl-tests binary names, which select the collective, and a bad -r.
cb=$b/bench/collective_bench
for c in allreduce allgather reduce_scatter broadcast reduce alltoall sendrecv; do
  for d in float half int64; do
    o=sum; [ "$d" = half ] && o=avg; [ "$d" = int64 ] && o=max
    "$run" -n 3 --timeout 120 -- "$cb" --coll "$c" -b 2 -e 300K -f 13 -n 2 -w 1 -c 1 -d "$d" -o "$o" -r 2 \
      >/tmp/braid-smoke-$$.txt || { cat /tmp/braid-smoke-$$.txt; echo "FAILED: --coll $c -d $d -o $o"; exit 1; }
    grep -q "Out of bounds values : 0 OK" /tmp/braid-smoke-$$.txt
  done
done
# gather and scatter (root 2), allgatherv and alltoallv (skewed blocks), in and out of place, checked, one type: CI's time
for c in gather scatter allgatherv alltoallv; do
  "$run" -n 3 --timeout 120 -- "$cb" --coll "$c" -b 2 -e 300K -f 13 -n 2 -w 1 -c 1 -d int64 -r 2 \
    >/tmp/braid-smoke-$$.txt || { cat /tmp/braid-smoke-$$.txt; echo "FAILED: --coll $c"; exit 1; }
  grep -q "Out of bounds values : 0 OK" /tmp/braid-smoke-$$.txt
done
for perf in all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf gather_perf \
  scatter_perf sendrecv_perf; do
  "$run" -n 2 --timeout 60 -- "$b/bench/$perf" -b 1K -e 8K -f 8 -n 1 -w 0 >/tmp/braid-smoke-$$.txt ||
    { cat /tmp/braid-smoke-$$.txt; echo "FAILED: $perf"; exit 1; }
  want=${perf%_perf}; want=${want/all_reduce/allreduce}; want=${want/all_gather/allgather}
  grep -q "collective_bench: $want," /tmp/braid-smoke-$$.txt || { cat /tmp/braid-smoke-$$.txt; echo "FAILED: $perf ran another collective"; exit 1; }
done
if "$run" -n 2 -- "$cb" --coll broadcast -r 5 -b 1K -e 1K >/dev/null 2>&1; then echo "FAILED: -r 5 of 2 ranks accepted"; exit 1; fi
if "$run" -n 1 -- "$cb" --coll gatherv >/dev/null 2>&1; then echo "FAILED: --coll gatherv accepted"; exit 1; fi
# Device buffers (--device) on the emulated device runtime, checked: three ranks on the
# emulated runtime's two devices (local rank modulo two), every size through the stream.
BRAID_GPU_BACKEND=emulated "$run" -n 3 --timeout 120 -- "$bench" --device -c 1 -b 2 -e 300K -f 13 -n 2 -w 1 \
  >/tmp/braid-smoke-$$.txt || { cat /tmp/braid-smoke-$$.txt; echo "FAILED: --device (emulated)"; exit 1; }
grep -q "^# device runtime: emulated" /tmp/braid-smoke-$$.txt
# The device work per call (the last four columns: hostfn api sync launch) is printed and
# within the device path's budgets: no host function, no progress-thread runtime call, no
# host synchronisation inside a call (docs/gpu.md, "Budgets").
grep -q "hostfn    api   sync launch" /tmp/braid-smoke-$$.txt
awk '/^ +[0-9]/ { rows++; if ($(NF-3) != "0.0" || $(NF-2) != "0.0" || $(NF-1) != "0.0") bad++ }
     END { exit !(rows > 0 && bad == 0) }' /tmp/braid-smoke-$$.txt ||
  { cat /tmp/braid-smoke-$$.txt; echo "FAILED: --device budgets (hostfn, api, sync per call must be 0)"; exit 1; }
grep -q "Out of bounds values : 0 OK" /tmp/braid-smoke-$$.txt
BRAID_GPU_BACKEND=emulated "$run" -n 3 --timeout 120 -- "$cb" --device --coll reduce_scatter -c 1 -b 2 -e 300K -f 13 \
  -n 2 -w 1 -d bfloat16 >/tmp/braid-smoke-$$.txt || { cat /tmp/braid-smoke-$$.txt; echo "FAILED: collective_bench --device"; exit 1; }
grep -q "Out of bounds values : 0 OK" /tmp/braid-smoke-$$.txt
# The device runtime microbenchmarks (built where Google Benchmark is) run on the emulated
# runtime and print every row; without a device runtime they say so and exit 0.
if [ -x "$b/bench/bench_gpu_runtime" ]; then
  BRAID_GPU_BACKEND=emulated "$b/bench/bench_gpu_runtime" --benchmark_min_time=0.01s >/tmp/braid-smoke-$$.txt 2>&1 ||
    { cat /tmp/braid-smoke-$$.txt; echo "FAILED: bench_gpu_runtime (emulated)"; exit 1; }
  for row in HostFnRoundTrip WaitRelease CopyAsyncCall WriteValueCall EventRecordCall LaunchCall; do
    grep -q "^$row" /tmp/braid-smoke-$$.txt || { cat /tmp/braid-smoke-$$.txt; echo "FAILED: bench_gpu_runtime: no $row row"; exit 1; }
  done
  BRAID_GPU_BACKEND=none "$b/bench/bench_gpu_runtime" >/tmp/braid-smoke-$$.txt 2>&1 &&
    grep -q "skipped: no device runtime" /tmp/braid-smoke-$$.txt ||
    { cat /tmp/braid-smoke-$$.txt; echo "FAILED: bench_gpu_runtime without a device runtime"; exit 1; }
fi
# Without a device runtime --device says so and exits 0; so does --backend nccl, which
# also needs CUDA device memory (emulated: braid's rows run, NCCL says why it cannot).
BRAID_GPU_BACKEND=none "$run" -n 2 -- "$bench" --device -b 1K -e 1K >/tmp/braid-smoke-$$.txt ||
  { cat /tmp/braid-smoke-$$.txt; echo "FAILED: --device without a device runtime"; exit 1; }
grep -q "skipped: no device runtime" /tmp/braid-smoke-$$.txt
BRAID_GPU_BACKEND=none "$run" -n 2 -- "$bench" --backend nccl -b 1K -e 1K >/tmp/braid-smoke-$$.txt ||
  { cat /tmp/braid-smoke-$$.txt; echo "FAILED: --backend nccl without a GPU"; exit 1; }
grep -q "nccl not run either: NCCL needs CUDA device memory" /tmp/braid-smoke-$$.txt
BRAID_GPU_BACKEND=emulated "$run" -n 2 -- "$bench" --backend nccl -b 1K -e 4K -n 1 -w 0 >/tmp/braid-smoke-$$.txt ||
  { cat /tmp/braid-smoke-$$.txt; echo "FAILED: --backend nccl on the emulated runtime"; exit 1; }
grep -q "Out of bounds values : 0 OK" /tmp/braid-smoke-$$.txt
grep -q "^# nccl: not run: NCCL needs CUDA device memory" /tmp/braid-smoke-$$.txt
if "$run" -n 1 -- "$bench" --backend gloo >/dev/null 2>&1; then echo "FAILED: --backend gloo accepted"; exit 1; fi
# The example program from the README.
"$run" -n 3 -- "$b/examples/allreduce_example"
rm -f /tmp/braid-smoke-*$$*
echo "bench smoke ok"
