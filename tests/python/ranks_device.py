"""One rank of a device-buffer job (started by braidrun from test_multirank.py with
BRAID_GPU_BACKEND=emulated): device arrays reach braid through __cuda_array_interface__,
as CuPy's and Numba's do, and the calls join the stream the array names.

Usage: ranks_device.py SCENARIO
"""
import numpy as np

import braid
from braid import _C


class DeviceArray:
    """A minimal __cuda_array_interface__ producer on braid's device runtime."""

    def __init__(self, host: np.ndarray, stream: int = 0):
        self.dtype, self.shape = host.dtype, host.shape
        self.ptr = _C.device_alloc(max(host.nbytes, 1))
        _C.device_copy(self.ptr, host.ctypes.data, host.nbytes)
        self.stream = stream

    @property
    def __cuda_array_interface__(self):
        d = {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
             "strides": None}
        if self.stream:
            d["stream"] = self.stream
        return d

    def get(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        _C.device_copy(out.ctypes.data, self.ptr, out.nbytes)
        return out

    def __del__(self):
        _C.device_free(self.ptr)


def collectives(comm):
    n, r = comm.size, comm.rank
    assert _C.device_count() > 0, _C.device_runtime()
    stream = _C.device_create_stream()
    xs = [np.arange(1000, dtype=np.float32) * (k + 1) for k in range(n)]
    want = sum(xs)
    # allreduce in place on the array's own stream; the result read back after a wait
    d = DeviceArray(xs[r], stream)
    comm.allreduce(d)
    assert np.array_equal(d.get(), want), "allreduce on a device array"
    # async: the stream orders the read-back, no host wait before it
    d2 = DeviceArray(xs[r])
    w = comm.allreduce(d2, op="max", async_op=True, stream=stream)
    _C.device_synchronize(stream)
    w.wait()
    assert np.array_equal(d2.get(), xs[n - 1]), "allreduce max, async on an explicit stream"
    # allgather into a device out=; alltoall; broadcast; send/recv around the ring
    out = DeviceArray(np.zeros((n, 1000), np.float32), stream)
    comm.allgather(DeviceArray(xs[r], stream), out=out)
    assert np.array_equal(out.get(), np.stack(xs)), "allgather to a device array"
    b = DeviceArray(xs[r] if r == 0 else np.zeros(1000, np.float32), stream)
    comm.broadcast(b, root=0)
    assert np.array_equal(b.get(), xs[0]), "broadcast"
    s = DeviceArray(np.full(64, r, np.int64), stream)
    t = DeviceArray(np.zeros(64, np.int64), stream)
    comm.send(s, (r + 1) % n, async_op=True)
    comm.recv(t, (r - 1) % n)
    assert np.array_equal(t.get(), np.full(64, (r - 1) % n, np.int64)), "send/recv"
    # compressed, with error feedback, matches the host path bit for bit
    g = (np.sin(np.arange(5000, dtype=np.float32) * (r + 1))).astype(np.float32)
    host = g.copy()
    comm.allreduce(host, codec="int8")
    dev = DeviceArray(g, stream)
    comm.allreduce(dev, codec="int8")
    assert np.array_equal(dev.get(), host), "int8 all-reduce: device differs from host"
    # mixing host and device buffers is refused before anything moves
    try:
        comm.allreduce(DeviceArray(xs[r], stream), out=np.zeros(1000, np.float32))
        raise AssertionError("a host out= with a device input was accepted")
    except braid.InvalidUsageError as e:
        assert "host memory" in str(e) and "device memory" in str(e), str(e)
    try:
        comm.allgather(DeviceArray(xs[r], stream))
        raise AssertionError("allgather allocated an output for a device array")
    except braid.InvalidUsageError as e:
        assert "out=" in str(e), str(e)
    comm.barrier()
    _C.device_destroy_stream(stream)
    print(f"rank {r}: device arrays ok ({_C.device_runtime()})")


if __name__ == "__main__":
    import ranks_numpy  # the scenario runner every worker shares (beside this file)
    ranks_numpy.main(globals())
