#!/usr/bin/env bash
# Installs the system packages braid needs to build and test, if any are missing.
# Idempotent; run as root on Debian 12 (the scripts call it for you).
set -euo pipefail

# openmpi-bin/libopenmpi-dev: the MPI_Allreduce comparison bench (bench/mpi_allreduce_bench.cpp,
# scripts/compare.sh); the build skips it when MPI is absent.
# libgloo-dev: the Gloo comparison bench (bench/gloo_allreduce_bench.cpp, skipped without it);
# python3-matplotlib: bench/compare's plot; iperf3: bench/compare's line-rate measurement.
# libucx-dev/ucx-utils: UCX's headers (braid loads libucp at run time) and ucx_info.
# libibverbs-dev/ibverbs-providers: rdma-core's verbs headers (braid loads libibverbs at run
# time to list RDMA devices) and the providers libibverbs loads for real devices.
# libpmix-dev: PMIx's headers (braid loads libpmix at run time to find rank 0's store under
# mpirun or srun --mpi=pmix; Open MPI's packages bring the library).
# libssl-dev: OpenSSL's libcrypto (HMAC-SHA-256 of the store's and transports' handshakes).
# clang/libclang-rt-dev: libFuzzer and the sanitizer runtimes for scripts/fuzz.sh.
# curl/xz-utils: scripts/cuda12_check.sh fetches and reads Debian's package index.
need=(cmake g++ make libssl-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev iproute2 procps
      openmpi-bin libopenmpi-dev
      libgloo-dev python3-matplotlib iperf3
      libucx-dev ucx-utils
      libibverbs-dev ibverbs-providers
      libpmix-dev
      clang libclang-rt-dev
      curl xz-utils)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing packages (${missing[*]}) and not root; install them or rerun as root" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  # Quiet unless it fails (debconf and dpkg talk on stderr even with -qq).
  if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "setup: apt-get failed installing ${missing[*]}" >&2
    exit 1
  fi
fi

# cuobjdump, for the ctest cuda_arch_sm80_sm90 (tests/check_cuda_arch.sh): part of the CUDA
# toolkit, but some installs of the toolkit (this project's CI image) lack it; NVIDIA's
# PyPI wheel of the toolkit's major version has it (about 0.3 MB), put into
# build-py/cuda-tools where tests/CMakeLists.txt looks. Not needed without nvcc.
setup_root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ -x "$nvcc" ] && [ ! -x "$(dirname "$nvcc")/cuobjdump" ] && ! command -v cuobjdump >/dev/null 2>&1 &&
   ! ls "$setup_root"/build-py/cuda-tools/nvidia/*/bin/cuobjdump >/dev/null 2>&1; then
  major=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  echo "setup: the CUDA toolkit has no cuobjdump; installing nvidia-cuda-cuobjdump $major.x into build-py/cuda-tools"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check --target "$setup_root/build-py/cuda-tools" \
    "nvidia-cuda-cuobjdump>=$major,<$((major + 1))" ||
    echo "setup: could not install cuobjdump (pip); the test cuda_arch_sm80_sm90 will fail until it is there" >&2
fi

# Python: the project's virtual environment build-py/venv with
# what the Python package, its tests and examples/python need. torch comes from PyPI,
# whose Linux wheel pulls in CUDA runtime wheels (~3 GB, about a minute); braid only
# uses its CPU side. Refreshed when the list below changes. BRAID_SKIP_PYTHON=1 skips.
if [ "${BRAID_SKIP_PYTHON:-0}" != 1 ]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  venv=$root/build-py/venv
  py_deps=(torch==2.15.0 "numpy>=1.21" pytest scikit-learn matplotlib "scikit-build-core>=0.10"
           "pybind11>=2.12" expecttest hypothesis)  # the last two: PyTorch's own suite (torch_suite.sh)
  if ! python3 -c "import venv, ensurepip" 2>/dev/null; then
    echo "setup: python3 cannot make virtual environments; installing python3-venv python3-dev"
    if [ "$(id -u)" -ne 0 ]; then
      echo "setup: not root; install python3-venv and python3-dev" >&2
      exit 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv python3-dev \
      >/dev/null
  fi
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  stamp=$venv/.braid-deps
  if [ "$(cat "$stamp" 2>/dev/null)" != "${py_deps[*]}" ]; then
    echo "setup: installing Python packages into $venv: ${py_deps[*]}"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "${py_deps[@]}"
    echo "${py_deps[*]}" >"$stamp"
  fi
fi
