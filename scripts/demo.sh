#!/usr/bin/env bash
# The demo: installs what is missing, builds Release into build/, and runs
# allreduce_bench on 4 local ranks (braidrun) from 1 KiB to 64 MiB with checking.
# C++ only: the Python environment (torch, ~3 GB) is for scripts/test.sh and the README's
# Python section, so the demo skips it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BRAID_SKIP_PYTHON=1 scripts/setup.sh
scripts/build.sh build >/dev/null
echo "== braid: 4 ranks on this host over TCP loopback, float sum, results checked =="
exec build/tools/braidrun -n 4 --timeout 600 -- build/bench/allreduce_bench -b 1K -e 64M -f 2 -n 20 -w 5 -c 1 "$@"
