#!/usr/bin/env bash
# scripts/cuda12_check.sh [DIR]: compiles braid's CUDA sources (the device runtime's CUDA
# backend and the kernels) with a CUDA 12 toolkit, beside the CUDA 13 build that
# scripts/test.sh makes with the toolkit installed here, so that the code paths chosen by
# CUDART_VERSION for 12.x (docs/gpu.md, "Toolkits and drivers") keep compiling:
#   1. CUDA 12.4: braid_gpu_cuda and braid_kernels_cuda, as CMake builds them (sm_90);
#   2. CUDA 12.0's runtime headers (CUDART_VERSION 12000, the oldest 12.x): the backend again.
# No CUDA 12 toolkit is installed for this: it is assembled in DIR/toolkit (default
# build-cuda12/toolkit, 161 MB, kept for the next run) from packages, unpacked, not
# installed: nvcc, cicc, ptxas and the rest from Debian trixie's non-free
# nvidia-cuda-toolkit (12.4), the headers from PyPI's nvidia-cuda-runtime-cu12 (12.4 and
# 12.0), nvidia-cuda-nvcc-cu12 (crt/) and nvidia-cuda-cccl-cu12 (CUB) wheels, each checked
# against its published SHA-256. Compile only: these packages have no static CUDA 12
# runtime (Debian's is in the 900 MB nvidia-cuda-dev), and no GPU is here to run on.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=${1:-build-cuda12}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
tk=$dir/toolkit
dl=$dir/downloads
debian=${BRAID_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# The wheels, pinned with PyPI's SHA-256 (pip refuses a file that does not match); two
# requirement sets, since pip downloads one version of a package per run.
wheels='nvidia-cuda-runtime-cu12==12.4.127 --hash=sha256:64403288fa2136ee8e467cdc9c9427e0434110899d07c779f25b5c068934faa5
nvidia-cuda-nvcc-cu12==12.4.131 --hash=sha256:e4c9a35435c3b0e36c6397c5696334c9ea6650e524736cbd1c5d345ea099bb04
nvidia-cuda-cccl-cu12==12.4.127.post1 --hash=sha256:2027fa5fc75fbee703bf24e8275a40a605cf94a3e8fef8a7187897d49b34facb'
old_runtime='nvidia-cuda-runtime-cu12==12.0.146 --hash=sha256:18c038592af387684812fa712642aa9a26c12da80acb488b6709f7cced147f71'

assemble() {
  echo "cuda12_check: assembling a CUDA 12.4 toolkit in $tk"
  rm -rf "$tk" "$dl" "$dir/12.0"
  mkdir -p "$dl/deb" "$dl/whl" "$dl/whl120"
  # The newest nvidia-cuda-toolkit of trixie's non-free, with the SHA-256 its index gives.
  curl -fsSL --retry 3 -o "$dl/Packages.xz" "$debian/dists/trixie/non-free/binary-amd64/Packages.xz"
  local entry file sum version
  entry=$(xz -dc "$dl/Packages.xz" | awk 'BEGIN{RS=""} /^Package: nvidia-cuda-toolkit\n/ && !done {print; done = 1}')
  file=$(sed -n 's/^Filename: //p' <<<"$entry")
  sum=$(sed -n 's/^SHA256: //p' <<<"$entry")
  version=$(sed -n 's/^Version: //p' <<<"$entry")
  case $version in 12.*) ;; *) echo "cuda12_check: trixie's nvidia-cuda-toolkit is '$version', not 12.x" >&2; exit 1 ;; esac
  curl -fsSL --retry 3 -o "$dl/toolkit.deb" "$debian/$file"
  echo "$sum  $dl/toolkit.deb" | sha256sum -c --quiet
  dpkg -x "$dl/toolkit.deb" "$dl/deb"
  local pip=(python3 -m pip download --no-deps --disable-pip-version-check -q --only-binary=:all:)
  echo "$wheels" >"$dl/wheels.txt"
  "${pip[@]}" --require-hashes -r "$dl/wheels.txt" -d "$dl/whl"
  echo "$old_runtime" >"$dl/wheels120.txt"
  "${pip[@]}" --require-hashes -r "$dl/wheels120.txt" -d "$dl/whl120"
  for w in "$dl"/whl/*.whl; do python3 -m zipfile -e "$w" "$dl/whl/x"; done
  python3 -m zipfile -e "$dl"/whl120/*.whl "$dl/whl120/x"

  # The layout nvcc expects of a toolkit: bin/ (nvcc and its tools, nvcc.profile), nvvm/
  # (cicc, libdevice), include/, lib64/.
  local deb=$dl/deb/usr inc=$dl/whl/x/nvidia
  mkdir -p "$tk/bin" "$tk/nvvm/bin" "$tk/nvvm/libdevice" "$tk/include" "$tk/lib64" "$dir/12.0"
  cp -a "$deb/lib/nvidia-cuda-toolkit/bin/nvcc" "$deb/lib/nvidia-cuda-toolkit/bin/crt" "$tk/bin/"
  for t in ptxas fatbinary nvlink cudafe++ bin2c nvprune cuobjdump; do cp -a "$deb/bin/$t" "$tk/bin/"; done
  cp -a "$deb/lib/nvidia-cuda-toolkit/bin/cicc" "$tk/nvvm/bin/"
  cp -a "$deb/lib/nvidia-cuda-toolkit/libdevice/." "$tk/nvvm/libdevice/"
  cp -a "$inc/cuda_runtime/include/." "$inc/cuda_nvcc/include/." "$inc/cuda_cccl/include/." "$tk/include/"
  cp -a "$inc/cuda_runtime/lib/libcudart.so.12" "$tk/lib64/"
  ln -sf libcudart.so.12 "$tk/lib64/libcudart.so"
  rm -f "$tk/include/__init__.py"
  cp -a "$dl/whl120/x/nvidia/cuda_runtime/include" "$dir/12.0/"
  cat >"$tk/bin/nvcc.profile" <<'EOF'
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
EOF
  rm -rf "$dl"  # about 110 MB of packages, no longer needed
}

"$tk/bin/nvcc" --version 2>/dev/null | grep -q 'release 12\.' && [ -d "$dir/12.0/include" ] || assemble
release=$("$tk/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
host_cxx=$(command -v g++-12 || command -v g++)

# 1. The CUDA object libraries as CMake builds them, with the 12.x nvcc. CMake's compiler
# check links a test program; without a 12.x static runtime that link takes whatever
# libcudart_static.a the system has, which does not matter for object libraries.
echo "== CUDA $release: braid_gpu_cuda and braid_kernels_cuda (sm_90) =="
cmake -S . -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DBRAID_WITH_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$tk/bin/nvcc" -DCMAKE_CUDA_HOST_COMPILER="$host_cxx" -DCUDAToolkit_ROOT="$tk" \
  -DCMAKE_CUDA_ARCHITECTURES=90-real -DBRAID_BUILD_TESTS=OFF -DBRAID_BUILD_BENCH=OFF -DBRAID_BUILD_TOOLS=OFF \
  -DBRAID_BUILD_EXAMPLES=OFF -DBRAID_BUILD_PYTHON=OFF >"$dir/configure.log" ||
  { cat "$dir/configure.log"; exit 1; }
grep -qx "CMAKE_CUDA_COMPILER:[A-Z]*=$tk/bin/nvcc" "$dir/build/CMakeCache.txt" ||
  { echo "cuda12_check: CMake did not take $tk/bin/nvcc" >&2; grep '^CMAKE_CUDA_COMPILER' "$dir/build/CMakeCache.txt" >&2; exit 1; }
cmake --build "$dir/build" --target braid_gpu_cuda braid_kernels_cuda -j "$(nproc 2>/dev/null || echo 2)"

# 2. The backend against CUDA 12.0's runtime headers (before cudaGetDriverEntryPointByVersion,
# 12.5, and before cuFuncLoad's typedefs, 12.4), with the same flags as step 1.
echo "== CUDA 12.0 runtime headers: cuda_backend.cu =="
rsp=$dir/build/src/gpu/CMakeFiles/braid_gpu_cuda.dir/includes_CUDA.rsp
grep -q 'define CUDART_VERSION  *12000' "$dir/12.0/include/cuda_runtime_api.h"
"$tk/bin/nvcc" -ccbin "$host_cxx" -I"$dir/12.0/include" --options-file "$rsp" -O3 -DNDEBUG \
  --generate-code=arch=compute_90,code=sm_90 -Xcompiler=-fPIC -Xcompiler=-fvisibility=hidden -std=c++17 \
  -x cu -c src/gpu/cuda_backend.cu -o "$dir/cuda_backend_12.0.o"
echo "cuda12_check: braid's CUDA sources compile with CUDA $release and with CUDA 12.0's runtime headers"
