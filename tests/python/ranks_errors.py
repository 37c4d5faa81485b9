"""One rank of a failure test job (started by braidrun from test_multirank.py).

Usage: ranks_errors.py SCENARIO
"""
import os
import sys
import time

import numpy as np

import braid


def shrink():
    """Rank 2 of 3 dies between calls, with error feedback under way; ranks 0 and 1 get
    the error, shrink, and go on: the next (compressed) all-reduce on the two of them is
    correct."""
    comm = braid.init(timeout=20.0)
    g = np.full(1 << 14, 0.3, np.float32)
    comm.allreduce(g.copy(), codec="int8", ef_key="grads")
    comm.barrier()
    if comm.rank == 2:
        import subprocess
        subprocess.Popen([sys.executable, __file__, "newcomer"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os._exit(0)
    t0 = time.monotonic()
    try:
        comm.allreduce(np.ones(1 << 16, np.float32))
    except braid.Error as e:
        print(f"rank {comm.rank}: {type(e).__name__} after {time.monotonic() - t0:.2f}s")
    else:
        raise AssertionError("allreduce with a dead peer succeeded")
    small = comm.shrink()
    assert (small.rank, small.size) == (comm.rank, 2), (small.rank, small.size)
    x = np.full(1000, comm.rank + 1, np.float32)
    small.allreduce(x)
    assert np.all(x == 3), x[:4]
    y = g.copy()
    small.allreduce(y, codec="int8", ef_key="grads")  # the residuals came along
    assert np.allclose(y, 0.6, atol=0.05), y[:4]
    print(f"rank {comm.rank}: shrunk to rank {small.rank} of {small.size} in {time.monotonic() - t0:.2f}s, "
          f"next all-reduce correct")
    try:
        comm.shrink([comm.rank])
    except braid.Error as e:
        assert "itself" in str(e), str(e)
    # Grow back to 3: the process rank 2 started before it died joins as rank 2.
    big = small.grow(3)
    x = np.full(1000, big.rank + 1, np.float32)
    big.allreduce(x)
    assert np.all(x == 6), x[:4]
    print(f"rank {comm.rank}: grown back to {big.size} ranks with a newcomer, all-reduce correct")
    big.barrier()
    big.close()
    small.close()
    comm.close()


def newcomer():
    """Started by rank 2 of the shrink scenario before it dies: joins the grown communicator."""
    c = braid.Communicator.join(braid._launcher_store(), 2, 3, timeout=20.0)
    x = np.full(1000, c.rank + 1, np.float32)
    c.allreduce(x)
    assert np.all(x == 6), x[:4]
    c.barrier()
    c.close()


def dead_peer():
    """Rank 1 dies after a barrier; rank 0's next all-reduce must raise RemoteError naming
    rank 1 (or, if the loss is only seen at the deadline, TimeoutError) instead of hanging,
    and every later call must fail fast with AbortedError."""
    comm = braid.init(timeout=20.0)
    comm.barrier()
    if comm.rank == 1:
        os._exit(0)  # no goodbye: sockets and shared memory close under the peer
    time.sleep(0.5)
    x = np.ones(1 << 16, np.float32)
    t0 = time.monotonic()
    w = comm.allreduce(x, async_op=True, timeout=15.0)
    try:
        w.wait()
    except braid.RemoteError as e:
        assert e.peer == 1, f"RemoteError blames peer {e.peer}, not 1: {e}"
        assert e.code == "RemoteError" and "braid RemoteError" in str(e), str(e)
        print(f"rank 0: RemoteError(peer={e.peer}) after {time.monotonic() - t0:.1f}s: {e}")
    except braid.TimeoutError as e:
        print(f"rank 0: TimeoutError after {time.monotonic() - t0:.1f}s: {e}")
    else:
        raise AssertionError("allreduce with a dead peer succeeded")
    exc = w.exception()
    assert isinstance(exc, braid.Error), exc
    assert comm.failed()
    try:
        comm.allreduce(x)
    except braid.Error as e:
        print(f"rank 0: next call fails fast: {type(e).__name__}: {e}")
    else:
        raise AssertionError("a failed communicator accepted a new collective")
    comm.close()


def size_mismatch():
    """send of 10 elements met by a recv of 20: both sides get a braid error naming the peer."""
    comm = braid.init(timeout=20.0)
    r = comm.rank
    try:
        if r == 0:
            comm.send(np.zeros(10, np.float32), 1)
        else:
            comm.recv(np.zeros(20, np.float32), 0)
        comm.barrier()
    except braid.Error as e:
        print(f"rank {r}: {type(e).__name__}: {e}")
        assert "peer" in str(e) or "rank" in str(e), str(e)
    else:
        raise AssertionError(f"rank {r}: mismatched send/recv sizes went unnoticed")
    comm.close()


def timeout():
    """Rank 0 waits for a message rank 1 never sends: TimeoutError after the per-call deadline."""
    comm = braid.init(timeout=30.0)
    comm.barrier()
    if comm.rank == 0:
        t0 = time.monotonic()
        try:
            comm.recv(np.zeros(4, np.float32), 1, timeout=1.0)
        except braid.TimeoutError as e:
            dt = time.monotonic() - t0
            assert isinstance(e, TimeoutError) and isinstance(e, braid.Error)
            assert dt < 10, dt
            print(f"rank 0: TimeoutError after {dt:.1f}s: {e}")
        else:
            raise AssertionError("recv from a silent peer did not time out")
    else:
        time.sleep(3)
    os._exit(0)  # rank 0's communicator has failed; skip the goodbye


def interrupt():
    """Ctrl-C reaches a rank blocked in a collective (waits run in GIL-free slices)."""
    import signal
    import threading

    comm = braid.init(timeout=60.0)
    comm.barrier()
    if comm.rank == 0:
        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            comm.recv(np.zeros(4, np.float32), 1)
        except KeyboardInterrupt:
            print(f"rank 0: KeyboardInterrupt after {time.monotonic() - t0:.1f}s", flush=True)
        else:
            raise AssertionError("recv returned without a sender")
        comm.abort()
    else:
        time.sleep(3)
    os._exit(0)


if __name__ == "__main__":
    globals()[sys.argv[1]]()
