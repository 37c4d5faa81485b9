#!/usr/bin/env bash
# check_cuda_arch.sh CUOBJDUMP LIBRARY HAVE_CUDA: the device code in LIBRARY must hold
# cubins (SASS) for sm_80 (A100) and sm_90 (H100/H200), as CMAKE_CUDA_ARCHITECTURES'
# default 80-real;90-real;90-virtual says (docs/kernels.md), so that a build which quietly
# lost an architecture (a changed default, a cache entry, a toolchain that dropped one)
# fails here, on a machine without a GPU, instead of falling back to a PTX JIT or failing
# with "no kernel image" on the GPU. HAVE_CUDA 0 (a build without CUDA): skipped, exit 77.
set -euo pipefail
cuobjdump=$1 lib=$2 have_cuda=$3
if [ "$have_cuda" != 1 ]; then
  echo "SKIP: this build has no CUDA (BRAID_HAVE_CUDA 0), so libbraid holds no device code"
  exit 77
fi
if [ ! -x "$cuobjdump" ]; then
  echo "FAIL: cuobjdump not found (looked beside nvcc and in /usr/local/cuda/bin); it comes with the CUDA toolkit" >&2
  exit 1
fi
elfs=$("$cuobjdump" --list-elf "$lib" 2>&1) || { echo "$elfs"; echo "FAIL: cuobjdump --list-elf $lib failed" >&2; exit 1; }
ptx=$("$cuobjdump" --list-ptx "$lib" 2>&1 || true)
echo "cubins in $lib:"
echo "$elfs" | sed 's/^/  /'
echo "PTX in $lib:"
echo "$ptx" | sed 's/^/  /'
bad=0
for arch in sm_80 sm_90; do
  # A here-string, not `echo | grep -q`: under pipefail, grep -q leaving at its first match
  # can kill echo with SIGPIPE, and the pipeline then fails though the cubin is there.
  if ! grep -q "\.$arch\.cubin" <<<"$elfs"; then
    echo "FAIL: no $arch cubin in $lib (CMAKE_CUDA_ARCHITECTURES lost ${arch#sm_}-real?)" >&2
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "ok: sm_80 and sm_90 device code present"
exit "$bad"
