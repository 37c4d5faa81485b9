"""Shared helpers: launching real multi-process jobs with braidrun.

Every multi-rank test starts N real processes with the `braidrun` launcher that
`pip install .` put next to this interpreter, runs one scenario of a worker script
(tests/python/ranks_*.py) in each, and checks the exit status and output. A worker
asserts against NumPy/torch references itself and exits non-zero on any mismatch.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def braidrun_path() -> str:
    cand = Path(sys.executable).parent / "braidrun"
    if cand.exists():
        return str(cand)
    found = shutil.which("braidrun")
    if not found:
        pytest.fail("braidrun is not installed next to this Python nor on PATH; run `pip install .`")
    return found


def launch(n, worker, *args, timeout=120, env=None, check=True):
    """Runs `braidrun -n n -- python worker args...`; returns the CompletedProcess."""
    cmd = [braidrun_path(), "-n", str(n), "-p", "--timeout", str(timeout), "--",
           sys.executable, str(HERE / worker), *map(str, args)]
    e = dict(os.environ)
    e.setdefault("BRAID_TIMEOUT", "60s")
    e.setdefault("OMP_NUM_THREADS", "1")
    if env:
        e.update(env)
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout + 30)
    if check and p.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {p.returncode}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")
    return p


@pytest.fixture
def run_ranks():
    return launch
