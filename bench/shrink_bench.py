"""Time from a rank's death to the survivors' first correct all-reduce (issue 39).

    braidrun --keep-going -n 8 python bench/shrink_bench.py --victims 3,6 --rounds 5

Every rank runs all-reduces of --bytes in a loop. In each round, the victims of that
round write the wall-clock time into the job's store (braidrun's, which outlives every
rank) and SIGKILL themselves in the middle of an all-reduce. Each survivor times three
moments against that stamp: its call failing (detection), `shrink()` returning
(agreement and the new communicator), and the first all-reduce on the shrunk communicator
whose result it has checked (recovery). Rank 0 of the survivors prints one line per round
with the median and the worst over the survivors, and a JSON line with --json.

Rounds need spare ranks: every round kills --victims more (the first round's victims are
the ranks named; later rounds kill the same positions of the shrunk communicator). The
clock is CLOCK_REALTIME, one clock on one machine, so ranks in network namespaces (emulated
hosts, scripts/vcluster.sh) are timed the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time

import numpy as np

import braid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=4 << 20, help="all-reduce size (default 4 MiB)")
    ap.add_argument("--victims", default="1", help="ranks (of the communicator of the round) to kill, comma-separated")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5, help="all-reduces before each kill")
    ap.add_argument("--timeout", type=float, default=20.0, help="the communicator's timeout in seconds")
    ap.add_argument("--algorithm", default=None)
    ap.add_argument("--codec", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    try:
        store = braid._launcher_store(30.0)  # braidrun's: it outlives the ranks
    except braid.InvalidUsageError:
        raise SystemExit("shrink_bench: run under braidrun --keep-going (it needs a store that outlives the ranks)")
    victims = sorted({int(v) for v in args.victims.split(",")})
    comm = braid.init(timeout=args.timeout)
    if max(victims) >= comm.size or len(victims) >= comm.size:
        raise SystemExit(f"shrink_bench: victims {victims} do not fit {comm.size} ranks")
    n = args.bytes // 4
    x = np.empty(n, dtype=np.float32)
    opts = {"algorithm": args.algorithm, "codec": args.codec}
    ef = {"ef_key": "shrink_bench"} if args.codec and args.codec not in ("none", "fp16") else {}

    def allreduce_checked(c):
        x.fill(1.0)
        c.allreduce(x, **opts, **ef)
        tol = 0.02 * c.size if args.codec else 0.0
        if abs(float(x[0]) - c.size) > tol or abs(float(x[-1]) - c.size) > tol:
            raise SystemExit(f"shrink_bench: wrong sum {x[0]}, {x[-1]} on {c.size} ranks")

    for rnd in range(args.rounds):
        if comm.size - len(victims) < 1 or max(victims) >= comm.size:
            print(f"shrink_bench: round {rnd}: not enough ranks left ({comm.size})", file=sys.stderr)
            break
        size_before = comm.size
        for _ in range(args.warmup):
            allreduce_checked(comm)
        comm.barrier()
        if comm.rank in victims:
            # Die in the middle of the next all-reduce: the others are already in it.
            x.fill(1.0)
            comm.allreduce(x, async_op=True, **opts, **ef)
            time.sleep(0.002)
            store.set(f"shrink_bench/{rnd}/killed_at/{comm.rank}", repr(time.time()).encode())
            os.kill(os.getpid(), signal.SIGKILL)
        t_fail = None
        try:
            for _ in range(1000):
                allreduce_checked(comm)
        except braid.Error:
            t_fail = time.time()
        if t_fail is None:
            raise SystemExit("shrink_bench: no failure was seen in 1000 all-reduces")
        comm = comm.shrink()
        t_shrunk = time.time()
        allreduce_checked(comm)
        t_ok = time.time()
        killed = min(float(store.get(f"shrink_bench/{rnd}/killed_at/{v}", 30.0).decode()) for v in victims)
        mine = [t_fail - killed, t_shrunk - killed, t_ok - killed]
        store.set(f"shrink_bench/{rnd}/times/{comm.rank}", json.dumps(mine).encode())
        if comm.rank == 0:
            rows = [json.loads(store.get(f"shrink_bench/{rnd}/times/{r}", 60.0).decode()) for r in range(comm.size)]
            cols = list(zip(*rows))

            def ms(v):
                return round(v * 1000, 1)

            res = {"round": rnd, "ranks": size_before, "victims": victims, "bytes": args.bytes,
                   "transport": os.environ.get("BRAID_TRANSPORT", "auto"), "timeout_s": args.timeout,
                   "detect_ms": [ms(statistics.median(cols[0])), ms(max(cols[0]))],
                   "shrink_ms": [ms(statistics.median(cols[1])), ms(max(cols[1]))],
                   "recover_ms": [ms(statistics.median(cols[2])), ms(max(cols[2]))]}
            print(f"round {rnd}: {size_before} ranks, killed {victims} -> {comm.size}: failure seen "
                  f"{res['detect_ms'][0]} ms (worst {res['detect_ms'][1]}), shrunk {res['shrink_ms'][0]} ms "
                  f"(worst {res['shrink_ms'][1]}), first correct all-reduce {res['recover_ms'][0]} ms "
                  f"(worst {res['recover_ms'][1]}) after the kill", flush=True)
            if args.json:
                print(json.dumps(res), flush=True)
    comm.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
