#!/usr/bin/env bash
# run_pytest.sh VENV TEST_FILE: runs one pytest file with VENV's Python, or exits 77
# (ctest: skipped) saying why when the environment or the braid package is missing.
set -euo pipefail
venv=$1
file=$2
py=$venv/bin/python
if [ ! -x "$py" ]; then
  echo "SKIP: no Python environment at $venv; run scripts/setup.sh, then $venv/bin/pip install ." >&2
  exit 77
fi
if ! "$py" -c "import braid._C" 2>/dev/null; then
  echo "SKIP: the braid package is not installed in $venv; run $venv/bin/pip install ." >&2
  exit 77
fi
cd "$(dirname "$file")"
exec "$py" -m pytest -q -rs -p no:cacheprovider "$file"
