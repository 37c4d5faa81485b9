"""One rank of a NumPy API test job (started by braidrun from test_multirank.py).

Every rank builds every rank's input deterministically (seeded by rank), so each
can compute the NumPy reference of every collective locally and compare.
Usage: ranks_numpy.py SCENARIO
"""
import sys
import threading
import time

import numpy as np

import braid

COUNTS = (0, 1, 7, 1000, 4099)
DTYPES = (np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64)


def inputs(dtype, count, size):
    out = []
    for r in range(size):
        rng = np.random.default_rng(1000 + r)
        if np.issubdtype(dtype, np.floating):
            out.append(rng.uniform(-4, 4, count).astype(dtype))
        else:
            out.append(rng.integers(0, 5, count).astype(dtype))
    return out


def reference(xs, op):
    dtype = xs[0].dtype
    if op == "sum":
        acc = xs[0].copy()
        for x in xs[1:]:
            acc = (acc + x).astype(dtype)
        return acc
    if op == "prod":
        acc = xs[0].copy()
        for x in xs[1:]:
            acc = (acc * x).astype(dtype)
        return acc
    if op == "min":
        return np.minimum.reduce(xs)
    if op == "max":
        return np.maximum.reduce(xs)
    if op == "avg":
        s = reference(xs, "sum")
        if np.issubdtype(dtype, np.floating):
            return (s.astype(np.float64) / len(xs)).astype(dtype)
        return np.trunc(s.astype(np.float64) / len(xs)).astype(dtype)
    raise ValueError(op)


def close(got, want, what):
    if np.issubdtype(want.dtype, np.floating):
        tol = 2e-2 if want.dtype == np.float16 else 1e-5
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    else:
        ok = np.array_equal(got, want)
    if not ok:
        bad = np.flatnonzero(~np.isclose(got.astype(np.float64), want.astype(np.float64)))[:5]
        raise AssertionError(f"{what}: mismatch at {bad}: got {got.ravel()[bad]} want {want.ravel()[bad]}")


def allreduce(comm):
    n, r = comm.size, comm.rank
    checked = 0
    for dtype in DTYPES:
        for count in COUNTS:
            xs = inputs(dtype, count, n)
            for op in ("sum", "prod", "min", "max", "avg"):
                if op == "prod" and count > 7:
                    continue  # products of many ranks overflow small types; 7 elements suffice
                x = xs[r].copy()
                res = comm.allreduce(x, op=op)  # in place by default
                assert res is x, "allreduce must return its (in-place) buffer"
                close(x, reference(xs, op), f"allreduce {op} {np.dtype(dtype).name} n={count}")
                # out-of-place leaves the input alone
                y = xs[r].copy()
                out = np.empty_like(y)
                comm.allreduce(y, out=out, op=op)
                close(out, reference(xs, op), f"allreduce(out=) {op} {np.dtype(dtype).name}")
                assert np.array_equal(y, xs[r]), "out-of-place allreduce modified its input"
                checked += 2
    # every option is accepted and gives the same sum
    xs = inputs(np.float32, 4099, n)
    for algo in ("auto", "ring", "tree", "rhd"):
        x = xs[r].copy()
        comm.allreduce(x, algorithm=algo, deterministic=True, timeout=30.0)
        close(x, reference(xs, "sum"), f"allreduce algorithm={algo}")
    x = xs[r].copy()
    comm.allreduce(x, codec="none")
    close(x, reference(xs, "sum"), "allreduce codec=none")
    # 2-D arrays, and a bytearray through the buffer protocol
    x2 = xs[r].copy()[:4096].reshape(64, 64)
    comm.allreduce(x2)
    close(x2.ravel(), reference([a[:4096] for a in xs], "sum"), "allreduce 2-D")
    ba = bytearray([r + 1] * 10)
    comm.allreduce(ba, op="max")
    assert bytes(ba) == bytes([n] * 10), bytes(ba)
    print(f"rank {r}: allreduce {checked} cases ok")


