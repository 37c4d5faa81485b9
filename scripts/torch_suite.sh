#!/usr/bin/env bash
# scripts/torch_suite.sh [-n WORLD_SIZE] [-b BACKEND] [unittest args...]
#
# PyTorch's own process-group test suite (torch.testing._internal.distributed.
# distributed_test.DistributedTest, as PyTorch's test/distributed/test_distributed_spawn.py
# runs it) against the braid backend (default) or another (-b gloo), with spawned ranks
# (default 2), on CPU tensors, from build-py/venv (scripts/setup.sh; `pip install .` into it).
# The arguments go to unittest: `-k test_isend -k test_destroy_group` selects tests, `-v`
# names each. The suite needs expecttest and hypothesis, installed here if missing.
# The whole suite takes about 20 minutes per backend on 2 cores; it is not in CI yet
# (issue 36). docs/python.md has the latest results.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${BRAID_PYTHON:-$root/build-py/venv/bin/python}
world=2 backend=braid
while [ $# -ge 2 ]; do  # -n and -b first; everything after them goes to unittest
  case $1 in
    -n) world=$2; shift 2 ;;
    -b) backend=$2; shift 2 ;;
    *) break ;;
  esac
done
[ -x "$py" ] || { echo "no Python at $py: run scripts/setup.sh, then pip install . into build-py/venv" >&2; exit 2; }
"$py" -c "import expecttest, hypothesis" 2>/dev/null || "$py" -m pip install -q expecttest hypothesis
tmp=$(mktemp -d /tmp/braid-torch-suite.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cd "$root/tests/torch_suite"
BACKEND=$backend WORLD_SIZE=$world TEMP_DIR=$tmp GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo} \
  exec "$py" run_suite.py "$@"
