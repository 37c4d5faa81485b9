#!/usr/bin/env bash
# scripts/gpu_check.sh [options] OUTDIR: braid's checks that need an NVIDIA GPU, in one
# command, on a bare machine with one (cmake, nvcc and gcc; no network needed), within an
# 8-minute budget on 16 cores. Every step runs (no stop at the first failure), each under
# its own timeout, writing its log into OUTDIR; OUTDIR/summary.txt lists each step's
# status, exit code and seconds. Exits 1 if any step failed, else 0.
#
#   build      CUDA on, Release, no Python/examples; only the targets the steps need.
#              GoogleTest: the system's, else built from /usr/src/googletest (or
#              --deps DIR/googletest); absent: the tests are not built (said so), the
#              benches still run.
#   ctest_gpu              BRAID_TEST_REQUIRE_GPU=1 ctest -L gpu (kernels vs host, the
#                          sm_80/sm_90 arch check, the host-side recipes)
#   arch_check             tests/check_cuda_arch.sh on libbraid.so (also without GTest)
#   device_collectives     tests/multirank test_device_collectives, BRAID_GPU_BACKEND=cuda:
#                          several ranks on the one GPU as threads, and process ranks
#   device_hazards         tests/multirank test_device_hazards on CUDA: every collective with
#                          CUDA_DEVICE_MAX_CONNECTIONS=1 and 8 and a cudaFree loop, process
#                          ranks; budgets (no host function, no sync in a call); killed rank
#   gpu_runtime            tests/unit test_gpu_runtime: the dma-buf export of a cudaMalloc
#                          allocation, the GPUDirect RDMA flush (or the driver's reason), and
#                          legacy CUDA IPC of an allocation into a child process
#   device_exec            tests/unit test_device_exec, BRAID_GPU_BACKEND=cuda: the device
#                          path's codec steps (CUDA kernels, frame by frame) against the
#                          host's framed functions bit for bit, and a malformed topk payload
#   torch_cuda             where python3 has torch with CUDA and pybind11: the extension is
#                          built too, and tests/python/ranks_torch_cuda.py runs under braidrun
#                          -n 2 on CUDA tensors (collectives against gloo and braid on CPU
#                          tensors, stream semantics, DDP with the hooks, overlap and timings)
#   memcheck_kernels       compute-sanitizer memcheck (leak check) on test_cuda_kernels
#   memcheck_allreduce     braidrun -n 2 -- compute-sanitizer memcheck allreduce_bench --device
#   racecheck, synccheck   on test_cuda_kernels' encode/decode/reduce kernels
#   nccl_device            tests/nccl nccl_device_test on CUDA: NCCL's C API (libbraid_nccl)
#                          on device buffers, two communicators driven by one thread
#   nccl_tests_*           nccl-tests' all_reduce_perf built against libbraid_nccl, when
#                          NCCL_TESTS_SRC names its source
#   bench_<n>r_<transport> allreduce_bench --device --backend nccl at n = 1, 2, 4 ranks on the
#                          one GPU over shm and tcp (CSV per run; NCCL's rows beside braid's
#                          where NCCL accepts the layout: NCCL < 2.30 refuses several ranks
#                          on one GPU, which the log says)
#   bench_2r_tcp_codecs_direct  allreduce_bench --device --codec none,fp16,int8,sign1 at 2 ranks
#                          over tcp on the device path (codecs as kernels on the GPU)
#   device_budgets         scripts/device_budgets.sh on CUDA: host functions, progress-thread
#                          runtime calls, syncs and launches per call, per algorithm and codec
#   bench_gpu_runtime      bench/micro/bench_gpu_runtime on CUDA: host-function round trip,
#                          stream-wait release latency, CPU cost of copy/flag/event/launch (CSV)
#   bench_cuda_kernels     kernel bandwidth vs the device copy (CSV)
# The timed benches run first, alone, one after another; then the correctness steps, side
# by side (a hang there costs only its own timeout, not the figures).
#
# Without a GPU (here, CI) it runs what can run — the build, the arch check, ctest -L gpu
# (device tests skip), the device tests and a device bench on the emulated runtime
# (BRAID_GPU_BACKEND=emulated) — and reports the GPU steps as "skipped: no GPU".
#
# Options:
#   --build-dir DIR     build there (default build-gpu)
#   --no-build          use --build-dir as it is (tests of this script's plumbing)
#   --jobs N            build jobs (default: nproc)
#   --deps DIR          a folder made by --pack-deps on another machine: CLI11 (needed by
#                       the benches and braidrun), GoogleTest's source, Google Benchmark
#                       and OpenSSL's libcrypto and libssl (headers and libraries), for bare machines
#   --pack-deps DIR     make that folder from this machine's /usr/include/CLI,
#                       /usr/src/googletest and Google Benchmark, then exit
#   --nccl-library P    libnccl.so.2 to load (default: found on the loader path, in the CUDA
#                       toolkit, or in Python's nvidia-nccl wheel)
#   --budget S          the whole run's seconds (default 480)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bd=$root/build-gpu
build=1
jobs=$(nproc 2>/dev/null || echo 2)
deps=""
nccl_lib=""
budget=480
out=""
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) bd=$(realpath -m "$2"); shift 2 ;;
    --no-build) build=0; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --deps) deps=$(realpath -m "$2"); shift 2 ;;
    --nccl-library) nccl_lib=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --pack-deps)
      d=$(realpath -m "$2")
      mkdir -p "$d/cli11/include" || exit 1
      cp -r /usr/include/CLI "$d/cli11/include/" || { echo "no /usr/include/CLI (apt install libcli11-dev)" >&2; exit 1; }
      # A minimal package config, so that find_package(CLI11 CONFIG) finds the headers.
      cat >"$d/cli11/CLI11Config.cmake" <<'EOF'
