#!/usr/bin/env bash
# Installs the system packages braid needs to build and test, if any are missing.
# Idempotent; run as root on Debian 12 (the scripts call it for you).
set -euo pipefail

# openmpi-bin/libopenmpi-dev: the MPI_Allreduce comparison bench (bench/mpi_allreduce_bench.cpp,
# scripts/compare.sh); the build skips it when MPI is absent.
# libgloo-dev: the Gloo comparison bench (bench/gloo_allreduce_bench.cpp, skipped without it);
# python3-matplotlib: bench/compare's plot; iperf3: bench/compare's line-rate measurement.
need=(cmake g++ make libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev iproute2 procps
      openmpi-bin libopenmpi-dev
      libgloo-dev python3-matplotlib iperf3)
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
