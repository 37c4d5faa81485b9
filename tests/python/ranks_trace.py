"""One rank of a flight-recorder test job (started by braidrun from test_trace.py).

Usage: ranks_trace.py SCENARIO TRACE_DIR
BRAID_TRACE_DIR is TRACE_DIR in every rank's environment.
"""
import glob
import json
import os
import signal
import sys
import time

import numpy as np

import braid


def stop():
    """Rank 2 stops itself (SIGSTOP) in the middle of a loop of all-reduces; the others time
    out, and each of their engines writes its dump on the failure."""
    comm = braid.init(timeout=3.0)
    x = np.ones(1024, np.float32)
    for i in range(1000):
        if comm.rank == 2 and i == 40:
            os.kill(os.getpid(), signal.SIGSTOP)
        try:
            comm.allreduce(x)
        except braid.Error as e:
            print(f"rank {comm.rank}: call {i} failed: {type(e).__name__}")
            sys.exit(3)
    raise AssertionError("the loop finished although rank 2 stopped")


def mismatch():
    """Rank 0 broadcasts 300 values where the others all-reduce 1024: whatever happens to
    the calls, every rank then dumps, and the report must say the calls differ."""
    comm = braid.init(timeout=3.0)
    for _ in range(5):
        comm.allreduce(np.ones(1024, np.float32))
    try:
        if comm.rank == 0:
            comm.broadcast(np.ones(300, np.float32), root=0)
        else:
            comm.allreduce(np.ones(1024, np.float32))
    except braid.Error as e:
        print(f"rank {comm.rank}: the mismatched call failed: {type(e).__name__}")
    comm.dump_trace()


def dump():
    """dump_trace() keeps the last BRAID_TRACE_ENTRIES operations, collectives and sends and
    receives, with their fields; SIGUSR1 writes the file too."""
    comm = braid.init(timeout=20.0)
    r, n = comm.rank, comm.size
    x = np.arange(256, dtype=np.float32)
    for _ in range(60):
        comm.allreduce(x)
    comm.broadcast(x, root=1)
    y = np.zeros(64, np.float64)
    if r == 0:
        comm.send(y, 1, tag=7)
    elif r == 1:
        comm.recv(y, 0, tag=7)
    comm.barrier()
    d = comm.dump_trace()
    keep = int(os.environ["BRAID_TRACE_ENTRIES"])
    assert d["rank"] == r and d["size"] == n and d["capacity"] == keep, d
    assert d["reason"] == "dump_trace()" and d["failed"] is False, d
    es = d["entries"]
    assert len(es) == keep, [e["name"] for e in es]
    assert d["recorded"] > keep, d["recorded"]
    assert all(e["state"] == "done" for e in es), es
    seqs = [e["seq"] for e in es if e["seq"] > 0]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
    calls = [e["call"] for e in es]
    assert calls[-1] == "barrier" or "barrier" in calls[-3:], calls
    b = [e for e in es if e["call"] == "broadcast"]
    assert b and b[0]["root"] == 1 and b[0]["count"] == 256 and b[0]["dtype"] == "f32", b
    a = [e for e in es if e["call"] == "allreduce" and e["count"] == 256][-1]
    assert a["op"] == "sum" and a["codec"] == "none" and a["end_us"] >= a["start_us"], a
    assert a["bytes_sent"] >= 1024 * (n - 1) // n, a  # at least (n-1)/n of the 1 KiB buffer
    if r < 2:
        p = [e for e in es if e["call"] in ("send", "recv")]
        assert len(p) == 1 and p[0]["p2p_seq"] == 1 and p[0]["root"] == 1 - r and p[0]["dtype"] == "f64", p
    path = glob.glob(os.path.join(sys.argv[2], f"braid_trace.*.rank{r}.json"))
    assert len(path) == 1, path
    assert json.load(open(path[0]))["reason"] == "dump_trace()"
    comm.barrier()
    os.kill(os.getpid(), signal.SIGUSR1)  # braid's handler: the engine dumps again
    until = time.monotonic() + 10
    while json.load(open(path[0]))["reason"] != "SIGUSR1":
        assert time.monotonic() < until, "no dump after SIGUSR1"
        time.sleep(0.05)
    comm.barrier()
    print(f"rank {r}: dump ok")


def metrics():
    """Counters per collective, algorithm and codec, as comm.metrics() and the HTTP endpoint
    (BRAID_METRICS_PORT + local rank) give them."""
    import urllib.request
    comm = braid.init(timeout=20.0)
    r = comm.rank
    x = np.ones(1024, np.float32)
    for _ in range(25):
        comm.allreduce(x, algorithm="ring")
    comm.allreduce(x, codec="int8")
    if r == 0:
        comm.send(x, 1)
    elif r == 1:
        comm.recv(x, 0)
    comm.barrier()
    m = comm.metrics()
    assert m["rank"] == r and m["size"] == comm.size, m
    ops = {(o["collective"], o["algorithm"], o["codec"]): o for o in m["operations"]}
    ring = ops[("allreduce", "ring", "none")]
    assert ring["calls"] == 25 and ring["errors"] == 0 and ring["bytes"] == 25 * 4096, ring
    assert ring["wire_bytes"] > 0 and ring["seconds"] > 0 and sum(ring["histogram"]) == 25, ring
    coded = [o for k, o in ops.items() if k[2].startswith("int8")]
    assert len(coded) == 1 and coded[0]["calls"] == 1 and coded[0]["wire_bytes"] < 4096 * 2, coded
    if r < 2:
        p2p = ops[("send" if r == 0 else "recv", "p2p", "none")]
        assert p2p["calls"] == 1 and p2p["bytes"] == 4096, p2p
    line = (f'braid_calls_total{{comm="braid",rank="{r}",collective="allreduce",algorithm="ring",codec="none"}} 25')
    assert line in m["prometheus"], m["prometheus"]
    port = int(os.environ["BRAID_METRICS_PORT"]) + comm.local_rank
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert line in body, body[:2000]
    assert body.count("# TYPE braid_seconds histogram") == 1, body[:2000]
    comm.barrier()
    print(f"rank {r}: metrics ok")


def late():
    """Rank 1 computes 30 ms longer than the others before each large all-reduce; the
    periodic reports (BRAID_REPORT_SECONDS) and the last one at close give braid_trace what
    it needs to name it."""
    comm = braid.init(timeout=20.0)
    x = np.ones(1 << 18, np.float32)  # 1 MiB: large enough for the link report
    for _ in range(30):
        if comm.rank == 1:
            time.sleep(0.03)
        comm.allreduce(x, algorithm="ring")
    r = comm.rank
    comm.close()
    print(f"rank {r}: late ok")


if __name__ == "__main__":
    globals()[sys.argv[1]]()