if(NOT TARGET CLI11::CLI11)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  set_target_properties(CLI11::CLI11 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${CMAKE_CURRENT_LIST_DIR}/include")
endif()
set(CLI11_FOUND TRUE)
EOF
      if [ -d /usr/src/googletest ]; then cp -r /usr/src/googletest "$d/googletest"; else echo "no /usr/src/googletest: not packed"; fi
      # Google Benchmark (bench_cuda_kernels), as installed: headers, library, package config.
      lib=/usr/lib/x86_64-linux-gnu
      if [ -f $lib/cmake/benchmark/benchmarkConfig.cmake ] && [ -d /usr/include/benchmark ]; then
        mkdir -p "$d/benchmark/include" "$d/benchmark/lib/x86_64-linux-gnu/cmake"
        cp -r /usr/include/benchmark "$d/benchmark/include/"
        cp -a $lib/libbenchmark* "$d/benchmark/lib/x86_64-linux-gnu/"
        cp -r $lib/cmake/benchmark "$d/benchmark/lib/x86_64-linux-gnu/cmake/"
      else
        echo "no Google Benchmark (apt install libbenchmark-dev): not packed; bench_cuda_kernels will be skipped"
      fi
      # OpenSSL (libcrypto: base/auth, HMAC-SHA-256 of every handshake; libssl: base/tls), for a machine
      # without libssl-dev: headers (with the arch's configuration.h) and the library.
      if [ -d /usr/include/openssl ] && ls $lib/libcrypto.so* >/dev/null 2>&1; then
        mkdir -p "$d/openssl/include" "$d/openssl/lib"
        cp -r /usr/include/openssl "$d/openssl/include/"
        [ -d /usr/include/x86_64-linux-gnu/openssl ] && cp -r /usr/include/x86_64-linux-gnu/openssl/. "$d/openssl/include/openssl/"
        cp -a $lib/libcrypto.so* $lib/libssl.so* "$d/openssl/lib/"
      else
        echo "no OpenSSL headers (apt install libssl-dev): not packed; the build needs libssl-dev there"
      fi
      du -sh "$d"
      exit 0 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
[ -n "$out" ] || { echo "usage: scripts/gpu_check.sh [options] OUTDIR (--help)" >&2; exit 2; }
mkdir -p "$out/.results" || exit 2
out=$(cd "$out" && pwd)
rm -f "$out"/.results/*
t_start=$(date +%s)
deadline=$((t_start + budget))
order=()

# --- steps ------------------------------------------------------------------------------
linebuf=""
command -v stdbuf >/dev/null && linebuf="stdbuf -oL -eL"
# step NAME TIMEOUT CMD: runs CMD (a bash command line) with OUTDIR/NAME.log as its output,
# under min(TIMEOUT, what is left of the budget), and records the result.
record() {  # NAME STATUS RC SECONDS NOTE
  printf '%-26s %-9s %4s %6s  %s\n' "$1" "$2" "$3" "$4" "$5" >"$out/.results/$1"
}
step() {
  local name=$1 limit=$2 cmd=$3
  local left=$((deadline - $(date +%s) - 5))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    record "$name" "NOT-RUN" "-" "0" "the ${budget}s budget was spent before this step"
    return
  fi
  local t0 rc status
  t0=$(date +%s)
  { echo "# $cmd"; echo "# timeout ${limit}s, started $(date -u +%FT%TZ)"; } >"$out/$name.log"
  # Line-buffered (stdbuf's preload reaches the step's programs), so that a step killed
  # at its timeout still leaves what it printed, GoogleTest's [ RUN ] lines included.
  timeout -k 15 "$limit" $linebuf bash -c "$cmd" >>"$out/$name.log" 2>&1 </dev/null
  rc=$?
  status=ok
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then status=TIMEOUT; elif [ "$rc" != 0 ]; then status=FAILED; fi
  record "$name" "$status" "$rc" "$(($(date +%s) - t0))" "$name.log (timeout ${limit}s)"
}
skip() {  # NAME REASON
  order+=("$1")
  record "$1" "skipped" "-" "0" "$2"
}
fg_step() { order+=("$1"); step "$@"; }
# On a GPU machine a bench that found no device runtime exits 0 ("skipped"): a failure here.
require_device() {  # NAME
  local f=$out/.results/$1
  local name status rc sec
  read -r name status rc sec _ <"$f"
  if [ "$status" = ok ] && grep -qE 'skipped: no device runtime|skipped, no CUDA device' "$out/$1.log"; then
    record "$1" FAILED "$rc" "$sec" "$1.log: ran but found no usable GPU"
  fi
}
bg_step() { order+=("$1"); step "$@" & }

# --- the machine --------------------------------------------------------------------------
gpu=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
[ "${gpus:-0}" -gt 0 ] && gpu=1
export PATH=$PATH:/usr/local/cuda/bin
sanitizer=$(command -v compute-sanitizer || true)
if [ -z "$nccl_lib" ]; then
  nccl_lib=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
  [ -z "$nccl_lib" ] && [ -e /usr/local/cuda/lib64/libnccl.so.2 ] && nccl_lib=/usr/local/cuda/lib64/libnccl.so.2
  if [ -z "$nccl_lib" ] && command -v python3 >/dev/null; then
    nccl_lib=$(python3 - 2>/dev/null <<'EOF'
import glob, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    for p in sorted(glob.glob(d + "/nvidia/**/libnccl.so.2", recursive=True)):
        print(p); sys.exit(0)
EOF
)
  fi
  [ -z "$nccl_lib" ] && nccl_lib=libnccl.so.2
