"""braid: collective communication for distributed training.

    import braid, numpy as np
    comm = braid.init()                 # from braidrun, torchrun, mpirun or Slurm variables
    x = np.ones(1024, dtype=np.float32)
    comm.allreduce(x)                   # in place: x now holds the sum over ranks
    w = comm.allreduce(x, op="max", async_op=True)
    w.wait()

Collectives take NumPy arrays, torch CPU tensors, or any object exporting a
contiguous buffer, without copying them: braid reads and writes the caller's memory.
Each buffer must stay alive and untouched until the collective completes (the
Communicator keeps a reference for you). ``import braid.torch`` registers the
torch.distributed backend "braid" (see docs/python.md).
"""

from __future__ import annotations

import atexit
import sys
import threading
import weakref
from typing import Any, BinaryIO, List, Optional, Sequence, Union

import numpy as np

from . import _C
from ._C import (  # noqa: F401  (re-exported)
    AbortedError,
    Algorithm,
    DataType,
    Error,
    FileStore,
    InvalidUsageError,
    NetworkError,
    PrefixStore,
    ReduceOp,
    RemoteError,
    Store,
    TcpStore,
    TcpStoreServer,
    TimeoutError,
    UnsupportedError,
    gpu_status,
)

__version__ = "0.1.0"

__all__ = [
    "init", "Communicator", "Work", "Store", "TcpStore", "FileStore", "PrefixStore",
    "TcpStoreServer", "DataType", "ReduceOp", "Algorithm", "Error", "InvalidUsageError",
    "UnsupportedError", "TimeoutError", "AbortedError", "RemoteError", "NetworkError",
    "CODECS", "gpu_status",
]

#: Codec names accepted by ``allreduce(codec=...)`` (DESIGN.md §6). Whether a codec
#: runs depends on the build: an unsupported one raises UnsupportedError.
#: Codec families, as braid's C++ API and allreduce_bench --codec name them; topk takes a
#: ratio ("topk:0.01") and any codec may carry suffixes such as ":sr" or ":block=128"
#: (docs/codecs.md). "auto" lets the cost model decide.
CODECS = ("none", "fp16", "bf16", "fp8e4m3", "fp8e5m2", "int8", "int4", "sign1", "mxfp8", "mxfp4", "topk:RATIO", "auto")

_NP_DTYPES = {
    np.dtype(np.float32): DataType.f32,
    np.dtype(np.float64): DataType.f64,
    np.dtype(np.float16): DataType.f16,
    np.dtype(np.int8): DataType.i8,
    np.dtype(np.uint8): DataType.u8,
    np.dtype(np.int32): DataType.i32,
    np.dtype(np.int64): DataType.i64,
}
_NP_OF = {v: k for k, v in _NP_DTYPES.items()}
#: NumPy has no fp8 type of its own; ml_dtypes' (what JAX uses) are matched by name.
_NP_DTYPE_NAMES = {"float8_e4m3fn": DataType.f8e4m3, "float8_e5m2": DataType.f8e5m2}
_TORCH_DTYPE_NAMES = {
    "torch.float32": DataType.f32, "torch.float64": DataType.f64,
    "torch.float16": DataType.f16, "torch.bfloat16": DataType.bf16,
    "torch.int8": DataType.i8, "torch.uint8": DataType.u8,
    "torch.int32": DataType.i32, "torch.int64": DataType.i64,
    "torch.float8_e4m3fn": DataType.f8e4m3, "torch.float8_e5m2": DataType.f8e5m2,
}
_OPS = {"sum": ReduceOp.sum, "prod": ReduceOp.prod, "product": ReduceOp.prod,
        "min": ReduceOp.min, "max": ReduceOp.max, "avg": ReduceOp.avg, "mean": ReduceOp.avg,
        "premul_sum": ReduceOp.premul_sum}


def _error(cls: type, code: str, message: str) -> Error:
    """A braid exception raised by the Python side, worded like the library's own."""
    e = cls(f"braid {code}: {message}")
    e.code, e.peer = code, -1
    return e


def _usage(message: str) -> InvalidUsageError:
    return _error(InvalidUsageError, "InvalidUsage", message)


def _timeout(message: str) -> TimeoutError:
    return _error(TimeoutError, "Timeout", message)


def _unsupported(message: str) -> UnsupportedError:
    return _error(UnsupportedError, "Unsupported", message)


class _Buf:
    """Address, element count and dtype of a caller's buffer (no copy); for device buffers
    (CUDA tensors, __cuda_array_interface__ producers) also the stream the call joins."""

    __slots__ = ("obj", "ptr", "count", "dtype", "shape", "device", "stream", "hold")

    def __init__(self, obj: Any, ptr: int, count: int, dtype: DataType, shape: tuple,
                 device: bool = False, stream: int = 0, hold: Any = None):
        self.obj, self.ptr, self.count, self.dtype, self.shape = obj, ptr, count, dtype, shape
        self.device, self.stream = device, stream
        self.hold = hold  # kept alive with the buffer until the call completes (a DLPack capsule)


_CAI_TYPES = {"<f4": DataType.f32, "<f8": DataType.f64, "<f2": DataType.f16, "|i1": DataType.i8,
              "|u1": DataType.u8, "<i4": DataType.i32, "<i8": DataType.i64}