def others(comm):
    n, r = comm.size, comm.rank
    for dtype in (np.float32, np.int64, np.uint8, np.float16):
        for count in (0, 1, 13, 3001):
            xs = inputs(dtype, count, n)
            for root in range(n):
                b = xs[r].copy()
                comm.broadcast(b, root=root)
                close(b, xs[root], f"broadcast root={root}")
                x = xs[r].copy()
                comm.reduce(x, root=root, op="max")
                if r == root:
                    close(x, reference(xs, "max"), f"reduce root={root}")
            g = comm.allgather(xs[r])
            assert g.shape == (n, count), g.shape
            close(g, np.stack(xs), "allgather")
            out = np.empty(n * count, dtype=dtype)
            comm.allgather(xs[r], out=out)
            close(out, np.concatenate(xs), "allgather(out=)")
            big = inputs(dtype, n * count, n)
            rs = comm.reduce_scatter(big[r], op="sum")
            close(rs, reference(big, "sum")[r * count:(r + 1) * count], "reduce_scatter")
            a2a = comm.alltoall(big[r])
            want = np.concatenate([big[j][r * count:(r + 1) * count] for j in range(n)])
            close(a2a, want, "alltoall")
            for root in {0, n - 1}:
                gathered = comm.gather(xs[r], root=root)
                if r == root:
                    close(gathered, np.stack(xs), f"gather root={root}")
                else:
                    assert gathered is None
                mine = np.empty(count, dtype=dtype)
                comm.scatter(big[root] if r == root else None, mine, root=root)
                close(mine, big[root][r * count:(r + 1) * count], f"scatter root={root}")
    # v-collectives: blocks of their own sizes, one of them empty
    counts = [(3 * j + 1) % 5 for j in range(n)]
    mine = np.arange(counts[r], dtype=np.float32) + 100 * r
    g = comm.allgatherv(mine, counts)
    want = np.concatenate([np.arange(counts[j], dtype=np.float32) + 100 * j for j in range(n)])
    assert np.array_equal(g, want), ("allgatherv", g, want)
    full = [np.arange(sum(counts), dtype=np.float32) * (j + 1) for j in range(n)]
    rs = comm.reduce_scatter_v(full[r], counts, op="premul_sum", scale=0.5)
    at = sum(counts[:r])
    assert np.array_equal(rs, 0.5 * sum(full)[at:at + counts[r]]), ("reduce_scatter_v", rs)
    sc = [(r + j) % 3 for j in range(n)]
    rc = [(j + r) % 3 for j in range(n)]
    send = np.concatenate([np.full(sc[j], 10 * r + j, dtype=np.int64) for j in range(n)])
    got = comm.alltoallv(send, sc, rc)
    want = np.concatenate([np.full(rc[j], 10 * j + r, dtype=np.int64) for j in range(n)])
    assert np.array_equal(got, want), ("alltoallv", got, want)
    # send/recv around a ring, both directions at once
    x = np.full(257, r, dtype=np.int32)
    got = np.empty(257, dtype=np.int32)
    right, left = (r + 1) % n, (r - 1) % n
    ws = comm.send(x, right, tag=3, async_op=True)
    wr = comm.recv(got, left, tag=3, async_op=True)
    ws.wait()
    wr.wait()
    assert np.all(got == left), got[:4]
    comm.barrier()
    print(f"rank {r}: broadcast reduce allgather reduce_scatter alltoall gather scatter v-collectives send/recv ok")


