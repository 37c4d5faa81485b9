#!/usr/bin/env bash
# check_needed.sh READELF LIBRARY: fails when LIBRARY has a NEEDED entry for a CUDA or
# NVIDIA library (libcuda, libcudart, libnvidia-*, libnvrtc, ...) or for UCX or verbs
# (libucp, libucs, libuct, libibverbs, librdmacm) or PMIx (libpmix). libbraid links the CUDA runtime
# statically and the runtime loads the driver with dlopen, and braid loads UCX, verbs and
# PMIx with dlopen, so the library loads on any host, with or without a GPU driver, UCX or an
# RDMA stack (docs/kernels.md, docs/transport-ucx.md).
set -euo pipefail
readelf=$1 lib=$2
needed=$("$readelf" -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "NEEDED entries of $lib:"
printf '  %s\n' $needed
if printf '%s\n' $needed | grep -Ei '^lib(cuda|cudart|nvidia|nvrtc|cublas|nccl)'; then
  echo "FAIL: $lib links a CUDA/NVIDIA library directly; it must load without a GPU driver" >&2
  exit 1
fi
if printf '%s\n' $needed | grep -Ei '^lib(ucp|ucs|uct|ucm|ibverbs|rdmacm|mlx5|pmix)'; then
  echo "FAIL: $lib links UCX, verbs or PMIx directly; they must be loaded at run time (dlopen)" >&2
  exit 1
fi
[ -n "$needed" ] || { echo "FAIL: no NEEDED entries read from $lib (not a shared library?)" >&2; exit 1; }
echo "ok: no CUDA, NVIDIA, UCX, verbs or PMIx library among them"