def _cuda_array(x: Any, what: str, writable: bool) -> _Buf:
    """A __cuda_array_interface__ producer (CuPy, Numba, ...): device memory, C-contiguous.
    The call joins the producer's stream when it names one (version 3), else the default stream."""
    cai = x.__cuda_array_interface__
    shape = tuple(cai["shape"])
    typestr = cai["typestr"].replace("=", "<")
    dt = _CAI_TYPES.get(typestr)
    if dt is None:
        raise _usage(f"{what} has type {cai['typestr']} (__cuda_array_interface__), which braid does not reduce; "
                     "use one of " + ", ".join(_CAI_TYPES))
    count = 1
    for d in shape:
        count *= int(d)
    strides = cai.get("strides")
    if strides is not None and count > 1:
        item = int(typestr[2:])
        want, acc = [], item
        for d in reversed(shape):
            want.append(acc)
            acc *= int(d)
        if tuple(reversed(want)) != tuple(strides):
            raise _usage(f"{what} is not C-contiguous (strides {tuple(strides)} for shape {shape}); "
                         "pass a contiguous copy and copy the result back")
    ptr, read_only = cai["data"]
    if writable and read_only:
        raise _usage(f"{what} is read-only but braid writes the result into it; pass a writable array or out=")
    stream = cai.get("stream") or 0
    if stream == 1:  # the legacy default stream
        stream = 0
    return _Buf(x, int(ptr), count, dt, shape, device=True, stream=int(stream))


#: DLPack device types whose memory braid's device runtime takes (kDLCUDA, kDLCUDAManaged).
_DLPACK_CUDA = (2, 13)
#: DLPack (code, bits) -> braid type; lanes must be 1.
_DLPACK_TYPES = {(2, 32): DataType.f32, (2, 64): DataType.f64, (2, 16): DataType.f16, (4, 16): DataType.bf16,
                 (0, 8): DataType.i8, (1, 8): DataType.u8, (0, 32): DataType.i32, (0, 64): DataType.i64,
                 (10, 8): DataType.f8e4m3, (12, 8): DataType.f8e5m2}  # kDLFloat8_e4m3fn, kDLFloat8_e5m2


def _dlpack_device_buffer(x: Any, what: str, writable: bool, stream: Optional[int]) -> _Buf:
    """A DLPack producer of CUDA memory (JAX, CuPy, torch, ...): device memory, C-contiguous.
    The producer is asked to make its data ready on the stream the call joins (the DLPack
    protocol's `stream`: the one given, else the legacy default stream)."""
    dl_stream = int(stream) if stream else 1  # DLPack: 1 is CUDA's legacy default stream
    try:
        cap = x.__dlpack__(stream=dl_stream, max_version=(1, 0))
    except TypeError:  # a producer of the protocol before max_version
        cap = x.__dlpack__(stream=dl_stream)
    v = _C.dlpack_view(cap)
    dt = _DLPACK_TYPES.get((v["code"], v["bits"])) if v["lanes"] == 1 else None
    if dt is None:
        raise _usage(f"{what} has DLPack type code {v['code']}, {v['bits']} bits x {v['lanes']} lanes, which braid "
                     "does not reduce; use float16/32/64, bfloat16, float8_e4m3fn, float8_e5m2, int8/32/64 or uint8")
    shape = tuple(int(d) for d in v["shape"])
    count = 1
    for d in shape:
        count *= d
    strides = v["strides"]  # in elements; dimensions of extent 1 may carry any stride
    if strides is not None and count > 1:
        acc = 1
        for d, k in reversed(list(zip(shape, strides))):
            if d != 1 and int(k) != acc:
                raise _usage(f"{what} is not C-contiguous (DLPack strides {tuple(strides)} for shape {shape}); "
                             "pass a contiguous copy and copy the result back")
            acc *= d
    if writable and v["read_only"]:
        raise _usage(f"{what} is read-only (DLPack) but braid writes the result into it; pass a writable array or out=")
    return _Buf(x, int(v["ptr"]), count, dt, shape, device=True, stream=int(stream or 0), hold=cap)


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _require_device_runtime(what: str, where: str, index: Optional[int] = None) -> None:
    """Refuses a device buffer this process cannot move, before any byte moves: with no
    device runtime (a build without CUDA, no driver, a driver too old) its address would be
    taken for host memory and read (a crash). `where` names the memory for the message."""
    count = _C.device_count()
    if count == 0:
        raise _unsupported(f"{what} is device memory ({where}), but this process has no device runtime to move it: "
                           f"{_C.device_runtime()}. Use a braid built with CUDA (pip install . where nvcc is "
                           "installed, docs/python.md) or pass host memory")
    if index is not None and not 0 <= index < count:
        raise _unsupported(f"{what} is on device {index} ({where}), but the device runtime has {count} device(s): "
                           f"{_C.device_runtime()}")


