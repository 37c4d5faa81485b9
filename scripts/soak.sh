#!/usr/bin/env bash
# scripts/soak.sh [N] [braid_soak options...]: the soak test (docs/reliability.md, "Soak"). N mixed
# collectives (default 100000) of random sizes, types, ops, algorithms and codecs on 4 rank processes
# with random async depth, every result checked against a reference; every 10,000 operations the
# ranks' VmRSS, open fds, threads and shared memory are sampled and printed as a table. Exits non-zero
# on any wrong result or failed call, and when fds, threads or shared memory grew after the warm-up
# or VmRSS grew by more than 1%.
# Builds Release into build/ first (scripts/build.sh) when it has no braid_soak yet, else brings
# braid_soak up to date; BRAID_SOAK_BUILD=DIR uses another build directory. Options after N go to
# braid_soak (--seed S, --max-bytes B, --hosts H, --transport T, ...; --help lists them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
ops=100000
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
  ops=$1
  shift
fi
dir=${BRAID_SOAK_BUILD:-build}
bin=$dir/tests/braid_soak
if [ -x "$bin" ]; then
  cmake --build "$dir" --target braid_soak -j "$(nproc 2>/dev/null || echo 2)" >/dev/null
else
  scripts/build.sh "$dir" >/dev/null
fi
[ -x "$bin" ] || { echo "soak.sh: no $bin after the build (configured with BRAID_BUILD_TESTS=OFF?)" >&2; exit 1; }
echo "== braid soak: $ops operations, $bin, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(nproc) cores =="
start=$SECONDS
status=0
"$bin" --ops "$ops" "$@" || status=$?
echo "== wall time $((SECONDS - start)) s, exit status $status =="
exit "$status"
