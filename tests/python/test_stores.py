"""Communicators built from explicit stores in processes started by multiprocessing
(spawn): FileStore, TcpStore hosted by one rank, a Python subclass of braid.Store,
and a NCCL-style unique id."""
import multiprocessing as mp
import os

import numpy as np
import pytest

import braid

N = 3


def _check(comm, tag):
    x = np.full(1001, comm.rank + 1, np.float64)
    comm.allreduce(x)
    assert np.all(x == N * (N + 1) / 2), (tag, x[:3])
    assert np.array_equal(comm.allgather(np.array([comm.rank])).ravel(), np.arange(N))


def _file_store(rank, path, q):
    try:
        with braid.Communicator(braid.FileStore(path), rank, N, timeout=30.0) as c:
            _check(c, "file")
        q.put((rank, "ok"))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, repr(e)))


def _tcp_store(rank, port, q):
    try:
        store = braid.TcpStore("127.0.0.1", port, is_server=False)
        with braid.Communicator(braid.PrefixStore("job", store), rank, N, timeout=30.0) as c:
            _check(c, "tcp")
        q.put((rank, "ok"))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, repr(e)))


class DictOverTcp(braid.Store):
    """A Store written in Python (here delegating to a TcpStore), called by braid's C++."""

    def __init__(self, base):
        super().__init__()
        self.base, self.calls = base, 0

    def set(self, key, value):
        self.calls += 1
        self.base.set(key, value)

    def get(self, key, timeout):
        self.calls += 1
        return self.base.get(key, timeout)

    def add(self, key, delta):
        self.calls += 1
        return self.base.add(key, delta)

    def check(self, keys):
        return self.base.check(keys)

    def wait(self, keys, timeout):
        self.base.wait(keys, timeout)

    def remove(self, key):
        return self.base.remove(key)


def _python_store(rank, port, q):
    try:
        store = DictOverTcp(braid.TcpStore("127.0.0.1", port))
        with braid.Communicator(store, rank, N, timeout=30.0, name="py") as c:
            _check(c, "python store")
        assert store.calls > 0
        q.put((rank, "ok"))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, repr(e)))


def _unique_id(rank, uid, q):
    try:
        c = braid.Communicator.from_unique_id(uid, rank, N, timeout=30.0)
        _check(c, "uid")
        c.close()
        q.put((rank, "ok"))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, repr(e)))


def _run(target, arg):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, arg, q)) for r in range(N)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert results == {r: "ok" for r in range(N)}, results


def test_file_store(tmp_path):
    _run(_file_store, str(tmp_path / "store"))


def test_tcp_store_server():
    server = braid.TcpStoreServer("127.0.0.1", 0)
    _run(_tcp_store, server.port)


def test_python_store_subclass():
    server = braid.TcpStoreServer("127.0.0.1", 0)
    _run(_python_store, server.port)


def test_unique_id(monkeypatch):
    monkeypatch.setenv("BRAID_SOCKET_IFNAME", "lo")  # the id's store listens on loopback
    # The id's store lives in the process that made it: make it in a rank, not here,
    # so that every rank is a fresh process reading BRAID_SOCKET_IFNAME.
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p0 = ctx.Process(target=_uid_rank0, args=(q,))
    p0.start()
    uid = q.get(timeout=60)
    procs = [ctx.Process(target=_unique_id, args=(r, uid, q)) for r in range(1, N)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=90) for _ in range(N))
    for p in [p0] + procs:
        p.join(timeout=30)
    assert results == {r: "ok" for r in range(N)}, results


def _uid_rank0(q):
    uid = braid.Communicator.create_unique_id()
    assert len(uid) == 128
    q.put(uid)
    _unique_id(0, uid, q)


def test_bad_unique_id():
    with pytest.raises(braid.InvalidUsageError, match="128 bytes"):
        braid.Communicator.from_unique_id(b"short", 0, 2)
    with pytest.raises(braid.InvalidUsageError, match="not a braid UniqueId"):
        braid.Communicator.from_unique_id(bytes(128), 0, 2)