def _buffer(x: Any, what: str, writable: bool, stream: Optional[int] = None) -> _Buf:
    if _is_torch(x):
        if x.device.type not in ("cpu", "cuda"):
            raise _unsupported(f"{what} is a {x.device.type} tensor; braid takes CPU and CUDA tensors")
        dt = _TORCH_DTYPE_NAMES.get(str(x.dtype))
        if dt is None:
            raise _usage(f"{what} has dtype {x.dtype}, which braid does not reduce; use one of "
                         + ", ".join(_TORCH_DTYPE_NAMES))
        if not x.is_contiguous():
            raise _usage(f"{what} is not contiguous (strides {tuple(x.stride())} for shape {tuple(x.shape)}); "
                         "pass x.contiguous() and copy the result back")
        if x.device.type == "cuda":
            import torch
            _require_device_runtime(what, f"torch tensor on {x.device}", x.device.index)
            # The call joins the tensor's current stream, as torch's NCCL backend does.
            return _Buf(x, x.data_ptr(), x.numel(), dt, tuple(x.shape), device=True,
                        stream=int(torch.cuda.current_stream(x.device).cuda_stream))
        return _Buf(x, x.data_ptr(), x.numel(), dt, tuple(x.shape))
    if hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray):
        _require_device_runtime(what, f"a {type(x).__name__} exposing __cuda_array_interface__")
        return _cuda_array(x, what, writable)
    if hasattr(x, "__dlpack_device__") and not isinstance(x, np.ndarray):
        dev_type, dev_id = x.__dlpack_device__()
        if int(dev_type) in _DLPACK_CUDA:
            _require_device_runtime(what, f"a {type(x).__name__} of DLPack device type {int(dev_type)}",
                                    int(dev_id))
            return _dlpack_device_buffer(x, what, writable, stream)
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(memoryview(x))  # zero-copy view of any buffer-protocol object
        except TypeError:
            if not hasattr(x, "__dlpack__"):
                raise _usage(f"{what} of type {type(x).__name__} is neither a NumPy array, a torch tensor, "
                             "nor an object with the buffer protocol or DLPack") from None
            try:
                x = np.from_dlpack(x)  # zero-copy view of a CPU DLPack producer
            except (TypeError, BufferError, RuntimeError) as e:
                raise _usage(f"{what} of type {type(x).__name__} exports DLPack but not host memory "
                             f"NumPy can view ({e}); copy it to the CPU first") from None
    dt = _NP_DTYPES.get(x.dtype)
    if dt is None:
        dt = _NP_DTYPE_NAMES.get(x.dtype.name)
    if dt is None:
        raise _usage(f"{what} has dtype {x.dtype}, which braid does not reduce; use one of "
                     + ", ".join([str(d) for d in _NP_DTYPES] + list(_NP_DTYPE_NAMES)) + " (native byte order)")
    if not x.flags.c_contiguous:
        raise _usage(f"{what} is not C-contiguous (strides {x.strides} for shape {x.shape}); "
                     "pass np.ascontiguousarray(x) and copy the result back")
    if writable and not x.flags.writeable:
        raise _usage(f"{what} is read-only but braid writes the result into it; pass a writable array or out=")
    return _Buf(x, x.ctypes.data, x.size, dt, x.shape)


def _empty_like(b: _Buf, count: int, shape: Optional[tuple] = None) -> Any:
    shape = shape if shape is not None else (count,)
    if _is_torch(b.obj):
        import torch
        return torch.empty(shape, dtype=b.obj.dtype, device=b.obj.device)
    if b.device:
        raise _usage("braid cannot allocate an output for a __cuda_array_interface__ or DLPack device array; pass out=")
    return np.empty(shape, dtype=b.obj.dtype)


def _stream(stream: Optional[int], *bufs: _Buf) -> int:
    """The stream a call joins: the one given, else the first device buffer's (0 for host)."""
    if stream is not None:
        return int(stream)
    for b in bufs:
        if b.device:
            return b.stream
    return 0


def _op(op: Union[str, ReduceOp]) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    r = _OPS.get(str(op).lower())
    if r is None:
        raise _usage(f"unknown reduction {op!r}; use one of sum, prod, min, max, avg, premul_sum")
    return r


def _algorithm(a: Union[None, str, Algorithm]) -> Algorithm:
    if a is None:
        return Algorithm.auto
    if isinstance(a, Algorithm):
        return a
    r = _C.parse_algorithm(str(a))
    if r is None:
        raise _usage(f"unknown algorithm {a!r}; use auto, ring, tree, rhd or hierarchical")
    return r


def _same_dtype(a: _Buf, b: _Buf, what: str) -> None:
    if a.dtype != b.dtype:
        raise _usage(f"{what}: input is {a.dtype.name} but output is {b.dtype.name}; both must have one dtype")


class Work:
    """Handle to a posted collective: ``wait()``, ``test()``, ``exception()``, ``result()``.

    Holds the collective's buffers until it completes, so the caller may drop them.
    """

    __slots__ = ("_w", "_keep", "_result", "_then", "__weakref__")

    def __init__(self, w: _C.Work, keep: tuple, result: Any, then=None):
        self._w, self._keep, self._result, self._then = w, keep, result, then

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until done (at most `timeout` seconds; returns False if still running).
        Raises the collective's braid error if it failed. Releases the GIL."""
        if timeout is None:
            # In slices, so that Python runs signal handlers (Ctrl-C) between them; each
            # slice waits without the GIL and returns as soon as the work completes.
            while not self._w.wait(0.25):
                pass
            done = True
        else:
            done = self._w.wait(timeout)
        if done and self._then is not None:
            then, self._then = self._then, None
            then()
        return done

    def test(self) -> bool:
        """True once completed, successfully or not; never blocks, never raises."""
        return self._w.test()

    def is_completed(self) -> bool:
        """Alias of test() (torch.distributed's spelling)."""
        return self._w.test()

    def exception(self) -> Optional[BaseException]:
        """The failure as a braid exception, once completed unsuccessfully; else None."""
        return self._w.exception()

    def result(self) -> Any:
        """Waits, then returns the output buffer."""
        self.wait()
        return self._result

    def on_complete(self, callback) -> None:
        """Calls ``callback(work)`` once the collective completes, successfully or not
        (``work.exception()`` tells; ``work.result()`` returns at once), like torch's
        ``Future.then``. It runs with the GIL on the thread that completes the work (braid's
        progress thread, or at once on this thread if already done); it may post
        collectives but must not wait for one. What it raises is reported as unraisable."""
        self._w.on_complete(lambda _error: callback(self))