def async_work(comm):
    n, r = comm.size, comm.rank
    xs = inputs(np.float32, 100000, n)
    bufs = [xs[r].copy() for _ in range(8)]
    works = [comm.allreduce(b, async_op=True) for b in bufs]
    assert all(isinstance(w, braid.Work) for w in works)
    for w in works:
        assert w.wait(timeout=60.0) is True
        assert w.test() and w.is_completed()
        assert w.exception() is None
    for b in bufs:
        close(b, reference(xs, "sum"), "async allreduce")
    # result() and a dropped Work whose buffer we no longer hold
    w = comm.allgather(np.full(3, r, np.int64), async_op=True)
    assert np.array_equal(w.result(), np.repeat(np.arange(n), 3).reshape(n, 3))
    comm.allreduce(np.ones(1 << 16, np.float32), async_op=True)  # buffer kept alive by the communicator
    comm.barrier()
    # on_complete: the callback sees the finished work and chains the next collective
    got, chained = [], threading.Event()
    y = np.ones(1 << 16, np.float32)

    def then(work):
        got.append((work.test(), work.exception(), float(work.result()[0])))
        got.append(comm.allreduce(y, async_op=True))  # posting from a callback is allowed
        chained.set()

    w = comm.allreduce(np.ones(1 << 16, np.float32), async_op=True)
    w.on_complete(then)
    assert chained.wait(30), "on_complete's callback never ran"
    assert got[0] == (True, None, float(n)), got[0]
    got[1].wait()
    assert y[0] == n
    late = []
    w.on_complete(lambda work: late.append(work is w))  # already done: runs at once
    assert late == [True]
    # split: even and odd ranks
    sub = comm.split(r % 2, r)
    x = np.array([r], np.int64)
    sub.allreduce(x)
    assert x[0] == sum(k for k in range(n) if k % 2 == r % 2), x
    sub.close()
    assert comm.local_size == n and 0 <= comm.local_rank < n
    # A blocking call releases the GIL: while rank 0 waits in recv for a message that
    # rank 1 sends only after 0.5 s, another Python thread of rank 0 keeps counting.
    buf = np.zeros(4, np.float32)
    if r == 0:
        count, stop = [0], threading.Event()

        def spin():
            while not stop.is_set():
                count[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        c0 = count[0]
        comm.recv(buf, 1)
        c1 = count[0]
        stop.set()
        t.join()
        print(f"rank 0: {c1 - c0} Python steps while blocked in recv")
        assert c1 - c0 > 20000, f"only {c1 - c0} Python steps ran while recv blocked: GIL held?"
        assert np.all(buf == 7)
    elif r == 1:
        time.sleep(0.5)
        comm.send(np.full(4, 7, np.float32), 0)
    comm.barrier()
    print(f"rank {r}: async, split, GIL released while blocked ok")


def compressed(comm):
    """Compressed all-reduce: skipped (exit 3) if this build refuses codecs."""
    n, r = comm.size, comm.rank
    xs = inputs(np.float32, 4096, n)
    x = xs[r].copy()
    try:
        comm.allreduce(x, codec="int8", ef_key="bucket0")
    except braid.UnsupportedError as e:
        print(f"SKIP: {e}")
        sys.exit(3)
    want = reference(xs, "sum")
    err = np.abs(x - want).max() / np.abs(want).max()
    assert err < 0.05, f"int8 all-reduce relative error {err}"
    gathered = comm.allgather(x)
    assert all(np.array_equal(gathered[0], g) for g in gathered), "ranks disagree on the compressed result"
    print(f"rank {r}: int8 compressed allreduce ok, rel err {err:.4f}")
    error_feedback_checkpoint(comm, xs)


def error_feedback_checkpoint(comm, xs):
    """save/restore/reset_error_feedback and error_feedback_bytes from Python: a step
    after restoring a checkpoint (from bytes or from a file) equals the step after saving
    it; after a reset it does not; damaged data is refused and changes nothing."""
    import io

    n, r = comm.size, comm.rank
    shard = (4096 * (r + 1)) // n - (4096 * r) // n
    assert comm.error_feedback_bytes() == 4 * (4096 + shard)  # bucket0's worker + owner residuals
    for _ in range(3):
        comm.allreduce(xs[r].copy(), codec="sign1", ef_key="g/a")
    saved = comm.save_error_feedback(key_prefix="g/")
    f = io.BytesIO()
    assert comm.save_error_feedback(f) is None and f.getvalue() != saved  # every key, to a file
    a = xs[r].copy()
    comm.allreduce(a, codec="sign1", ef_key="g/a")
    comm.restore_error_feedback(saved, key_prefix="h/")  # the same residuals under another prefix
    b = xs[r].copy()
    comm.allreduce(b, codec="sign1", ef_key="h/a")
    assert np.array_equal(a, b), "a step from the restored residuals differs from the step after saving"
    f.seek(0)
    comm.restore_error_feedback(f)  # from the file: everything as it was before step a (h/ is gone)
    c = xs[r].copy()
    comm.allreduce(c, codec="sign1", ef_key="g/a")
    assert np.array_equal(a, c), "restoring from a file did not bring the residuals back"
    comm.reset_error_feedback("g/a")
    d = xs[r].copy()
    comm.allreduce(d, codec="sign1", ef_key="g/a")
    assert not np.array_equal(a, d), "reset_error_feedback left the residuals in place"
    held = comm.error_feedback_bytes()
    try:
        comm.restore_error_feedback(saved[:-3])
    except braid.InvalidUsageError as e:
        assert "truncated" in str(e), e
    else:
        raise AssertionError("a truncated checkpoint was accepted")
    assert comm.error_feedback_bytes() == held, "a refused checkpoint changed the residuals"
    comm.reset_error_feedback()
    assert comm.error_feedback_bytes() == 0
    print(f"rank {r}: error feedback save/restore/reset from Python ok")


def tuner(comm):
    """explain_allreduce: the model's line before any call of a size; after calls of it,
    the measured verdict, identical on every rank; results stay exact meanwhile."""
    n, r = comm.size, comm.rank
    xs = inputs(np.float32, 3000, n)
    before = comm.explain_allreduce(xs[r])
    assert "x %d ranks" % n in before and "->" in before, before
    for _ in range(5):
        x = xs[r].copy()
        comm.allreduce(x)
        close(x, reference(xs, "sum"), "tuned allreduce")
    after = comm.explain_allreduce(xs[r])
    whys = comm.allgather(np.frombuffer(after.ljust(400).encode()[:400], dtype=np.uint8).copy())
    assert all(np.array_equal(whys[0], w) for w in whys), "ranks explain different verdicts"
    assert "measured" in after, after
    # The link between hosts codec auto measures: none here (every rank on one host).
    link = comm.link_between_hosts()
    assert link == {"measured": False, "ranks": (-1, -1), "latency_us": 0.0, "bandwidth_gbps": 0.0}, link
    print(f"rank {r}: tuner ok: {after}")


def transports(comm):
    """Communicator(..., transport=T) from Python: one process holds communicators over
    tcp, shm and (when this build and host have UCX) ucx at once, each pair on the named
    transport (describe_topology), each all-reduce exact; an unknown name is refused
    with the names this build has."""
    n, r = comm.size, comm.rank
    names = ["tcp", "shm"]
    try:
        probe = braid.Communicator(braid.TcpStore("127.0.0.1", 0, is_server=True), 0, 1, transport="ucx")
        probe.close()
        names.append("ucx")
    except braid.InvalidUsageError as e:
        assert "is not a transport of this build" in str(e), e
    # Every rank must agree on the list: the smallest one wins.
    counts = comm.allgather(np.array([len(names)], dtype=np.int32))
    names = names[: int(min(c[0] for c in counts))]
    xs = inputs(np.float32, 10007, n)
    for t in names:
        uid = np.frombuffer(braid.Communicator.create_unique_id(), dtype=np.uint8).copy() if r == 0 \
            else np.zeros(128, dtype=np.uint8)
        comm.broadcast(uid, root=0)
        with braid.Communicator.from_unique_id(uid.tobytes(), r, n, timeout=60.0, name="t-" + t,
                                               transport=t) as c:
            topo = c.describe_topology()
            peers = [q for q in range(n) if q != r]
            line = next(ln for ln in topo.splitlines() if ln.strip().startswith(f"rank {r}:"))
            assert all(f"{q}={t}" in line for q in peers), topo
            x = xs[r].copy()
            c.allreduce(x)
            close(x, reference(xs, "sum"), f"allreduce over {t}")
    try:
        braid.Communicator(braid.TcpStore("127.0.0.1", 0, is_server=True), 0, 1, transport="nope")
        raise AssertionError("transport='nope' was accepted")
    except braid.InvalidUsageError as e:
        assert "'nope' is not a transport of this build" in str(e) and "tcp" in str(e), e
    print(f"rank {r}: transports ok: {','.join(names)}")


def main(scenarios=None):
    """Runs scenario sys.argv[1] of `scenarios` (a worker module's globals; default this
    module's) on a communicator from the launcher's environment."""
    scenario = sys.argv[1]
    with braid.init(timeout=60.0) as comm:
        (scenarios or globals())[scenario](comm)


if __name__ == "__main__":
    main()
