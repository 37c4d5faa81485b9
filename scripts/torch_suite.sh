#!/usr/bin/env bash
# scripts/torch_suite.sh [-n WORLD_SIZE] [-b BACKEND] [--compare | --ci] [unittest args...]
#
# PyTorch's own process-group test suite (torch.testing._internal.distributed.
# distributed_test.DistributedTest, as PyTorch's test/distributed/test_distributed_spawn.py
# runs it) against the braid backend (default) or another (-b gloo), with spawned ranks
# (default 2), on CPU tensors, from build-py/venv (scripts/setup.sh; `pip install .` into it).
# The arguments go to unittest: `-k test_isend -k test_destroy_group` selects tests, `-v`
# names each.
#
# --compare: runs braid, then gloo on the tests braid did not pass, and fails (exit 1) on
#   every test gloo passes and braid does not, unless tests/torch_suite/known_gaps.txt lists
#   it with the reason (a feature braid deliberately lacks); a listed test that braid passes
#   fails too, so the list stays true. The whole suite takes about 20 minutes on 2 cores.
# --ci: --compare on the selection in tests/torch_suite/ci_selection.txt (collectives, point
#   to point, groups, DDP: about 4 minutes), as CI runs it (ctest python_torch_suite).
#
# BRAID_SUITE_OUT=DIR keeps each backend's outcomes there (braid.json, gloo.json).
# The suite needs expecttest and hypothesis (scripts/setup.sh installs them; installed here
# if missing). docs/python.md has the latest whole-suite results.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${BRAID_PYTHON:-$root/build-py/venv/bin/python}
world=2 backend=braid mode=plain
while [ $# -ge 1 ]; do  # our options first; everything after them goes to unittest
  case $1 in
    -n) world=$2; shift 2 ;;
    -b) backend=$2; shift 2 ;;
    --compare) mode=compare; shift ;;
    --ci) mode=ci; shift ;;
    *) break ;;
  esac
done
# --ci exits 77 (ctest: skipped) where the environment is missing, as the other python tests.
missing=2
[ "$mode" = ci ] && missing=77
[ -x "$py" ] || { echo "SKIP: no Python at $py: run scripts/setup.sh, then pip install . into build-py/venv" >&2; exit $missing; }
"$py" -c "import braid._C, torch" 2>/dev/null || { echo "SKIP: braid or torch is not installed in $py's environment" >&2; exit $missing; }
"$py" -c "import expecttest, hypothesis" 2>/dev/null || "$py" -m pip install -q expecttest hypothesis
tmp=$(mktemp -d /tmp/braid-torch-suite.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
suite=$root/tests/torch_suite
run() {  # run BACKEND RESULTS unittest-args...
  local b=$1 out=$2
  shift 2
  mkdir -p "$tmp/$b"
  (cd "$suite" && BACKEND=$b WORLD_SIZE=$world TEMP_DIR=$tmp/$b BRAID_SUITE_RESULTS=$out \
     GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo} "$py" run_suite.py "$@")
}
if [ "$mode" = plain ]; then
  run "$backend" "${BRAID_SUITE_RESULTS:-}" "$@"  # outcomes only where asked for
  exit
fi
args=("$@")
if [ "$mode" = ci ]; then
  mapfile -t selected < <(grep -v '^#' "$suite/ci_selection.txt" | awk 'NF {print "TestDistBackendWithSpawn." $1}')
  args=("${selected[@]}" "$@")
fi
echo "== torch suite: braid, $world ranks =="
run braid "$tmp/braid.json" "${args[@]}" || true  # failures are judged against gloo below
mapfile -t again < <("$py" "$suite/compare.py" --not-passed "$tmp/braid.json")
echo '{}' >"$tmp/gloo.json"
if [ ${#again[@]} -gt 0 ]; then
  echo "== torch suite: gloo on the ${#again[@]} test(s) braid did not pass =="
  run gloo "$tmp/gloo.json" "${again[@]/#/TestDistBackendWithSpawn.}" || true
fi
if [ -n "${BRAID_SUITE_OUT:-}" ]; then  # keep the outcomes: {test: [outcome, seconds, detail]}
  mkdir -p "$BRAID_SUITE_OUT" && cp "$tmp/braid.json" "$tmp/gloo.json" "$BRAID_SUITE_OUT/"
fi
"$py" "$suite/compare.py" "$tmp/braid.json" "$tmp/gloo.json"