fi
{
  echo "# gpu_check $(date -u +%FT%TZ) on $(hostname), $(nproc) cores, budget ${budget}s"
  echo "# braid $(git -C "$root" describe --always --dirty 2>/dev/null)"
  nvidia-smi 2>&1 || echo "nvidia-smi: none (no GPU: the GPU steps are skipped)"
  nvcc --version 2>&1 | tail -2 || echo "no nvcc"
  cmake --version | head -1
  echo "compute-sanitizer: ${sanitizer:-none}"
  echo "NCCL library for --backend nccl: $nccl_lib"
} >"$out/env.log" 2>&1

# --- build --------------------------------------------------------------------------------
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DBRAID_WITH_CUDA=ON -DBRAID_BUILD_PYTHON=OFF -DBRAID_BUILD_EXAMPLES=OFF)
prefix_path=""
have_tests=1
if [ "$build" = 1 ]; then
  mkdir -p "$bd"
  # What find_package sees (GoogleTest, CLI11, Google Benchmark), from a throwaway project.
  probe=$bd/_deps/probe
  mkdir -p "$probe"
  [ -n "$deps" ] && [ -f "$deps/cli11/CLI11Config.cmake" ] && cmake_args+=(-DCLI11_DIR="$deps/cli11")
  # libcrypto: the system's (libssl-dev), else the packed one.
  if [ ! -f /usr/include/openssl/hmac.h ] && [ -n "$deps" ] && [ -d "$deps/openssl" ]; then
    cmake_args+=(-DOPENSSL_ROOT_DIR="$deps/openssl")
    export LD_LIBRARY_PATH="$deps/openssl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  if [ -n "$deps" ] && [ -d "$deps/benchmark" ]; then
    export CMAKE_PREFIX_PATH="$deps/benchmark${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    # Debian's libbenchmark is a shared library: the benches load it from there too.
    export LD_LIBRARY_PATH="$deps/benchmark/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  cat >"$probe/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(probe CXX)
