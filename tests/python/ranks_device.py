"""One rank of a device-buffer job (started by braidrun from test_multirank.py with
BRAID_GPU_BACKEND=emulated): device arrays reach braid through __cuda_array_interface__,
as CuPy's and Numba's do, and the calls join the stream the array names; and through
DLPack (__dlpack__/__dlpack_device__ of CUDA memory, as JAX's, CuPy's and torch's), where
braid asks the producer for the stream the call joins.

Usage: ranks_device.py SCENARIO
"""
import ctypes

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


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor)))]
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLPackDeviceArray:
    """A minimal DLPack producer of CUDA memory (device type kDLCUDA) on braid's device
    runtime. It exports a view that starts `offset` elements into its allocation (through
    DLPack's byte_offset), and records the stream each consumer asked for."""

    def __init__(self, host: np.ndarray, offset: int = 0, strides=None):
        padded = np.concatenate([np.zeros(offset, host.dtype), host.reshape(-1)])
        self.ptr = _C.device_alloc(max(padded.nbytes, 1))
        _C.device_copy(self.ptr, padded.ctypes.data, padded.nbytes)
        self.dtype, self.shape, self.offset, self.strides = host.dtype, host.shape, offset, strides
        self.asked = []  # the `stream` of each __dlpack__ call
        self._exports = []  # what each capsule points to, alive as long as this array

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, max_version=None):  # noqa: ARG002 (exports version 0.x capsules)
        self.asked.append(stream)
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        strides = None if self.strides is None else (ctypes.c_int64 * len(self.strides))(*self.strides)
        m = _DLManagedTensor()
        t = m.dl_tensor
        t.data, t.device, t.ndim = self.ptr, _DLDevice(2, 0), len(self.shape)
        code = {"f": 2, "i": 0, "u": 1}[self.dtype.kind]
        t.dtype = _DLDataType(code, self.dtype.itemsize * 8, 1)
        t.shape = shape
        t.strides = strides
        t.byte_offset = self.offset * self.dtype.itemsize
        self._exports.append((m, shape, strides))
        return _capsule_new(ctypes.addressof(m), b"dltensor", None)

    def get(self) -> np.ndarray:
        whole = np.empty(self.offset + int(np.prod(self.shape)), self.dtype)
        _C.device_copy(whole.ctypes.data, self.ptr, whole.nbytes)
        return whole[self.offset:].reshape(self.shape)

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
    # DLPack producers of CUDA memory: the view starts past the allocation's start
    # (byte_offset), and the producer is asked for the stream the call joins (DLPack's 1:
    # the legacy default stream, when the call names none).
    dl = DLPackDeviceArray(xs[r].reshape(10, 100), offset=3)
    comm.allreduce(dl, stream=stream)
    assert np.array_equal(dl.get(), want.reshape(10, 100)), "allreduce on a DLPack device array"
    assert dl.asked == [stream], f"the producer was asked for stream {dl.asked}, not the call's {stream}"
    dl2 = DLPackDeviceArray(np.full(7, r + 1, np.int32))
    comm.allreduce(dl2, op="max")
    assert np.array_equal(dl2.get(), np.full(7, n, np.int32)) and dl2.asked == [1], dl2.asked
    try:
        comm.allreduce(DLPackDeviceArray(np.zeros((4, 5), np.float32), strides=(1, 4)))
        raise AssertionError("a column-major DLPack export was accepted")
    except braid.InvalidUsageError as e:
        assert "not C-contiguous" in str(e), str(e)
    comm.barrier()
    _C.device_destroy_stream(stream)
    print(f"rank {r}: device arrays ok ({_C.device_runtime()})")


class _ForeignDeviceArray:
    """What a GPU user hands braid on a machine where braid has no device runtime: a CUDA
    array (CuPy-, Numba- or torch-shaped) whose address is not host memory. Dereferencing it
    would crash the process; nothing may."""

    @property
    def __cuda_array_interface__(self):
        return {"shape": (256,), "typestr": "<f4", "data": (0xdead0000, False), "version": 3, "strides": None}


class _ForeignDLPackArray:
    """A DLPack producer of CUDA memory on device 0; exporting it must not even be asked for."""

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA

    def __dlpack__(self, stream=None, max_version=None):
        raise AssertionError("braid asked a device array it cannot move for its data")


def refused(comm):
    """BRAID_GPU_BACKEND=none (as a wheel built without CUDA, or a machine without a
    driver): device arrays are refused with the buffer, the memory and the reason, before
    any byte moves, and the communicator still works."""
    r = comm.rank
    assert _C.device_count() == 0, _C.device_runtime()
    for x in (_ForeignDeviceArray(), _ForeignDLPackArray()):
        for call in (lambda: comm.allreduce(x), lambda: comm.broadcast(x), lambda: comm.allreduce(np.zeros(256, np.float32), out=x)):
            try:
                call()
                raise AssertionError(f"a {type(x).__name__} was accepted without a device runtime")
            except braid.UnsupportedError as e:
                msg = str(e)
                assert "device memory" in msg and "no device runtime" in msg and type(x).__name__ in msg, msg
    y = np.full(8, r + 1, np.float32)
    comm.allreduce(y)
    assert np.array_equal(y, np.full(8, comm.size * (comm.size + 1) / 2, np.float32)), y
    print(f"rank {r}: device arrays refused ok ({msg})")


if __name__ == "__main__":
    import ranks_numpy  # the scenario runner every worker shares (beside this file)
    ranks_numpy.main(globals())