_live_comms: "weakref.WeakSet[Communicator]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # communicators must go before the interpreter does
    for c in list(_live_comms):
        c.close()


class Communicator:
    """A fixed group of ranks running collectives together (see include/braid/communicator.hpp).

    Construct with ``braid.init()`` (from the environment), ``Communicator(store, rank, size)``,
    or ``Communicator.from_unique_id(...)``. Collectives run in issue order, which must be the
    same on every rank. Each returns the output buffer, or a Work with ``async_op=True``.
    Options: ``timeout`` in seconds (None = the communicator's, BRAID_TIMEOUT);
    ``transport``: "" (BRAID_TRANSPORT), "auto", or one transport for every pair ("shm",
    "tcp", "ucx": ``braid_info`` lists this build's); ``device``: the GPU whose buffers it
    takes (-1: the current device at creation).
    """

    def __init__(self, store: Optional[Store], rank: int, size: int, *, timeout: Optional[float] = None,
                 name: str = "", chunk_bytes: int = 0, host_id: str = "", transport: str = "", device: int = -1,
                 _impl: Any = None):
        self._store = store  # a Python store must outlive the communicator
        if _impl is None:
            if store is None:
                raise _usage("Communicator(store, rank, size) needs a store; or use braid.init()")
            _impl = _C.Communicator(store, rank, size, timeout, name, chunk_bytes, host_id, transport, device)
        self._c = _impl
        self._inflight: list = []
        self._lock = threading.Lock()
        _live_comms.add(self)

    # --- construction -----------------------------------------------------------
    @classmethod
    def from_env(cls, *, timeout: Optional[float] = None, name: str = "", chunk_bytes: int = 0,
                 host_id: str = "", transport: str = "", device: int = -1) -> "Communicator":
        """Joins the job described by BRAID_*, torchrun, Open MPI or Slurm variables."""
        return cls(None, 0, 0, _impl=_C.Communicator.from_env(timeout, name, chunk_bytes, host_id, transport, device))

    @classmethod
    def join(cls, store: Store, rank: int, size: int, *, timeout: Optional[float] = None, name: str = "",
             chunk_bytes: int = 0, host_id: str = "", transport: str = "", device: int = -1) -> "Communicator":
        """A newcomer's side of grow(): joins, as `rank` of `size`, the communicator a job named
        `name` (default "braid") is growing on `store` (docs/reliability.md, "Grow")."""
        return cls(store, 0, 0, _impl=_C.Communicator.join(store, rank, size, timeout, name, chunk_bytes, host_id,
                                                           transport, device))

    @staticmethod
    def create_unique_id() -> bytes:
        """A 128-byte id; hand it to every rank (see from_unique_id)."""
        return _C.Communicator.create_unique_id()

    @classmethod
    def from_unique_id(cls, uid: bytes, rank: int, size: int, *, timeout: Optional[float] = None,
                       name: str = "", transport: str = "", device: int = -1) -> "Communicator":
        return cls(None, 0, 0, _impl=_C.Communicator.from_unique_id(uid, rank, size, timeout, name, transport, device))

    # --- properties -------------------------------------------------------------
    @property
    def _impl(self):
        if self._c is None:
            raise _usage("the communicator is closed; create a new one")
        return self._c

    @property
    def rank(self) -> int:
        return self._impl.rank

    @property
    def size(self) -> int:
        return self._impl.size

    @property
    def local_rank(self) -> int:
        return self._impl.local_rank

    @property
    def local_size(self) -> int:
        return self._impl.local_size

    def failed(self) -> bool:
        return self._c is None or self._c.failed()

    def describe_topology(self) -> str:
        return self._impl.describe_topology()

    def link_between_hosts(self) -> dict:
        """The link between hosts as codec auto measures it (docs/codecs.md, "Measured links"):
        {"measured", "ranks", "latency_us", "bandwidth_gbps"}. Collective on its first call
        (every rank calls it, or the first auto all-reduce across hosts did); measured is
        False when every rank is on one host."""
        return self._impl.link_between_hosts()

    def dump_trace(self) -> dict:
        """The flight recorder's dump of this rank (docs/observability.md): the last operations,
        then what is running, with each peer's progress, and what is queued. Also written into
        BRAID_TRACE_DIR when set; `braid_trace DIR` merges the ranks' files into a report."""
        import json
        return json.loads(self._impl.dump_trace())

    def metrics(self) -> dict:
        """This rank's counters since the communicator was made (docs/observability.md): under
        "operations", per collective, algorithm and codec, the calls, errors, bytes, bytes sent,
        seconds and a time histogram (bucket k: calls of at most 2**k microseconds); under
        "prometheus", the same in Prometheus' text format."""
        return self._impl.metrics()

    def explain_allreduce(self, x: Any, op: Union[str, ReduceOp] = "sum", *, deterministic: bool = False) -> str:
        """The algorithm an all-reduce of `x`'s size and type runs, and why: the cost model's
        prices and, once a call of this size has run, the measured trial times and verdict."""
        b = _buffer(x, "explain_allreduce input", writable=False)
        return self._impl.explain_allreduce(b.count, b.dtype, _op(op), deterministic)

    def __repr__(self) -> str:
        if self._c is None:
            return "<braid.Communicator closed>"
        return f"<braid.Communicator rank {self.rank} of {self.size}>"

    # --- bookkeeping ------------------------------------------------------------
    def _post(self, w: _C.Work, keep: tuple, result: Any, async_op: bool, then=None):
        work = Work(w, keep, result, then)
        if async_op:
            with self._lock:  # keep buffers alive even if the caller drops the Work
                self._inflight = [x for x in self._inflight if not x.test()]
                self._inflight.append(work)
            return work
        work.wait()
        return result

    # --- collectives ------------------------------------------------------------
    def allreduce(self, x: Any, out: Any = None, op: Union[str, ReduceOp] = "sum", *, async_op: bool = False,
                  algorithm: Union[None, str, Algorithm] = None, codec: Optional[str] = None,
                  ef_key: Optional[str] = None, deterministic: bool = False, timeout: Optional[float] = None,
                  stream: Optional[int] = None, scale: float = 1.0):
        """Reduces `x` over ranks, in place by default (into `out` if given).

        op="premul_sum" sums scale * x (every rank multiplies its input by `scale` first,
        as NCCL's ncclRedOpCreatePreMulSum and torch's PREMUL_SUM).

        `codec` compresses inside the collective ("none", "fp16", "int8", "sign1", "topk:0.01", ...);
        biased codecs (sign1, topk) need an `ef_key`, the name of the error-feedback residual
        the library keeps for this buffer (one per gradient bucket)."""
        b = _buffer(x, "allreduce input", writable=out is None, stream=stream)
        o = b if out is None else _buffer(out, "allreduce output", writable=True, stream=stream)
        _same_dtype(b, o, "allreduce")
        if o.count != b.count:
            raise _usage(f"allreduce: input has {b.count} elements but output has {o.count}; they must match")
        w = self._impl.allreduce(b.ptr, o.ptr, b.count, b.dtype, _op(op), timeout, _algorithm(algorithm),
                                 codec or "", ef_key or "", deterministic, _stream(stream, b, o), float(scale))
        return self._post(w, (b, o), o.obj, async_op)

    def broadcast(self, x: Any, root: int = 0, *, async_op: bool = False, timeout: Optional[float] = None,
                  stream: Optional[int] = None):
        """Copies root's `x` into every rank's `x` (in place)."""
        b = _buffer(x, "broadcast buffer", writable=True, stream=stream)
        w = self._impl.broadcast(b.ptr, b.ptr, b.count, b.dtype, root, timeout, _stream(stream, b))
        return self._post(w, (b,), b.obj, async_op)

    def reduce(self, x: Any, root: int = 0, op: Union[str, ReduceOp] = "sum", out: Any = None, *,
               async_op: bool = False, deterministic: bool = False, timeout: Optional[float] = None,
               stream: Optional[int] = None, scale: float = 1.0):
        """Reduces every rank's `x` into root's `out` (default: root's `x`, in place);
        `scale` is op="premul_sum"'s factor."""
        b = _buffer(x, "reduce input", writable=out is None, stream=stream)
        o = b if out is None else _buffer(out, "reduce output", writable=True, stream=stream)
        _same_dtype(b, o, "reduce")
        if o.count != b.count:
            raise _usage(f"reduce: input has {b.count} elements but output has {o.count}; they must match")
        w = self._impl.reduce(b.ptr, o.ptr, b.count, b.dtype, _op(op), root, timeout, deterministic,
                              _stream(stream, b, o), float(scale))
        return self._post(w, (b, o), o.obj, async_op)

    def allgather(self, x: Any, out: Any = None, *, async_op: bool = False, timeout: Optional[float] = None,
                  stream: Optional[int] = None):
        """Gathers every rank's `x` into `out` of size × len(x) elements, in rank order
        (allocated with shape (size, *x.shape) if not given)."""
        b = _buffer(x, "allgather input", writable=False, stream=stream)
        n = self.size
        if out is None:
            out = _empty_like(b, n * b.count, (n,) + tuple(b.shape))
        o = _buffer(out, "allgather output", writable=True, stream=stream)
        _same_dtype(b, o, "allgather")
        if o.count != n * b.count:
            raise _usage(f"allgather: output has {o.count} elements but needs size*count = {n}*{b.count} = "
                         f"{n * b.count}")
        w = self._impl.allgather(b.ptr, o.ptr, b.count, b.dtype, timeout, _stream(stream, b, o))
        return self._post(w, (b, o), o.obj, async_op)

    def reduce_scatter(self, x: Any, out: Any = None, op: Union[str, ReduceOp] = "sum", *,
                       async_op: bool = False, deterministic: bool = False, timeout: Optional[float] = None,
                       stream: Optional[int] = None, scale: float = 1.0):
        """Reduces `x` (size × count elements) over ranks and leaves block `rank` in `out`
        (count elements; allocated with shape x.shape[1:] when x.shape[0] == size); `scale`
        is op="premul_sum"'s factor."""
        b = _buffer(x, "reduce_scatter input", writable=False, stream=stream)
        n = self.size
        if b.count % n:
            raise _usage(f"reduce_scatter: input has {b.count} elements, not a multiple of the world size {n}")
        count = b.count // n
        if out is None:
            shape = tuple(b.shape[1:]) if len(b.shape) > 1 and b.shape[0] == n else (count,)
            out = _empty_like(b, count, shape)
        o = _buffer(out, "reduce_scatter output", writable=True, stream=stream)
        _same_dtype(b, o, "reduce_scatter")
        if o.count != count:
            raise _usage(f"reduce_scatter: output has {o.count} elements but input/size = {count}")
        w = self._impl.reduce_scatter(b.ptr, o.ptr, count, b.dtype, _op(op), timeout, deterministic,
                                      _stream(stream, b, o), float(scale))
        return self._post(w, (b, o), o.obj, async_op)

    def alltoall(self, x: Any, out: Any = None, *, async_op: bool = False, timeout: Optional[float] = None,
                  stream: Optional[int] = None):
        """Sends block j of `x` (size equal blocks) to rank j; block j of `out` comes from rank j.
        `out` defaults to a new buffer shaped like `x`."""
        b = _buffer(x, "alltoall input", writable=False, stream=stream)
        n = self.size
        if b.count % n:
            raise _usage(f"alltoall: input has {b.count} elements, not a multiple of the world size {n}")
        if out is None:
            out = _empty_like(b, b.count, tuple(b.shape))
        o = _buffer(out, "alltoall output", writable=True, stream=stream)
        _same_dtype(b, o, "alltoall")
        if o.count != b.count:
            raise _usage(f"alltoall: input has {b.count} elements but output has {o.count}; they must match")
        w = self._impl.alltoall(b.ptr, o.ptr, b.count // n, b.dtype, timeout, _stream(stream, b, o))
        return self._post(w, (b, o), o.obj, async_op)

    def _counts(self, counts: Sequence[int], what: str) -> List[int]:
        c = [int(x) for x in counts]
        if len(c) != self.size or any(x < 0 for x in c):
            raise _usage(f"{what}: needs {self.size} non-negative block counts (one per rank), got {list(counts)}")
        return c

    def allgatherv(self, x: Any, counts: Sequence[int], out: Any = None, *, async_op: bool = False,
                   timeout: Optional[float] = None, stream: Optional[int] = None):
        """All-gather of blocks of their own sizes: rank j contributes counts[j] elements (`x`
        here, counts[rank] of them), and `out` (sum(counts) elements, allocated if not given)
        gets every block back to back in rank order. The same counts on every rank."""
        c = self._counts(counts, "allgatherv")
        b = _buffer(x, "allgatherv input", writable=False, stream=stream)
        if b.count != c[self.rank]:
            raise _usage(f"allgatherv: input has {b.count} elements but counts[{self.rank}] is {c[self.rank]}")
        if out is None:
            out = _empty_like(b, sum(c))
        o = _buffer(out, "allgatherv output", writable=True, stream=stream)
        _same_dtype(b, o, "allgatherv")
        if o.count != sum(c):
            raise _usage(f"allgatherv: output has {o.count} elements but the counts sum to {sum(c)}")
        w = self._impl.allgatherv(b.ptr, o.ptr, c, b.dtype, timeout, _stream(stream, b, o))
        return self._post(w, (b, o), o.obj, async_op)

    def reduce_scatter_v(self, x: Any, counts: Sequence[int], out: Any = None, op: Union[str, ReduceOp] = "sum", *,
                         async_op: bool = False, timeout: Optional[float] = None, stream: Optional[int] = None,
                         scale: float = 1.0):
        """Reduce-scatter into blocks of their own sizes: `x` holds sum(counts) elements, and
        `out` (counts[rank] elements, allocated if not given) gets this rank's block reduced
        over all ranks. The same counts on every rank; `scale` is op="premul_sum"'s factor."""
        c = self._counts(counts, "reduce_scatter_v")
        b = _buffer(x, "reduce_scatter_v input", writable=False, stream=stream)
        if b.count != sum(c):
            raise _usage(f"reduce_scatter_v: input has {b.count} elements but the counts sum to {sum(c)}")
        if out is None:
            out = _empty_like(b, c[self.rank])
        o = _buffer(out, "reduce_scatter_v output", writable=True, stream=stream)
        _same_dtype(b, o, "reduce_scatter_v")
        if o.count != c[self.rank]:
            raise _usage(f"reduce_scatter_v: output has {o.count} elements but counts[{self.rank}] is {c[self.rank]}")
        w = self._impl.reduce_scatter_v(b.ptr, o.ptr, c, b.dtype, _op(op), timeout, _stream(stream, b, o),
                                        float(scale))
        return self._post(w, (b, o), o.obj, async_op)

    def alltoallv(self, x: Any, send_counts: Sequence[int], recv_counts: Sequence[int], out: Any = None, *,
                  async_op: bool = False, timeout: Optional[float] = None, stream: Optional[int] = None):
        """All-to-all of blocks of their own sizes (MPI_Alltoallv, back to back): block j of `x`
        (send_counts[j] elements) goes to rank j; block j of `out` (recv_counts[j] elements,
        allocated if not given) comes from rank j, whose send_counts[rank] must match."""
        sc, rc = self._counts(send_counts, "alltoallv"), self._counts(recv_counts, "alltoallv")
        b = _buffer(x, "alltoallv input", writable=False, stream=stream)
        if b.count != sum(sc):
            raise _usage(f"alltoallv: input has {b.count} elements but send_counts sum to {sum(sc)}")
        if out is None:
            out = _empty_like(b, sum(rc))
        o = _buffer(out, "alltoallv output", writable=True, stream=stream)
        _same_dtype(b, o, "alltoallv")
        if o.count != sum(rc):
            raise _usage(f"alltoallv: output has {o.count} elements but recv_counts sum to {sum(rc)}")
        w = self._impl.alltoallv(b.ptr, sc, o.ptr, rc, b.dtype, timeout, _stream(stream, b, o))
        return self._post(w, (b, o), o.obj, async_op)

    def gather(self, x: Any, out: Any = None, root: int = 0, *, async_op: bool = False,
               timeout: Optional[float] = None, stream: Optional[int] = None):
        """Gathers every rank's `x` into the root's `out` (size × len(x) elements, rank order;
        allocated with shape (size, *x.shape) on the root if not given). Other ranks pass no
        `out` and get None."""
        b = _buffer(x, "gather input", writable=False, stream=stream)
        n = self.size
        o = None
        if self.rank == root:
            if out is None:
                out = _empty_like(b, n * b.count, (n,) + tuple(b.shape))
            o = _buffer(out, "gather output", writable=True, stream=stream)
            _same_dtype(b, o, "gather")
            if o.count != n * b.count:
                raise _usage(f"gather: output has {o.count} elements but needs size*count = {n}*{b.count} = "
                             f"{n * b.count}")
        bufs = (b, o) if o else (b,)
        w = self._impl.gather(b.ptr, o.ptr if o else 0, b.count, b.dtype, root, timeout, _stream(stream, *bufs))
        return self._post(w, bufs, o.obj if o else None, async_op)

    def scatter(self, x: Any, out: Any, root: int = 0, *, async_op: bool = False,
                timeout: Optional[float] = None, stream: Optional[int] = None):
        """Sends block j of the root's `x` (size equal blocks) to rank j's `out`. `x` is read
        only on the root (pass None elsewhere)."""
        o = _buffer(out, "scatter output", writable=True, stream=stream)
        b = None
        if self.rank == root:
            b = _buffer(x, "scatter input", writable=False, stream=stream)
            _same_dtype(b, o, "scatter")
            if b.count != self.size * o.count:
                raise _usage(f"scatter: input has {b.count} elements but needs size*count = {self.size}*{o.count} = "
                             f"{self.size * o.count}")
        bufs = (b, o) if b else (o,)
        w = self._impl.scatter(b.ptr if b else 0, o.ptr, o.count, o.dtype, root, timeout, _stream(stream, *bufs))
        return self._post(w, bufs, o.obj, async_op)

    def send(self, x: Any, peer: int, tag: int = 0, *, async_op: bool = False, timeout: Optional[float] = None,
                  stream: Optional[int] = None):
        """Sends `x` to `peer`; matched in order by the peer's recv with the same tag."""
        b = _buffer(x, "send buffer", writable=False, stream=stream)
        w = self._impl.send(b.ptr, b.count, b.dtype, peer, tag, timeout, _stream(stream, b))
        return self._post(w, (b,), None, async_op)

    def recv(self, x: Any, peer: int, tag: int = 0, *, async_op: bool = False, timeout: Optional[float] = None,
                  stream: Optional[int] = None):
        """Receives exactly len(x) elements from `peer` into `x`."""
        b = _buffer(x, "recv buffer", writable=True, stream=stream)
        w = self._impl.recv(b.ptr, b.count, b.dtype, peer, tag, timeout, _stream(stream, b))
        return self._post(w, (b,), b.obj, async_op)

    def barrier(self, *, async_op: bool = False, timeout: Optional[float] = None):
        """Completes once every rank has entered it."""
        return self._post(self._impl.barrier(timeout), (), None, async_op)

    def split(self, color: int, key: int = 0) -> "Communicator":
        """Sub-communicators by `color`, ranks ordered by `key` (collective: every rank calls it)."""
        return Communicator(self._store, 0, 0, _impl=self._impl.split(color, key))

    def shrink(self, exclude: Sequence[int] = ()) -> "Communicator":
        """The communicator of the ranks still alive, renumbered in their old order, after a
        failure (or without the ranks in `exclude`). Every surviving rank calls it; they agree
        through the store on who is left (docs/reliability.md, "Shrink"). This one stays as it
        is. Raises AbortedError on a rank the others left out."""
        return Communicator(self._store, 0, 0, _impl=self._impl.shrink(list(exclude)))

    def grow(self, new_size: int) -> "Communicator":
        """A communicator of `new_size` ranks: these keep their ranks, newcomers calling
        Communicator.join() take the rest. Every rank of this one calls it."""
        return Communicator(self._store, 0, 0, _impl=self._impl.grow(new_size))

    # --- error feedback (docs/codecs.md) ----------------------------------------
    def save_error_feedback(self, file: Optional[BinaryIO] = None, *, key_prefix: str = "") -> Optional[bytes]:
        """This rank's error-feedback residuals as a checkpoint (docs/codecs.md format).

        Every ef_key, or with `key_prefix` only the keys that start with it, written
        without the prefix. Returns the bytes, or writes them to the binary `file` and
        returns None. Call between collectives (not while a compressed all-reduce runs).
        """
        data = self._impl.save_error_feedback(key_prefix)
        if file is None:
            return data
        file.write(data)
        return None

    def restore_error_feedback(self, data: Union[bytes, bytearray, memoryview, BinaryIO], *,
                               key_prefix: str = "") -> None:
        """Replaces this rank's residuals with a checkpoint from save_error_feedback().

        `data` is the bytes or a binary file to read them from. With `key_prefix`, only the
        keys under the prefix are replaced (the checkpoint's keys are put under it). A
        damaged checkpoint raises InvalidUsageError and changes nothing.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            data = data.read()
        self._impl.restore_error_feedback(bytes(data), key_prefix)

    def reset_error_feedback(self, ef_key: str = "") -> None:
        """Forgets the residuals of `ef_key` (all of them when empty): its next call starts from zero."""
        self._impl.reset_error_feedback(ef_key)

    def error_feedback_bytes(self) -> int:
        """Bytes of error-feedback residuals this rank holds."""
        return self._impl.error_feedback_bytes()

    # --- teardown ---------------------------------------------------------------
    def abort(self) -> None:
        """Fails every outstanding and later operation with AbortedError (any thread)."""
        if self._c is not None:
            self._c.abort()

    def revoke(self) -> None:
        """abort() for every rank: the peers' pending and later calls fail too, naming this
        rank's revoke; the ranks then shrink() (any thread)."""
        if self._c is not None:
            self._c.revoke()

    def close(self) -> None:
        """Waits for outstanding work (up to its deadlines) and releases the communicator."""
        c, self._c = self._c, None
        if c is not None:
            c.close()
        self._inflight = []

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class _TorchStore(Store):
    """A torch.distributed Store seen as a braid Store (set-up only; calls may come from
    the communicator's progress thread, which takes the GIL for them)."""

    def __init__(self, store: Any):
        super().__init__()
        self._s = store

    def set(self, key, value):
        self._s.set(key, value)

    def get(self, key, timeout):
        from datetime import timedelta
        self._s.wait([key], timedelta(seconds=timeout))
        return self._s.get(key)

    def add(self, key, delta):
        return self._s.add(key, delta)

    def check(self, keys):
        return self._s.check(list(keys))

    def wait(self, keys, timeout):
        from datetime import timedelta
        self._s.wait(list(keys), timedelta(seconds=timeout))

    def remove(self, key):
        return self._s.delete_key(key)

    def compare_set(self, key, expected, desired):
        return self._s.compare_set(key, expected, desired)


def _launcher_store(timeout: float = 60.0) -> "TcpStore":
    """A client of the store the launcher (braidrun) serves and announces in the environment
    (address, port, the job's token): a store that outlives every rank."""
    env = _C.launch_environment()  # the library's reading of the variables, same precedence
    if not env["master_port"]:
        raise _usage("no launcher store in the environment (BRAID_MASTER_ADDR/BRAID_MASTER_PORT): run under braidrun")
    return TcpStore(env["master_addr"] or "127.0.0.1", env["master_port"], False, timeout, env["auth_token"])


def _torchrun_store(timeout: Optional[float]):
    """Under torchrun, MASTER_ADDR:MASTER_PORT is torch's own store (the elastic agent's),
    which braid's store protocol cannot use; talk to it through torch instead. Returns
    (store, rank, world size), or None when not under torchrun's agent."""
    env = _C.launch_environment()  # the library's reading of the variables, same precedence
    if not env["torch_agent_store"] or env["launcher"] == "braid":
        return None
    from datetime import timedelta

    import torch.distributed as dist
    t = dist.TCPStore(env["master_addr"], env["master_port"], env["world_size"], False,
                      timeout=timedelta(seconds=timeout or 300))
    return dist.PrefixStore("braid", t), env["rank"], env["world_size"]


def init(*, timeout: Optional[float] = None, name: str = "", chunk_bytes: int = 0, transport: str = "",
         device: int = -1) -> Communicator:
    """The communicator of this job, from the environment: braidrun's BRAID_* variables,
    torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, Open MPI's OMPI_COMM_WORLD_*,
    or Slurm's SLURM_*. A process started without a launcher (none of them set) is a job of
    one rank with a private store, so scripts also run stand-alone. ``transport`` and
    ``device`` as for Communicator."""
    opts = dict(timeout=timeout, name=name, chunk_bytes=chunk_bytes, transport=transport, device=device)
    torchrun = _torchrun_store(timeout)
    if torchrun is not None:
        ts, rank, size = torchrun
        return Communicator(_TorchStore(ts), rank, size, **opts)
    try:
        return Communicator.from_env(**opts)
    except InvalidUsageError as e:
        if "no rank/world size in the environment" not in str(e):
            raise
    store = TcpStore("127.0.0.1", 0, is_server=True)
    return Communicator(store, 0, 1, **opts)
