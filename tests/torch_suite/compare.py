"""Compares two runs of PyTorch's DistributedTest (JSON files that run_suite.py writes with
BRAID_SUITE_RESULTS): every test the reference backend (gloo) passes that braid does not,
less the known gaps (known_gaps.txt: a test name, then the reason). Exit status 1 when
such a test remains, or when a known gap passes now (the list must stay true).

    python compare.py BRAID.json GLOO.json [--known known_gaps.txt]
    python compare.py --not-passed BRAID.json    # prints the tests braid did not pass
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

PASSED = {"pass", "xfail"}


def known_gaps(path: Path) -> dict:
    gaps = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, reason = line.partition(" ")
            gaps[name] = reason.strip()
    return gaps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("braid")
    ap.add_argument("reference", nargs="?")
    ap.add_argument("--known", default=str(Path(__file__).with_name("known_gaps.txt")))
    ap.add_argument("--not-passed", action="store_true")
    args = ap.parse_args()
    braid = json.loads(Path(args.braid).read_text())
    if args.not_passed:
        for t in sorted(t for t, (o, *_) in braid.items() if o not in PASSED):
            print(t)
        return 0
    ref = json.loads(Path(args.reference).read_text()) if args.reference else {}
    gaps = known_gaps(Path(args.known))
    counts = Counter(o for o, *_ in braid.values())
    print(f"braid: {len(braid)} tests: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    missing, listed, stale = [], [], []
    for t, (o, secs, detail) in sorted(braid.items()):
        if o in PASSED:
            if t in gaps:
                stale.append(t)
            continue
        r = ref.get(t, ["not run"])[0]
        if r not in PASSED:
            continue  # gloo does not pass it either
        (listed if t in gaps else missing).append((t, o, detail))
    for t, o, detail in listed:
        print(f"  known gap: {t}: braid {o}; {gaps[t]}")
    for t in stale:
        print(f"  STALE: {t} is listed in known_gaps.txt but braid passes it now: take it off the list")
    for t, o, detail in missing:
        print(f"  FAIL: {t}: gloo passes, braid {o}: {detail}")
    print(f"{len(missing)} test(s) gloo passes and braid does not (besides {len(listed)} known gap(s))")
    return 1 if missing or stale else 0


if __name__ == "__main__":
    sys.exit(main())