find_package(GTest QUIET)
find_package(CLI11 CONFIG QUIET)
find_package(benchmark CONFIG QUIET)
find_package(Python 3.9 QUIET COMPONENTS Interpreter Development.Module)
if(Python_FOUND)
  find_package(pybind11 CONFIG QUIET)
endif()
set(found "")
foreach(p GTest CLI11 benchmark pybind11)
  if(${p}_FOUND)
    string(APPEND found " ${p}=yes")
  else()
    string(APPEND found " ${p}=no")
  endif()
endforeach()
message(STATUS "PROBE${found}")
EOF
  # The Python extension (the torch_cuda step), where python3 has pybind11 and torch sees a GPU.
  py_args=()
  pyb=$(python3 -m pybind11 --cmakedir 2>/dev/null) && py_args=(-Dpybind11_DIR="$pyb" -DPython_EXECUTABLE="$(command -v python3)")
  probe_out=$(cmake -S "$probe" -B "$probe/b" "${cmake_args[@]}" "${py_args[@]}" 2>&1 | grep PROBE)
  echo "$probe_out" >>"$out/env.log"
  gsrc=""
  if ! echo "$probe_out" | grep -q "GTest=yes"; then
    for g in "$deps/googletest" /usr/src/googletest; do [ -f "$g/CMakeLists.txt" ] && { gsrc=$g; break; }; done
    if [ -n "$gsrc" ]; then
      fg_step googletest 150 "cmake -S '$gsrc' -B '$bd/_deps/gtest-build' -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX='$bd/_deps/gtest' -DCMAKE_POSITION_INDEPENDENT_CODE=ON >/dev/null &&
        cmake --build '$bd/_deps/gtest-build' -j $jobs && cmake --install '$bd/_deps/gtest-build' >/dev/null"
      prefix_path=$bd/_deps/gtest
    else
      have_tests=0
      skip googletest "GoogleTest absent (no system package, no /usr/src/googletest, no --deps): tests not built; benches still run"
    fi
  fi
  echo "$probe_out" | grep -q "CLI11=yes" ||
    echo "NOTE: CLI11 not found: braidrun and the benches cannot build (give --deps DIR from --pack-deps)" >>"$out/env.log"
  [ -n "$prefix_path" ] && cmake_args+=(-DCMAKE_PREFIX_PATH="$prefix_path")
  [ "$have_tests" = 0 ] && cmake_args+=(-DBRAID_BUILD_TESTS=OFF)
  targets="braid braid_info braidrun allreduce_bench braid_nccl"
  [ "$have_tests" = 1 ] && targets="$targets test_cuda_kernels test_cuda_recipes test_device_collectives test_device_hazards test_gpu_runtime test_device_exec nccl_device_test"
  echo "$probe_out" | grep -q "benchmark=yes" && targets="$targets bench_cuda_kernels bench_gpu_runtime"
  if [ "$gpu" = 1 ] && echo "$probe_out" | grep -q "pybind11=yes" &&
     python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    cmake_args+=(-DBRAID_BUILD_PYTHON=ON "${py_args[@]}")
    targets="$targets _C"
  fi
  fg_step build 330 "cmake -S '$root' -B '$bd' ${cmake_args[*]} && cmake --build '$bd' -j $jobs --target $targets"
else
  skip build "--no-build: using $bd as it is"
  [ -f "$bd/CTestTestfile.cmake" ] && [ -d "$bd/tests" ] || have_tests=0
fi
"$bd/tools/braid_info" >>"$out/env.log" 2>&1 || echo "no braid_info in $bd" >>"$out/env.log"

