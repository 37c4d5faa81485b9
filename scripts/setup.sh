#!/usr/bin/env bash
# Installs the system packages braid needs to build and test, if any are missing.
# Idempotent; run as root on Debian 12 (the scripts call it for you).
set -euo pipefail

need=(cmake g++ make libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev iproute2 procps)
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
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