# --- what the runs share -----------------------------------------------------------------
tk=$bd/tests/test_cuda_kernels
run=$bd/tools/braidrun
ab=$bd/bench/allreduce_bench
if [ "$gpu" = 1 ]; then
  backend=cuda
  require="BRAID_TEST_REQUIRE_GPU=1"
else
  backend=emulated
  require=""
fi

# The timed benches run first, alone on the GPU, so that their figures come back even where a
# correctness step below hangs until its timeout (as two did on the H200, 2026-11-29).
# --- timings, one at a time -----------------------------------------------------------------
if [ "$gpu" = 1 ]; then
  for n in 1 2 4; do
    for tr in shm tcp; do
      [ "$n" = 1 ] && [ "$tr" = tcp ] && continue  # one rank moves nothing between ranks
      name=bench_${n}r_$tr
      [ "$n" = 1 ] && name=bench_1r
      fg_step "$name" 75 "NCCL_DEBUG=WARN BRAID_GPU_BACKEND=cuda BRAID_TRANSPORT=$tr '$run' -n $n --timeout 70 -- '$ab' --device \
        --backend nccl --nccl-library '$nccl_lib' -b 1K -e 64M -f 4 -n 10 -w 2 -c 1 --csv '$out/$name.csv'"
      require_device "$name"
    done
  done
  # Whole-buffer staging beside the device path's rows above (same sizes, braid only).
  for cfg in "2 shm" "4 tcp"; do
    n=${cfg% *} tr=${cfg#* }
    name=bench_${n}r_${tr}_staged
    fg_step "$name" 60 "BRAID_DEVICE_PATH=staged BRAID_GPU_BACKEND=cuda BRAID_TRANSPORT=$tr '$run' -n $n --timeout 55 -- '$ab' \
      --device -b 1K -e 64M -f 4 -n 10 -w 2 -c 1 --csv '$out/$name.csv'"
    require_device "$name"
  done
  # Compressed all-reduce on device buffers (device path: codecs as kernels, only encoded
  # bytes leave the GPU), the codecs side by side over tcp.
  fg_step bench_2r_tcp_codecs_direct 60 "BRAID_GPU_BACKEND=cuda BRAID_TRANSPORT=tcp '$run' -n 2 \
    --timeout 55 -- '$ab' --device -b 64M -e 64M -n 5 -w 1 --rounds 5 --codec none,fp16,int8,sign1 \
    --csv '$out/bench_2r_tcp_codecs_direct.csv'"
  require_device bench_2r_tcp_codecs_direct
  # The device path's work per call per algorithm and codec on CUDA (the table of docs/gpu.md
  # "Budgets" was made on the emulation).
  fg_step device_budgets 120 "BRAID_GPU_BACKEND=cuda '$root/scripts/device_budgets.sh' '$bd' > '$out/device_budgets.md'"
  require_device device_budgets
  if [ -x "$bd/bench/bench_gpu_runtime" ]; then
    # The runtime calls the device path is made of (docs/gpu.md "Calibration"): host-function
    # round trip, stream-wait release after a host write, CPU cost of a copy, flag write,
    # event record and launch. Their figures are to set the emulation's defaults.
    fg_step bench_gpu_runtime 60 "BRAID_GPU_BACKEND=cuda '$bd/bench/bench_gpu_runtime' --benchmark_min_time=0.2s \
      --benchmark_out='$out/bench_gpu_runtime.csv' --benchmark_out_format=csv"
    require_device bench_gpu_runtime
  else
    skip bench_gpu_runtime "not built (Google Benchmark not found)"
  fi
  if [ -x "$bd/bench/bench_cuda_kernels" ]; then
    fg_step bench_cuda_kernels 90 "'$bd/bench/bench_cuda_kernels' --benchmark_min_time=0.1 \
      --benchmark_out='$out/bench_cuda_kernels.csv' --benchmark_out_format=csv"
    require_device bench_cuda_kernels
  else
    skip bench_cuda_kernels "not built (Google Benchmark not found)"
  fi
else
  # The plumbing of the device bench on the emulated runtime; NCCL says why it cannot run.
  fg_step bench_device_emulated 90 "BRAID_GPU_BACKEND=emulated '$run' -n 2 --timeout 80 -- '$ab' --device --backend nccl \
    -b 1K -e 1M -f 8 -n 2 -w 1 -c 1 --csv '$out/bench_device_emulated.csv'"
  fg_step bench_device_emulated_staged 90 "BRAID_DEVICE_PATH=staged BRAID_GPU_BACKEND=emulated '$run' -n 2 --timeout 80 -- \
    '$ab' --device -b 1K -e 1M -f 8 -n 2 -w 1 -c 1 --csv '$out/bench_device_emulated_staged.csv'"
  for s in bench_1r bench_2r_shm bench_2r_tcp bench_4r_shm bench_4r_tcp bench_2r_shm_staged bench_4r_tcp_staged \
    bench_2r_tcp_codecs_direct device_budgets bench_gpu_runtime bench_cuda_kernels; do skip $s "no GPU"; done
fi

# --- correctness, side by side -------------------------------------------------------------
bg_step arch_check 60 "'$root/tests/check_cuda_arch.sh' \"\$(command -v cuobjdump || ls '$root'/build-py/cuda-tools/nvidia/*/bin/cuobjdump 2>/dev/null | head -1)\" '$bd/src/libbraid.so' \
  \$(sed -n 's/^#define BRAID_HAVE_CUDA //p' '$bd/include/braid/config.hpp' 2>/dev/null || echo 0)"
if [ "$have_tests" = 1 ]; then
  bg_step ctest_gpu 200 "cd '$bd' && $require ctest -L gpu --output-on-failure -j 4 --timeout 190"
  bg_step device_collectives 200 "BRAID_GPU_BACKEND=$backend '$bd/tests/test_device_collectives'"
  bg_step device_hazards 200 "BRAID_GPU_BACKEND=$backend '$bd/tests/test_device_hazards'"
  bg_step gpu_runtime 60 "$require '$bd/tests/test_gpu_runtime'"
  bg_step device_exec 60 "BRAID_GPU_BACKEND=$backend '$bd/tests/test_device_exec'"
  # torch CUDA tensors through the braid backend (tests/python/ranks_torch_cuda.py): the
  # package from the source tree with the extension just built, two ranks on the one GPU.
  so=$(ls "$bd"/bindings/_C*.so 2>/dev/null | head -1)
  if [ -n "$so" ]; then
    mkdir -p "$bd/pypkg/braid"
    cp "$root"/python/braid/*.py "$root"/python/braid/py.typed "$so" "$bd/pypkg/braid/"
    bg_step torch_cuda 200 "PYTHONPATH='$bd/pypkg' PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 BRAID_GPU_BACKEND=cuda '$run' -n 2 --timeout 190 -- \
      python3 '$root/tests/python/ranks_torch_cuda.py'"
  else
    skip torch_cuda "no torch with CUDA or no pybind11 for python3: the extension was not built"
  fi
else
  skip ctest_gpu "tests not built (no GoogleTest)"
  skip device_collectives "tests not built (no GoogleTest)"
  skip device_hazards "tests not built (no GoogleTest)"
  skip gpu_runtime "tests not built (no GoogleTest)"
  skip device_exec "tests not built (no GoogleTest)"
fi
if [ "$gpu" = 1 ] && [ -n "$sanitizer" ]; then
  if [ "$have_tests" = 1 ]; then
    # The 64 Mi-element cases stay out: memcheck makes them minutes long.
    bg_step memcheck_kernels 200 "$require $sanitizer --tool memcheck --leak-check full --error-exitcode 1 '$tk' --gtest_filter='-*LargeCounts*'"
    bg_step racecheck 200 "$require $sanitizer --tool racecheck --error-exitcode 1 '$tk' --gtest_filter='*Encode*:*Decode*'"
    bg_step synccheck 200 "$require $sanitizer --tool synccheck --error-exitcode 1 '$tk' --gtest_filter='*Encode*:*Decode*:*Reduce*'"
  else
    for s in memcheck_kernels racecheck synccheck; do skip $s "tests not built (no GoogleTest)"; done
  fi
  bg_step memcheck_allreduce 150 "BRAID_GPU_BACKEND=cuda '$run' -n 2 --timeout 140 -- $sanitizer --tool memcheck --error-exitcode 1 \
    '$ab' --device -b 1M -e 1M -n 2 -w 1 -c 1"
else
  why="no GPU"
  [ "$gpu" = 1 ] && why="no compute-sanitizer on PATH or in /usr/local/cuda/bin"
  for s in memcheck_kernels racecheck synccheck memcheck_allreduce; do skip $s "$why"; done
fi
wait
[ "$gpu" = 1 ] && [ -n "$sanitizer" ] && require_device memcheck_allreduce

# NCCL's C API (libbraid_nccl, docs/nccl-api.md) on device buffers: one thread, two
# communicators (two GPUs, or both on the one), stream-ordered calls and grouped send/recv.
if [ -x "$bd/tests/nccl/nccl_device_test" ]; then
  fg_step nccl_device 60 "BRAID_GPU_BACKEND=$backend '$bd/tests/nccl/nccl_device_test'"
else
  skip nccl_device "not built (no GoogleTest: tests off)"
fi

# nccl-tests' own all_reduce_perf, compiled with braid's nccl.h and linked against
# libbraid_nccl (named libnccl.so in a scratch NCCL_HOME), when NCCL_TESTS_SRC names a
# checkout of its source (github.com/NVIDIA/nccl-tests; never vendored here). The header is
# seen at API level 2.26: from 2.27 nccl-tests uses window registration and from 2.28 NCCL's
# device API (nccl_device.h), which braid does not provide. CUDA_LIB points at a directory
# with CUDA's runtime only, so that -lnccl cannot find the toolkit's own libnccl first.
# (Compiled and linked this way on a machine without a GPU, 2026-11-29: nccl-tests 2.19.6,
# every *_perf binary; docs/nccl-api.md.)
if [ "$gpu" = 1 ] && [ -n "${NCCL_TESTS_SRC:-}" ] && [ -f "$NCCL_TESTS_SRC/src/Makefile" ]; then
  nh=$out/nccl_home
  cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
  mkdir -p "$nh/include" "$nh/lib" "$nh/cudalib"
  cp "$root/include/braid/nccl.h" "$nh/include/braid_nccl.h"
  printf '#include "braid_nccl.h"\n#undef NCCL_MINOR\n#define NCCL_MINOR 26\n#undef NCCL_VERSION_CODE\n#define NCCL_VERSION_CODE 22600\n' \
    >"$nh/include/nccl.h"
  ln -sf "$bd/bindings/nccl/libbraid_nccl.so" "$nh/lib/libnccl.so"
  for f in "$cuda_home"/lib64/libcudart*; do ln -sf "$f" "$nh/cudalib/"; done
  fg_step nccl_tests_build 150 "make -C '$NCCL_TESTS_SRC' -j $jobs MPI=0 NCCL_HOME='$nh' CUDA_HOME='$cuda_home' \
    CUDA_LIB='$nh/cudalib' NVCC_GENCODE='-gencode=arch=compute_90,code=sm_90' BUILDDIR='$out/nccl-tests-build' src.build"
  fg_step nccl_tests_all_reduce 90 "LD_LIBRARY_PATH='$bd/bindings/nccl:$bd/src' BRAID_GPU_BACKEND=cuda \
    '$out/nccl-tests-build/all_reduce_perf' -b 8 -e 64M -f 4 -g 1 -t 2 -c 1"
else
  skip nccl_tests "needs a GPU and NCCL_TESTS_SRC (a checkout of nccl-tests' source)"
fi

# --- summary --------------------------------------------------------------------------------
{
  echo "# braid gpu_check: $( [ "$gpu" = 1 ] && echo "$gpus GPU(s)" || echo "no GPU (dry run: emulated device runtime)"), \
$(($(date +%s) - t_start))s of ${budget}s, logs in $out"
  printf '%-26s %-9s %4s %6s  %s\n' step status rc sec note
  for s in "${order[@]}"; do cat "$out/.results/$s"; done
} >"$out/summary.txt"
cat "$out/summary.txt"
if grep -qE '^[^#][^ ]* +(FAILED|TIMEOUT|NOT-RUN) ' "$out/summary.txt"; then
  echo "gpu_check: FAILED (see the steps above)"
  exit 1
fi
echo "gpu_check: ok"
