"""torch.distributed integration: the "braid" backend and DDP communication hooks.

    import torch.distributed as dist
    import braid.torch                               # registers backend "braid"
    dist.init_process_group("braid")                 # under torchrun (env://)
    dist.init_process_group("braid", init_method="braid://")   # under braidrun
    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(None, braid.torch.compression_hook(codec="int8"))

The backend is a torch ProcessGroup written in Python over braid's Communicator.
Each call posts braid collectives at once (issue order is the call order) and returns
a torch Work wrapping a torch Future; braid reports finished Works through a completion
queue (Work.on_complete underneath), and Python threads of the group finish copies and
complete the futures, so DDP overlaps communication with backward as it does on gloo.

braidrun serves braid's own store at MASTER_ADDR:MASTER_PORT, which torch's env://
rendezvous cannot use; the "braid://" rendezvous registered here hands torch that store
(a torch Store over braid's client, under a prefix per rendezvous), so the job's store
lives in the launcher and survives any rank, rank 0 included.
"""

from __future__ import annotations

import atexit
import math
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch.futures import Future

import braid as _braid
from braid import _C

__all__ = ["BraidProcessGroup", "CompressionHookState", "compression_hook", "powersgd_hook", "init_process_group",
           "get_communicator", "monitored_barrier"]

_RED = (  # torch hands a ReduceOp object that compares equal to these, but hashes apart
    (dist.ReduceOp.SUM, _C.ReduceOp.sum),
    (dist.ReduceOp.PRODUCT, _C.ReduceOp.prod),
    (dist.ReduceOp.MIN, _C.ReduceOp.min),
    (dist.ReduceOp.MAX, _C.ReduceOp.max),
    (dist.ReduceOp.AVG, _C.ReduceOp.avg),
    (dist.ReduceOp.PREMUL_SUM, _C.ReduceOp.premul_sum),
)


def _red(op) -> "_C.ReduceOp":
    r = next((b for t, b in _RED if op == t), None)
    if r is None:
        raise _braid._unsupported(f"the braid backend has no reduction {op}; use SUM, PRODUCT, MIN, MAX, AVG "
                                  "or PREMUL_SUM")
    return r


def _scale(opts) -> float:
    """PREMUL_SUM's factor (torch.distributed._make_nccl_premul_sum: a number, or a one-element
    tensor, read now); 1.0 for every other reduction."""
    op = opts.reduceOp if opts is not None else None
    if op is None or op != dist.ReduceOp.PREMUL_SUM:
        return 1.0
    f = op.factor
    return float(f.item() if isinstance(f, torch.Tensor) else f)


#: What takes CUDA tensors in the braid backend (the rest: CPU tensors).
_CUDA_CALLS = ("allreduce, allreduce_coalesced, broadcast, all_gather (equal sizes), all_gather_into_tensor, "
               "reduce_scatter_tensor and the DDP hooks")


def _check(t: torch.Tensor, what: str, cuda: bool = False) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise _braid._usage(f"{what} is a {type(t).__name__}, not a torch.Tensor")
    if t.device.type == "cuda":
        if not cuda:
            raise _braid._unsupported(f"{what} is on {t.device}; the braid backend takes CUDA tensors in "
                                      f"{_CUDA_CALLS}, CPU tensors elsewhere")
    elif t.device.type != "cpu":
        raise _braid._unsupported(f"{what} is on {t.device}; the braid backend takes CPU and CUDA tensors")
    if not t.is_contiguous():
        raise _braid._usage(f"{what} is not contiguous (strides {tuple(t.stride())}); pass .contiguous()")
    return t


_TorchStore = _braid._TorchStore
_MONITORED_TAG = 0x7a12  # point-to-point tag of monitored_barrier


def _unflatten(flat: torch.Tensor, tensors) -> list:
    """Copies consecutive runs of `flat` back into `tensors` (the inverse of the flattening
    a coalesced collective does); returns them."""
    off = 0
    for t in tensors:
        t.copy_(flat[off:off + t.numel()].view_as(t))
        off += t.numel()
    return list(tensors)


def _unwrap(src: Future) -> Any:
    err, value = src.value()
    if err is not None:
        raise err
    return value


def _settle(err, finish: Callable[[], Any]) -> tuple:
    """(error, value) of a finished set of Works: their first error, else finish()'s value
    (or what it raised)."""
    if err is not None:
        return (err, None)
    try:
        return (None, finish())
    except BaseException as e:  # noqa: BLE001 — handed to the future
        return (e, None)


class _Completer:
    """Completes torch futures as braid's Works finish.

    braid reports each finished set of Works through a CompletionQueue (Work.on_complete
    underneath: braid's progress thread only queues, it never takes the GIL). Python
    dispatcher threads take the finished sets, run our finishing copies and complete the
    futures. Completing a future runs its then-callbacks inline, and a callback may itself
    post a collective and block on its future (torch's PowerSGD hook does), so one
    dispatcher always stays waiting: when the last idle one takes a set, it starts another
    (the pool is two threads in steady state; a third only while two callbacks wait).

    A Python-side Future.set_exception only wraps the error for Python callers; torch's
    C++ side (Work.wait, DDP) would see success. So a private future is completed with
    (error, value) and `then(_unwrap)` is handed out, whose callback raises: torch marks
    that future failed for C++ and Python alike, with the braid message."""

    def __init__(self, name: str):
        self._name = name
        self._q = _C.CompletionQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads: "list[threading.Thread]" = []
        with self._lock:
            self._spawn()

    def submit(self, works: list, finish: Callable[[], Any]):
        """Watches; returns (private future of (error, value), public future of the value).
        Works that have already finished (a small call runs on the caller's thread and is
        done when it returns) complete the futures here, on the caller's thread, without
        the hand-off to a dispatcher thread that would cost the call tens of microseconds."""
        src: Future = Future()
        if works and all(w.test() for w in works):
            done = _settle(next((e for e in (w.exception() for w in works) if e is not None), None), finish)
            src.set_result(done)
            if done[0] is not None:
                return src, src.then(_unwrap)
            out: Future = Future()
            out.set_result(done[1])
            return src, out
        out = src.then(_unwrap)
        self._q.watch(works, (src, finish))
        return src, out

    def stop(self) -> None:
        """Lets the dispatchers finish what is queued, ends them and waits for them. They
        must be gone before the interpreter finalizes: a thread that drops its last
        reference to a torch future or tensor then (Thread.run deletes its target's
        arguments on the way out) has its GIL request answered with pthread_exit, whose
        unwind through torch's noexcept destructors aborts the process ("terminate called
        without an active exception", seen at exit of the digits example one run in ten).
        Call it after the communicator is closed, so that every watched Work has finished."""
        self._q.close()
        me = threading.current_thread()
        deadline = time.monotonic() + 60
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            if t is not me:
                t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _spawn(self) -> None:  # under self._lock
        if self._q.closed:
            return
        t = threading.Thread(target=self._run, name=f"braid-done-{self._name}-{len(self._threads) + 1}", daemon=True)
        self._threads.append(t)
        self._idle += 1
        t.start()  # under the lock: stop() never misses a thread it must join

    def _run(self) -> None:
        while True:
            item = self._q.next()  # waits without the GIL; None once closed and drained
            with self._lock:
                self._idle -= 1
                if item is None:
                    return
                if self._idle == 0:
                    self._spawn()  # this set's callbacks may wait for a later one
            (src, finish), err = item
            item = None
            done = _settle(err, finish)
            src.set_result(done)  # runs the callbacks (DDP's, a comm hook's) on this thread
            src = finish = done = None
            with self._lock:
                self._idle += 1


class _Work(dist.Work):
    """torch Work over a future completed by the _Completer. wait() raises the braid error
    (torch's own future-wrapping Work would return normally from a failed future)."""

    def __init__(self, src: Future, fut: Future):
        super().__init__()
        self._src, self._fut = src, fut

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        """Blocks until done; raises the braid exception itself (RemoteError.peer, ...).
        With a `timeout` (as c10d's Work.wait), raises braid.TimeoutError if the work is
        still running then; the work keeps running (the communicator's deadline is what
        fails it), so a later wait() can still collect it."""
        if timeout is not None and timeout.total_seconds() > 0 and not self._src.done():
            finished = threading.Event()
            self._src.add_done_callback(lambda _: finished.set())
            if not finished.wait(timeout.total_seconds()):
                raise _braid._timeout(f"work did not complete within {timeout.total_seconds():g} s; it keeps "
                                      "running (call wait() again, or abort the group)")
        err, _ = self._src.wait()
        if err is not None:
            raise err
        return True

    def get_future(self) -> Future:
        return self._fut

    # From the source future, as wait() is: the one handed out (get_future) completes a
    # moment later, from src's callbacks, so after wait() it could still read as running
    # (PyTorch's test_isend caught it).
    def is_completed(self) -> bool:
        return self._src.done()

    def is_success(self) -> bool:
        return self._src.done() and self._src.value()[0] is None

    def exception(self):
        return self._src.value()[0] if self._src.done() else None

    def result(self):
        return self._fut.wait()

    def synchronize(self) -> None:
        pass


class _StreamWork(_Work):
    """torch Work of a call on CUDA tensors. The call is ordered on the tensors' current
    stream (braid's stream contract, as NCCL's): work enqueued there afterwards sees the
    result, so the future is complete at once, with CUDA events recorded on that stream
    (torch.futures.Future(devices=...)), and wait() blocks no host thread. A failure
    releases the stream and fails the communicator: wait() raises it once it is known, and
    every later call on the group raises it."""

    def wait(self, timeout: Optional[timedelta] = None) -> bool:  # noqa: ARG002 (nothing to wait for on the host)
        if self._src.done():
            err, _ = self._src.value()
            if err is not None:
                raise err
        self._fut.wait()  # the caller's current stream waits on the recorded events
        return True

    def synchronize(self) -> None:
        self._fut.wait()


def _cuda_device(tensors, what: str) -> Optional[torch.device]:
    """The CUDA device of `tensors`, or None when they are CPU tensors; mixing is refused."""
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise _braid._usage(f"{what}: tensors on {sorted(str(d) for d in devices)}; one call takes tensors of "
                            "one device")
    d = next(iter(devices), None)
    return d if d is not None and d.type == "cuda" else None


class BraidProcessGroup(dist.ProcessGroup):
    """torch.distributed process group over a braid Communicator: CPU tensors, and CUDA
    tensors in the calls DDP and FSDP make (see _CUDA_CALLS)."""

    def __init__(self, comm: "_braid.Communicator", rank: int, size: int, timeout: Optional[timedelta] = None):
        super().__init__(rank, size)
        self._comm = comm
        self._timeout = timeout.total_seconds() if timeout else None
        self._done = _Completer(f"r{rank}")
        self._closed = False
        _groups.add(self)

    # --- plumbing -------------------------------------------------------------------
    @property
    def _c(self):
        return self._comm._impl  # raises InvalidUsageError once the group is shut down

    @property
    def communicator(self) -> "_braid.Communicator":
        """The braid Communicator under this group."""
        return self._comm

    def getBackendName(self) -> str:  # noqa: N802 (torch's spelling)
        return "braid"

    def name(self) -> str:
        return "braid"

    # torch names a group through its per-device backends (ProcessGroup::setGroupName),
    # which a Python group does not register: without these, group_name raised "ProcessGroup
    # name not set" and destroy_process_group(group) failed (PyTorch's test_destroy_group).
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return getattr(self, "_group_name", "")

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_group_desc", "")

    def _get_backend(self, device=None):  # noqa: ARG002
        # torch asks a group for its per-device backend (batch_isend_irecv, ...); this
        # group is its own CPU backend and does not coalesce.
        return self

    def __repr__(self) -> str:
        return f"BraidProcessGroup(rank={self.rank()}, size={self.size()})"

    def _work(self, works: list, finish: Callable[[], Any], device: Optional[torch.device] = None) -> "dist.Work":
        if device is None:
            return _Work(*self._done.submit(works, finish))
        return _StreamWork(*self._stream_done(works, finish, device))

    def _stream_done(self, works: list, finish: Callable[[], Any], device: torch.device):
        """A call on CUDA tensors: its finishing work (copies, the average's division) is
        enqueued now on the current stream, after the collective; the public future is
        complete at once with CUDA events (Future(devices=...)). The private future, from
        the completion queue, reports a failure and keeps the tensors referenced until
        braid's Works are done."""
        value = finish()
        src, _ = self._done.submit(works, lambda: value)
        fut: Future = Future(devices=[device])
        fut.set_result(value)
        return src, fut

    def _buf(self, t: torch.Tensor, what: str, cuda: bool = False):
        return _braid._buffer(_check(t, what, cuda), what, writable=True)

    def _allreduce_future(self, t: torch.Tensor, op=_C.ReduceOp.sum, codec: str = "", ef_key: str = "") -> Future:
        """One all-reduce of `t` in place; the future yields `t`."""
        b = self._buf(t, "allreduce tensor", cuda=True)
        w = self._c.allreduce(b.ptr, b.ptr, b.count, b.dtype, op, self._timeout, _C.Algorithm.auto, codec,
                              ef_key, False, b.stream)

        def finish():
            return t

        device = _cuda_device([t], "allreduce")
        if device is not None:
            return self._stream_done([w], finish, device)[1]
        return self._done.submit([w], finish)[1]

    # --- collectives ------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = _red(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        sc = _scale(opts)
        if len(tensors) == 1 and tensors[0].is_sparse:
            return self._allreduce_sparse(tensors[0], op)
        device = _cuda_device(tensors, "allreduce")
        works = []
        for i, t in enumerate(tensors):
            b = self._buf(t, f"allreduce tensor {i}", cuda=True)
            works.append(self._c.allreduce(b.ptr, b.ptr, b.count, b.dtype, op, self._timeout, _C.Algorithm.auto,
                                           "", "", False, b.stream, scale=sc))
        return self._work(works, lambda: list(tensors), device)

    def _allreduce_sparse(self, t: torch.Tensor, op) -> "dist.Work":
        """The sum of sparse COO tensors, as gloo's: every rank's coalesced entries are
        gathered (counts, then the entries, each its indices and value bytes in one row,
        padded to the largest count), summed and coalesced, and the result replaces `t` in
        place (its nnz may change)."""
        if op != _C.ReduceOp.sum:
            raise _braid._unsupported(f"sparse all-reduce sums only (as gloo's), not {op}")
        if t.is_cuda:
            raise _braid._unsupported("sparse all-reduce of a CUDA tensor (CPU sparse tensors only)")
        c = t.coalesce()
        nnz, dims, vals = c._nnz(), c.sparse_dim(), c.values()
        dense = math.prod(vals.shape[1:])
        def as_bytes(x, width):  # nnz rows of `width` bytes (flattened first: a size-1
            return x.contiguous().view(-1).view(torch.uint8).reshape(nnz, width)  # dim's stride may be any)
        rows = torch.cat([as_bytes(c.indices().t(), 8 * dims), as_bytes(vals, dense * vals.element_size())], dim=1)
        n = self.size()
        counts = torch.empty(n, dtype=torch.int64)
        self._comm.allgather(torch.tensor([nnz]).numpy(), counts.numpy(), timeout=self._timeout)
        top = int(counts.max())

        def finish():
            got = torch.cat([gathered[r, :counts[r]] for r in range(n)]) if top else rows
            i = got[:, :8 * dims].contiguous().view(-1).view(torch.int64).reshape(-1, dims).t()
            v = got[:, 8 * dims:].contiguous().view(-1).view(vals.dtype).reshape(-1, *vals.shape[1:])
            t.copy_(torch.sparse_coo_tensor(i, v, t.shape).coalesce())
            return [t]
        if not top:  # every rank's tensor is empty: nothing to gather
            src, out = Future(), Future()
            src.set_result((None, finish()))
            out.set_result([t])
            return _Work(src, out)
        padded = torch.zeros(top, rows.shape[1], dtype=torch.uint8)
        padded[:nnz] = rows
        gathered = torch.empty(n, top, rows.shape[1], dtype=torch.uint8)
        w = self._comm.allgather(padded.numpy(), gathered.numpy(), async_op=True, timeout=self._timeout)
        return self._work([w._w], finish)  # braid's own Work: the completion queue watches those

    def _flat(self, tensors, what: str, cuda: bool = False) -> torch.Tensor:
        """The tensors' elements in one new buffer (one collective instead of one per tensor)."""
        if not tensors:
            raise _braid._usage(f"{what}: no tensors")
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise _braid._usage(f"{what}: tensors of several dtypes {sorted(str(d) for d in dtypes)}; coalesced "
                                "collectives take one dtype (as gloo's)")
        for k, t in enumerate(tensors):
            _check(t, f"{what} tensor {k}", cuda)
        _cuda_device(tensors, what)  # one device
        return torch.cat([t.reshape(-1) for t in tensors])

    def _check_pairs(self, what: str, big, big_name: str, small, small_name: str) -> None:
        """Coalesced pairs: each of `big` holds group-size times its partner in `small`."""
        n = self.size()
        if len(big) != len(small):
            raise _braid._usage(f"{what}: {len(big)} {big_name}s for {len(small)} {small_name}s")
        for k, (b, t) in enumerate(zip(big, small)):
            if b.numel() != n * t.numel() or b.dtype != t.dtype:
                raise _braid._usage(f"{what}: {big_name} {k} is {b.numel()} x {b.dtype}, needs {n}*{t.numel()} x "
                                    f"{t.dtype}")

    def allreduce_coalesced(self, tensors, opts=None):
        """One all-reduce over the flattened tensors (one dtype), results copied back."""
        op = _red(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        sc = _scale(opts)
        flat = self._flat(tensors, "allreduce_coalesced", cuda=True)
        b = self._buf(flat, "allreduce_coalesced staging", cuda=True)
        w = self._c.allreduce(b.ptr, b.ptr, b.count, b.dtype, op, self._timeout, _C.Algorithm.auto, "", "", False,
                              b.stream, scale=sc)

        return self._work([w], lambda: _unflatten(flat, tensors), _cuda_device([flat], "allreduce_coalesced"))

    def broadcast(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        root = opts.rootRank if opts is not None else 0
        device = _cuda_device(tensors, "broadcast")
        works = []
        for i, t in enumerate(tensors):
            b = self._buf(t, f"broadcast tensor {i}", cuda=True)
            works.append(self._c.broadcast(b.ptr, b.ptr, b.count, b.dtype, root, self._timeout, b.stream))
        return self._work(works, lambda: list(tensors), device)

    def reduce(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        op = _red(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        sc = _scale(opts)
        works = []
        for i, t in enumerate(tensors):
            b = self._buf(t, f"reduce tensor {i}")
            works.append(self._c.reduce(b.ptr, b.ptr, b.count, b.dtype, op, root, self._timeout, False, scale=sc))
        return self._work(works, lambda: list(tensors))

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 (torch's names)
        device = _cuda_device([output, input], "allgather")
        i = self._buf(input, "allgather input", cuda=True)
        o = self._buf(output, "allgather output", cuda=True)
        if o.count != i.count * self.size() or o.dtype != i.dtype:
            raise _braid._usage(f"allgather: output has {o.count} {o.dtype.name} elements, needs "
                                f"{self.size()}*{i.count} {i.dtype.name}")
        w = self._c.allgather(i.ptr, o.ptr, i.count, i.dtype, self._timeout, o.stream)
        return self._work([w], lambda: [output], device)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002
        return self._allgather_base(output, input, opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        """One all-gather for several (output, input) pairs: output k is the group's
        inputs k, rank after rank."""
        self._check_pairs("allgather_into_tensor_coalesced", outputs, "output", inputs, "input")

        def finish(blocks):
            off = 0
            for out, inp in zip(outputs, inputs):
                m = inp.numel()
                out.copy_(blocks[:, off:off + m].reshape(out.shape))
                off += m
            return list(outputs)

        return self._allgather_flat(inputs, "allgather_into_tensor_coalesced", finish)

    def _allgather_flat(self, inputs, what: str, finish: Callable[[torch.Tensor], Any]) -> "dist.Work":
        """One all-gather of the flattened `inputs` (one dtype); finish(blocks) gets the
        result as a (group size, elements per rank) view once it is done."""
        flat_in = self._flat(inputs, what)
        flat_out = torch.empty(self.size() * flat_in.numel(), dtype=flat_in.dtype)
        i, o = self._buf(flat_in, "allgather staging"), self._buf(flat_out, "allgather staging")
        w = self._c.allgather(i.ptr, o.ptr, i.count, i.dtype, self._timeout)

        def done():
            _ = flat_in  # alive until done
            return finish(flat_out.view(self.size(), flat_in.numel()))

        return self._work([w], done)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """One all-gather of the flattened inputs (one dtype): output_lists[j][k] receives
        rank j's input k (torch.distributed.all_gather_coalesced, as gloo's)."""
        n = self.size()
        if len(output_lists) != n:
            raise _braid._usage(f"allgather_coalesced: {len(output_lists)} output lists for a group of {n}")
        for j, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise _braid._usage(f"allgather_coalesced: output list {j} has {len(outs)} tensors for "
                                    f"{len(input_list)} inputs")
            for k, (o, t) in enumerate(zip(outs, input_list)):
                _check(o, f"allgather_coalesced output {j}.{k}")
                if o.numel() != t.numel() or o.dtype != t.dtype:
                    raise _braid._usage(f"allgather_coalesced: output {j}.{k} is {o.numel()} x {o.dtype}, input "
                                        f"{k} is {t.numel()} x {t.dtype}; sizes and dtypes must match")
        def finish(blocks):
            for j, outs in enumerate(output_lists):
                _unflatten(blocks[j], outs)
            return output_lists

        return self._allgather_flat(input_list, "allgather_coalesced", finish)

    def allgather(self, output_tensors, input_tensors, opts=None):
        """Output j gets rank j's input. Outputs of different sizes (rank j's input has
        output j's size, as with NCCL) go through braid's allgatherv (CPU tensors only).
        CUDA tensors of equal sizes (what DDP's construction gathers) are gathered on the
        current stream into a staging tensor on their device, then copied out there."""
        works, finishers = [], []
        device = _cuda_device([t for outs in output_tensors for t in outs] + list(input_tensors), "allgather")
        for k, (outs, inp) in enumerate(zip(output_tensors, input_tensors)):
            i = self._buf(inp, f"allgather input {k}", cuda=True)
            if len(outs) != self.size():
                raise _braid._usage(f"allgather: {len(outs)} output tensors for a group of {self.size()}")
            counts = [o.numel() for o in outs]
            for j, o in enumerate(outs):
                if o.dtype != inp.dtype:
                    raise _braid._usage(f"allgather: output {j} is {o.dtype}, input is {inp.dtype}")
            if counts[self.rank()] != inp.numel():
                raise _braid._usage(f"allgather: output {self.rank()} (this rank's) has {counts[self.rank()]} "
                                    f"elements, the input {inp.numel()}; they must match")
            flat = torch.empty(sum(counts), dtype=inp.dtype, device=inp.device)
            f = self._buf(flat, "allgather staging", cuda=True)
            if len(set(counts)) == 1:
                works.append(self._c.allgather(i.ptr, f.ptr, i.count, i.dtype, self._timeout, f.stream))
            elif device is not None:
                raise _braid._unsupported(f"allgather of CUDA tensors of different sizes ({counts}); pad them to one "
                                          "size, or gather CPU tensors")
            else:
                works.append(self._c.allgatherv(i.ptr, f.ptr, counts, i.dtype, self._timeout))
            finishers.append((outs, flat))

        def finish():
            for outs, flat in finishers:
                _unflatten(flat, outs)
            return output_tensors

        return self._work(works, finish, device)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        op = _red(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        sc = _scale(opts)
        device = _cuda_device([output, input], "reduce_scatter")
        i = self._buf(input, "reduce_scatter input", cuda=True)
        o = self._buf(output, "reduce_scatter output", cuda=True)
        if i.count != o.count * self.size() or o.dtype != i.dtype:
            raise _braid._usage(f"reduce_scatter: input has {i.count} {i.dtype.name} elements, needs "
                                f"{self.size()}*{o.count} {o.dtype.name}")
        w = self._c.reduce_scatter(i.ptr, o.ptr, o.count, o.dtype, op, self._timeout, False, o.stream, scale=sc)
        return self._work([w], lambda: [output], device)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        """One reduce-scatter for several (output, input) pairs: output k is this rank's
        block of the reduced input k."""
        n = self.size()
        op = _red(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        sc = _scale(opts)
        self._check_pairs("reduce_scatter_tensor_coalesced", inputs, "input", outputs, "output")
        self._flat(outputs, "reduce_scatter_tensor_coalesced")  # one dtype, CPU, contiguous
        # Rank j's block of the flat input holds block j of every input, in order.
        flat_in = torch.cat([t.reshape(n, -1) for t in inputs], dim=1).reshape(-1)
        flat_out = torch.empty(flat_in.numel() // n, dtype=flat_in.dtype)
        i, o = self._buf(flat_in, "reduce_scatter staging"), self._buf(flat_out, "reduce_scatter staging")
        w = self._c.reduce_scatter(i.ptr, o.ptr, o.count, o.dtype, op, self._timeout, False, scale=sc)

        return self._work([w], lambda: (flat_in, _unflatten(flat_out, outputs))[1])  # flat_in alive until done

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _red(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        sc = _scale(opts)
        works, keep = [], []
        for k, (out, ins) in enumerate(zip(output_tensors, input_tensors)):
            if len(ins) != self.size():
                raise _braid._usage(f"reduce_scatter: {len(ins)} input tensors for a group of {self.size()}")
            counts = [t.numel() for t in ins]
            for j, t in enumerate(ins):
                if t.dtype != out.dtype:
                    raise _braid._usage(f"reduce_scatter: input {j} is {t.dtype}, output is {out.dtype}")
            if counts[self.rank()] != out.numel():
                raise _braid._usage(f"reduce_scatter: input {self.rank()} (this rank's block) has "
                                    f"{counts[self.rank()]} elements, the output {out.numel()}; they must match")
            flat = torch.cat([t.reshape(-1) for t in ins])
            i = self._buf(flat, "reduce_scatter staging")
            o = self._buf(out, f"reduce_scatter output {k}")
            if len(set(counts)) == 1:
                works.append(self._c.reduce_scatter(i.ptr, o.ptr, o.count, o.dtype, op, self._timeout, False,
                                                    scale=sc))
            else:  # blocks of their own sizes (as NCCL allows): braid's reduce_scatter_v
                works.append(self._c.reduce_scatter_v(i.ptr, o.ptr, counts, o.dtype, op, self._timeout, scale=sc))
            keep.append(flat)
        return self._work(works, lambda: (keep, output_tensors)[1])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        n = self.size()
        i = self._buf(input, "alltoall input")
        o = self._buf(output, "alltoall output")
        rows = input.shape[0] if input.dim() > 0 else 0
        if output_split_sizes or input_split_sizes:
            return self._alltoallv(output, input, list(output_split_sizes or []), list(input_split_sizes or []))
        if i.count != o.count or i.count % n or (rows and rows % n) or o.dtype != i.dtype:
            raise _braid._usage(f"alltoall: input ({i.count} x {i.dtype.name}) and output ({o.count} x "
                                f"{o.dtype.name}) must match and split into {n} equal blocks")
        w = self._c.alltoall(i.ptr, o.ptr, i.count // n, i.dtype, self._timeout)
        return self._work([w], lambda: [output])

    def _alltoallv(self, output, input, out_splits, in_splits, finish=None):  # noqa: A002
        """all_to_all_single with split sizes (rows of dim 0), as gloo's: block j of the
        input goes to rank j; block j of the output comes from rank j. Empty splits mean
        equal blocks. One braid alltoallv (element counts: split rows times the row size)."""
        n, r = self.size(), self.rank()
        self._buf(output, "alltoall output")  # CPU, contiguous, writable
        self._buf(input, "alltoall input")
        if output.dtype != input.dtype:
            raise _braid._usage(f"alltoall: input is {input.dtype}, output is {output.dtype}")

        def splits(t, given, what):
            rows = t.shape[0] if t.dim() > 0 else 0
            if not given:
                if rows % n:
                    raise _braid._usage(f"alltoall: {what} has {rows} rows, not divisible by {n} (give split sizes)")
                return [rows // n] * n
            if len(given) != n or any(s < 0 for s in given) or sum(given) != rows:
                raise _braid._usage(f"alltoall: {what} split sizes {given} must be {n} non-negative numbers summing "
                                    f"to its {rows} rows")
            return given

        ins, outs = splits(input, in_splits, "input"), splits(output, out_splits, "output")
        row_in = input[0].numel() if input.dim() > 0 and input.shape[0] else 0
        row_out = output[0].numel() if output.dim() > 0 and output.shape[0] else 0
        if ins[r] * row_in != outs[r] * row_out:
            raise _braid._usage(f"alltoall: this rank's own block is {ins[r]} input rows but {outs[r]} output rows")
        i, o = self._buf(input, "alltoall input"), self._buf(output, "alltoall output")
        w = self._c.alltoallv(i.ptr, [s * row_in for s in ins], o.ptr, [s * row_out for s in outs], i.dtype,
                              self._timeout)
        done = finish or (lambda: [output])
        return self._work([w], lambda: (input, done())[1])  # input alive until done

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self.size()
        if len(input_tensors) != n or len(output_tensors) != n:
            raise _braid._usage(f"alltoall: needs {n} input and {n} output tensors")
        sizes = {t.numel() for t in list(input_tensors) + list(output_tensors)}
        if len(sizes) != 1:  # uneven: braid's alltoallv, as all_to_all_single with split sizes
            flat_in = self._flat(input_tensors, "alltoall")
            flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)

            return self._alltoallv(flat_out, flat_in, [t.numel() for t in output_tensors],
                                   [t.numel() for t in input_tensors], lambda: _unflatten(flat_out, output_tensors))
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        flat_out = torch.empty_like(flat_in)
        i, o = self._buf(flat_in, "alltoall staging"), self._buf(flat_out, "alltoall staging")
        w = self._c.alltoall(i.ptr, o.ptr, i.count // n, i.dtype, self._timeout)
        m = input_tensors[0].numel()

        def finish():
            _ = flat_in  # alive until done
            for j, t in enumerate(output_tensors):
                t.copy_(flat_out[j * m:(j + 1) * m].view_as(t))
            return output_tensors

        return self._work([w], finish)

    def barrier(self, opts=None):
        return self._work([self._c.barrier(self._timeout)], lambda: [])

    def monitored_barrier(self, timeout: Optional[timedelta] = None, wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not arrive, as ProcessGroupGloo's
        monitoredBarrier: every rank sends to rank 0, which waits up to `timeout` (default:
        the group's timeout) and then answers every rank. Rank 0 raises braid.TimeoutError
        naming the first rank that did not arrive (every such rank with wait_all_ranks=True);
        the others raise braid.TimeoutError when rank 0's answer does not come within
        `timeout`. Blocking, like gloo's. After a failure the group is failed (later calls
        raise at once): destroy it or end the job, as with gloo."""
        limit = timeout.total_seconds() if timeout is not None else self._timeout
        r, n = self.rank(), self.size()
        if n == 1:
            return
        c = self._c
        token = torch.zeros(1, dtype=torch.int32)
        b = self._buf(token, "monitored_barrier token")
        shown = f"{limit:g} s" if limit else "the group's timeout"
        if r != 0:
            c.send(b.ptr, 1, b.dtype, 0, _MONITORED_TAG, limit).wait()
            try:
                c.recv(b.ptr, 1, b.dtype, 0, _MONITORED_TAG, limit).wait()
            except _braid.Error as e:
                raise _braid._timeout(f"rank {r}: monitored_barrier got no answer from rank 0 within {shown} "
                                      f"(rank 0 found ranks missing, or did not arrive itself): {e}") from e
            return
        tokens = [torch.zeros(1, dtype=torch.int32) for _ in range(n)]
        works = {q: c.recv(self._buf(tokens[q], "monitored_barrier token").ptr, 1, b.dtype, q, _MONITORED_TAG, limit)
                 for q in range(1, n)}
        missing, why = [], {}
        for q, w in works.items():  # every receive has its own deadline: waiting in order costs nothing
            try:
                w.wait()
            except _braid.Error as e:
                missing.append(q)
                why[q] = str(e)
                if not wait_all_ranks:
                    break
        if missing:
            named = ", ".join(str(q) for q in missing)
            err = _braid._timeout(f"monitored_barrier: rank{'s' if len(missing) > 1 else ''} {named} did not "
                                  f"arrive within {shown} (first: {why[missing[0]]})")
            err.peer = missing[0]
            raise err
        for q in range(1, n):
            c.send(b.ptr, 1, b.dtype, q, _MONITORED_TAG, limit).wait()

    def send(self, tensors, dst, tag=0):
        works = []
        for k, t in enumerate(tensors):
            b = self._buf(t, f"send tensor {k}")
            works.append(self._c.send(b.ptr, b.count, b.dtype, dst, tag, self._timeout))
        return self._work(works, lambda: list(tensors))

    def recv(self, tensors, src, tag=0):
        works = []
        for k, t in enumerate(tensors):
            b = self._buf(t, f"recv tensor {k}")
            works.append(self._c.recv(b.ptr, b.count, b.dtype, src, tag, self._timeout))
        return self._work(works, lambda: list(tensors))

    def recv_anysource(self, tensors, tag=0):
        raise _braid._unsupported("recv from any source; name the source rank (braid matches send/recv by peer)")

    def gather(self, output_tensors, input_tensors, opts=None):
        # braid's gather: only the root receives, into one buffer it then splits.
        root = opts.rootRank if opts is not None else 0
        inp = self._buf(input_tensors[0], "gather input")
        if self.rank() != root:
            return self._work([self._c.gather(inp.ptr, 0, inp.count, inp.dtype, root, self._timeout)], lambda: [])
        outs = output_tensors[0]
        flat = torch.empty(self.size() * inp.count, dtype=input_tensors[0].dtype)
        f = self._buf(flat, "gather staging")
        w = self._c.gather(inp.ptr, f.ptr, inp.count, inp.dtype, root, self._timeout)

        def finish():
            for j, t in enumerate(outs):
                t.copy_(flat[j * inp.count:(j + 1) * inp.count].view_as(t))
            return outs

        return self._work([w], finish)

    def scatter(self, output_tensors, input_tensors, opts=None):
        # braid's scatter: the root's blocks in one buffer; each rank receives only its own.
        root = opts.rootRank if opts is not None else 0
        out = output_tensors[0]
        o = self._buf(out, "scatter output")
        send = 0
        keep = None
        if self.rank() == root:
            keep = torch.cat([t.reshape(-1) for t in input_tensors[0]])
            send = self._buf(keep, "scatter staging").ptr
        w = self._c.scatter(send, o.ptr, o.count, o.dtype, root, self._timeout)

        def finish(staging=keep):  # the root's blocks live until the scatter is done
            return [out]

        return self._work([w], finish)

    # --- teardown ---------------------------------------------------------------------
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._comm.close()  # every Work finishes (or fails) here; then the futures complete
        self._done.stop()

    def abort(self) -> None:
        self._comm.abort()
        self.shutdown()

    # --- shrink and continue (docs/reliability.md, "Shrink") ---------------------------
    @property
    def supports_shrinking(self) -> bool:
        return True

    def shrink(self, ranks_to_exclude: Sequence[int] = ()) -> "BraidProcessGroup":
        """A group of the ranks still alive (and not in `ranks_to_exclude`), renumbered in
        their old order: every survivor calls it after a collective failed (or to drop
        ranks). The survivors agree through the store on who is left; this group stays as
        it is. Use braid.torch.shrink_group to also make it torch's group."""
        comm = self._comm.shrink(list(ranks_to_exclude))
        return BraidProcessGroup(comm, comm.rank, comm.size,
                                 timedelta(seconds=self._timeout) if self._timeout else None)


def shrink_group(ranks_to_exclude: Sequence[int] = (), group: Optional[dist.ProcessGroup] = None
                 ) -> dist.ProcessGroup:
    """torch.distributed.shrink_group for braid groups: the survivors of a failed braid group
    (every one calls it; the dead do not) get a new group of themselves, registered with
    torch as torch's own shrink_group registers it (the default group when `group` was the
    default, and then the other groups are destroyed, as torch does). Unlike torch's, the
    ranks to leave out need not be known: the ones that died are found and agreed on
    (`ranks_to_exclude` adds to them). Returns the new group; the old one is destroyed."""
    c10d = dist.distributed_c10d
    pg = group if group is not None else c10d._get_default_group()
    if not isinstance(pg, BraidProcessGroup):
        raise _braid._usage(f"braid.torch.shrink_group needs a braid process group, not {pg!r}")
    is_default = pg is c10d._get_default_group()
    old_ranks = list(dist.get_process_group_ranks(pg))  # global ranks, in group order
    backend_name, store = c10d._world.pg_map[pg]
    config = c10d._world.pg_backend_config.get(pg, "")
    new = pg.shrink([r for r in ranks_to_exclude])
    # Who is left, in group ranks of the old group: one small all-gather on the new group.
    mine = torch.tensor([pg.rank()], dtype=torch.int64)
    members = torch.empty(new.size(), dtype=torch.int64)
    new.communicator.allgather(mine.numpy(), members.numpy())
    remaining = [old_ranks[i] for i in members.tolist()]
    if is_default:
        for other in list(c10d._world.pg_map):
            if other is not pg:
                try:
                    dist.destroy_process_group(other)
                except Exception:  # noqa: BLE001 — a group of the failed job: going anyway
                    pass
    try:
        dist.destroy_process_group(pg)
    except Exception:  # noqa: BLE001
        pass
    cleanup = getattr(c10d, "_cleanup_process_group_global_state", None)
    if cleanup is not None:
        cleanup(pg)
    name = c10d._process_group_name(remaining, use_hashed_name=True)
    new._set_group_name(name)
    c10d._register_pg_in_world(new, backend_name, store, name, config,
                               rank_mapping={g: i for i, g in enumerate(remaining)})
    if is_default:
        c10d._update_default_pg(new)
    return new


_groups: "weakref.WeakSet[BraidProcessGroup]" = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    # Runs before braid's own exit hook (registered earlier): close the communicators and
    # stop the completion threads while the interpreter is whole.
    for pg in list(_groups):
        try:
            pg.shutdown()
        except Exception:  # noqa: BLE001 — exiting anyway
            pass


def monitored_barrier(group: Optional[dist.ProcessGroup] = None, timeout: Optional[timedelta] = None,
                      wait_all_ranks: bool = False) -> None:
    """torch.distributed.monitored_barrier for braid groups (torch's own accepts gloo groups
    only): a barrier whose rank 0 names the ranks that did not arrive within `timeout`.
    See BraidProcessGroup.monitored_barrier."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, BraidProcessGroup):
        raise _braid._usage("braid.torch.monitored_barrier needs a braid process group (backend 'braid'); "
                            "for a gloo group use torch.distributed.monitored_barrier")
    pg.monitored_barrier(timeout, wait_all_ranks)


def _create(store, rank, size, timeout):
    # torch hands every group its own prefix store, so one name serves all groups.
    comm = _braid.Communicator(_TorchStore(store), rank, size,
                               timeout=timeout.total_seconds() if timeout else None, name="torch")
    return BraidProcessGroup(comm, rank, size, timeout)


def _raw(value) -> bytes:
    """A value torch hands a store (str, bytes or a list of ints) as bytes."""
    return value.encode() if isinstance(value, str) else bytes(value)


class _LauncherStore(dist.Store):
    """braid's store (the one braidrun hosts) seen as a torch Store, under a prefix.

    torch's own TCPStore would have to be hosted by a rank, and rank 0 dying would then
    take the job's store with it: the survivors could not agree and shrink (issue 39).
    braidrun's store lives in the launcher, which outlives every rank. torch calls these
    methods for its set-up, barriers and c10d's store-based helpers; the collectives never
    touch the store."""

    def __init__(self, prefix: str, timeout: timedelta):
        super().__init__()
        self.set_timeout(timeout)
        self._s, self._p = _braid._launcher_store(self._wait_s()), prefix
        # torch holds the C++ half only: the Python half (whose methods are the overrides)
        # must outlive every group made from it, so the process keeps it.
        _launcher_stores.append(self)

    def clone(self):
        """A second connection to the same store and prefix (torch's shrink and split
        paths give a new group its own)."""
        return _LauncherStore(self._p, self.timeout)

    def _wait_s(self, timeout: Optional[timedelta] = None) -> float:
        t = timeout if timeout is not None else self.timeout
        return max(t.total_seconds(), 0.001)

    def set(self, key, value):
        self._s.set(self._p + key, _raw(value))

    def get(self, key):
        return self._s.get(self._p + key, self._wait_s())

    def add(self, key, value):
        return self._s.add(self._p + key, int(value))

    def compare_set(self, key, expected_value, desired_value):
        return self._s.compare_set(self._p + key, _raw(expected_value), _raw(desired_value))

    def check(self, keys):
        return self._s.check([self._p + k for k in keys])

    def wait(self, keys, timeout=None):
        self._s.wait([self._p + k for k in keys], self._wait_s(timeout))

    def delete_key(self, key):
        return self._s.remove(self._p + key)

    def num_keys(self):
        raise _braid._unsupported("num_keys on braidrun's store (braid's store protocol does not count keys)")


def _braid_rendezvous(url: str, timeout: timedelta = timedelta(minutes=5), **kwargs):
    """braid://: braidrun's store, under a prefix per rendezvous, as torch's store."""
    env = _C.launch_environment()  # the library's reading of the variables (one precedence)
    rank, size = max(env["rank"], 0), max(env["world_size"], 1)
    if size > 1 and not env["master_port"]:
        raise _braid._usage("braid:// rendezvous needs BRAID_MASTER_ADDR/BRAID_MASTER_PORT (run under braidrun)")
    generation = _rendezvous_count[0]
    _rendezvous_count[0] += 1
    if size == 1:
        yield (dist.HashStore(), rank, size)
        return
    yield (_LauncherStore(f"torch/{generation}/", timeout), rank, size)


_rendezvous_count = [0]
_launcher_stores: List[_LauncherStore] = []

# One group serves both devices (torch keeps a ProcessGroup subclass as the group itself).
dist.Backend.register_backend("braid", _create, devices=["cpu", "cuda"])
dist.register_rendezvous_handler("braid", _braid_rendezvous)


def init_process_group(backend: str = "braid", **kwargs) -> None:
    """dist.init_process_group with the right rendezvous: braid:// under braidrun (which
    serves braid's store, not torch's), env:// otherwise (torchrun)."""
    if "init_method" not in kwargs and "store" not in kwargs and _C.launch_environment()["store_external"]:
        kwargs["init_method"] = "braid://"
    dist.init_process_group(backend, **kwargs)


def get_communicator(group: Optional[dist.ProcessGroup] = None) -> "_braid.Communicator":
    """The braid Communicator under `group` (default: the default group)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, BraidProcessGroup):
        raise _braid._usage(f"process group {pg!r} is not a braid group; create it with backend 'braid'")
    return pg.communicator


class CompressionHookState:
    """The state of one compression hook: its codec, the error-feedback keys it owns and
    the layout (parameters, in order) each of its buckets had when last seen.

    Residuals live in the library under ``<name>/bucket-<index>``. A bucket's residuals
    start from zero the first time the hook sees that bucket and again whenever its
    layout changes: DDP rebuilds its buckets once after the first iteration (in the order
    gradients became ready, so sizes and membership change), and a residual describes
    the values of one layout, element by element. What is dropped is one step's
    compression error of the rebuilt buckets. When the state is garbage collected, its
    residuals are freed.

    ``state_dict()`` / ``load_state_dict()`` checkpoint it with the model (the residuals
    as the library's checkpoint bytes, the layouts as parameter shapes); a restored bucket
    keeps its residuals if its layout matches, else starts from zero as above.
    """

    _names = 0

    def __init__(self, codec: str, error_feedback: bool, process_group: Optional[dist.ProcessGroup],
                 name: Optional[str]):
        self.codec = "" if codec in (None, "none") else str(codec)
        self.error_feedback = bool(error_feedback) and bool(self.codec)
        self.process_group = process_group
        if name is None:
            name = f"ddp{CompressionHookState._names}"
            CompressionHookState._names += 1
        if not name or "/" in name:
            raise _braid._usage(f"compression hook name {name!r}: give a non-empty name without '/'")
        self.prefix = f"{name}/"
        self._layouts: dict = {}     # bucket index -> tuple of id(parameter), this process
        self._indices: set = set()   # every bucket index whose residuals this hook may hold
        self._shapes: dict = {}      # bucket index -> tuple of parameter shapes (portable)
        self._restored: dict = {}    # bucket index -> shapes of a loaded state, until first seen
        self._pending: Optional[bytes] = None  # residuals loaded before the group was known
        self._comm: Optional[_braid.Communicator] = None
        self._finalizer: Optional[weakref.finalize] = None

    def key(self, index: int) -> str:
        return f"{self.prefix}bucket-{index}"

    def _group(self, state) -> "BraidProcessGroup":
        pg = state if isinstance(state, BraidProcessGroup) else self.process_group
        if pg is None:
            pg = dist.distributed_c10d._get_default_group()
        if not isinstance(pg, BraidProcessGroup):
            raise _braid._usage("compression_hook needs a braid process group (backend 'braid')")
        return pg

    def _bind(self, comm: "_braid.Communicator") -> None:
        if self._comm is comm:
            return
        if self._comm is not None:
            raise _braid._usage(f"compression hook {self.prefix[:-1]!r} is used with two process groups; "
                                "create one hook per DDP model")
        self._comm = comm
        self._finalizer = weakref.finalize(self, CompressionHookState._forget, weakref.ref(comm), self.prefix,
                                           self._indices)
        self._finalizer.atexit = False  # at exit the communicators go anyway
        if self._pending is not None:
            comm.restore_error_feedback(self._pending, key_prefix=self.prefix)
            self._pending = None

    @staticmethod
    def _forget(comm_ref, prefix: str, indices: set) -> None:
        comm = comm_ref()
        if comm is None or comm.failed():
            return
        for index in list(indices):
            try:
                comm.reset_error_feedback(f"{prefix}bucket-{index}")
            except _braid.Error:
                pass

    def ef_key(self, comm: "_braid.Communicator", bucket: "dist.GradBucket") -> str:
        """The bucket's error-feedback key, its residuals reset if its layout changed."""
        if not self.error_feedback:
            return ""
        self._bind(comm)
        index = bucket.index()
        params = bucket.parameters()
        layout = tuple(id(p) for p in params)
        if self._layouts.get(index) != layout:
            shapes = tuple(tuple(p.shape) for p in params)
            restored = self._restored.pop(index, None)
            if restored is None or restored != shapes:
                comm.reset_error_feedback(self.key(index))
            self._layouts[index] = layout
            self._shapes[index] = shapes
            self._indices.add(index)
        return self.key(index)

    def state_dict(self) -> dict:
        """Codec, bucket layouts and this hook's residuals (bytes), for torch.save."""
        residuals = b""
        if self._comm is not None:
            residuals = self._comm.save_error_feedback(key_prefix=self.prefix)
        elif self._pending is not None:
            residuals = self._pending
        shapes = dict(self._restored)
        shapes.update(self._shapes)
        return {"version": 1, "codec": self.codec, "error_feedback": self.error_feedback,
                "layouts": {i: [list(s) for s in v] for i, v in shapes.items()}, "residuals": residuals}

    def load_state_dict(self, sd: dict) -> None:
        """Restores a state_dict(); call before the first step of the resumed run."""
        if sd.get("version") != 1:
            raise _braid._usage(f"compression hook state version {sd.get('version')!r} is not supported "
                                "(this braid reads version 1)")
        if sd.get("codec") != self.codec or bool(sd.get("error_feedback")) != self.error_feedback:
            raise _braid._usage(f"compression hook state is for codec {sd.get('codec')!r} "
                                f"(error_feedback={sd.get('error_feedback')}), this hook runs {self.codec!r} "
                                f"(error_feedback={self.error_feedback})")
        self._restored = {int(i): tuple(tuple(s) for s in v) for i, v in sd["layouts"].items()}
        self._layouts.clear()
        self._shapes.clear()
        data = bytes(sd["residuals"])  # empty: saved before the hook's first step
        if self._comm is not None:
            for index in list(self._indices):
                self._comm.reset_error_feedback(self.key(index))
            if data:
                self._comm.restore_error_feedback(data, key_prefix=self.prefix)
        else:
            self._pending = data or None
        self._indices.update(self._restored)


def compression_hook(codec: str = "int8", error_feedback: bool = True,
                     process_group: Optional[dist.ProcessGroup] = None, name: Optional[str] = None):
    """A DDP communication hook that averages each gradient bucket with braid's all-reduce,
    compressed inside the collective with `codec` ("none", "fp16", "bf16", "int8", "sign1",
    "topk:0.01", ...). With `error_feedback`, the library keeps a residual per bucket, so
    biased codecs (sign1, topk) converge.

        hook = braid.torch.compression_hook("int8")
        ddp.register_comm_hook(None, hook)
        torch.save({"model": ddp.state_dict(), "hook": hook.state_dict()}, path)

    The hook's state, when a BraidProcessGroup, names the group; else `process_group`;
    else the default group. That group must use the braid backend. Residuals are keyed
    ``<name>/bucket-<index>`` (name: "ddp0", "ddp1"... in creation order unless given)
    and follow DDP's bucket rebuild by the rule of CompressionHookState. ``hook.state``,
    ``hook.state_dict()`` and ``hook.load_state_dict()`` give its state."""
    st = CompressionHookState(codec, error_feedback, process_group, name)

    def hook(state, bucket) -> Future:
        pg = st._group(state)
        key = st.ef_key(pg.communicator, bucket)
        # avg inside the collective (compressed: the owner divides its shard once) rather
        # than sum and a division of the whole bucket afterwards: one memory pass less.
        return pg._allreduce_future(bucket.buffer(), _C.ReduceOp.avg, st.codec, key)

    # DDP checks the annotations; this module's are strings (postponed evaluation).
    hook.__annotations__ = {"bucket": dist.GradBucket, "return": Future[torch.Tensor]}
    hook.__name__ = f"braid_compression_hook_{codec or 'none'}"
    hook.state = st
    hook.state_dict = st.state_dict
    hook.load_state_dict = st.load_state_dict
    return hook


def powersgd_hook(process_group: Optional[dist.ProcessGroup] = None, rank: int = 2, start_iter: int = 10,
                  min_compression_rate: float = 2.0):
    """PowerSGD (Vogels et al. 2019): low-rank gradient compression with error feedback,
    its two all-reduces of the small P and Q factors run on braid collectives. Returns
    (state, hook) for ``ddp.register_comm_hook(state, hook)``; the first `start_iter`
    steps run uncompressed (warm-up), as PowerSGD recommends. torch's implementation is
    used as is: it is written against torch.distributed, which here is the braid backend.

    torch's hook issues a bucket's first all-reduce from the autograd thread and the next
    ones from future callbacks, so with several buckets the threads would interleave their
    collectives differently on different ranks. This wrapper runs bucket k's hook once
    bucket k-1's has finished, which orders every collective the same way on every rank;
    the buckets' compression still overlaps the backward pass."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    pg = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, BraidProcessGroup):
        raise _braid._usage("powersgd_hook needs a braid process group (backend 'braid')")
    state = psgd.PowerSGDState(process_group=pg, matrix_approximation_rank=rank, start_powerSGD_iter=start_iter,
                               min_compression_rate=min_compression_rate, use_error_feedback=True,
                               warm_start=True, random_seed=0)
    lock = threading.Lock()
    last: List[Optional[Future]] = [None]  # the previous bucket's result

    def hook(st, bucket) -> Future:
        # A private future of (error, value) and then(_unwrap), as _Completer does, so
        # that a failure fails the future for DDP's C++ side too.
        src: Future = Future()
        out = src.then(_unwrap)

        def run(_=None) -> None:
            try:
                fut = psgd.powerSGD_hook(st, bucket)
            except BaseException as e:  # noqa: BLE001 — handed to DDP through the future
                src.set_result((e, None))
                return

            def done(f: Future) -> None:
                try:
                    src.set_result((None, f.value()))
                except BaseException as e:  # noqa: BLE001
                    src.set_result((e, None))

            fut.add_done_callback(done)

        with lock:
            prev, last[0] = last[0], out
        if prev is None:
            run()
        else:
            prev.add_done_callback(run)  # at once when prev is done, else on its completing thread
        return out

    hook.__annotations__ = {"bucket": dist.GradBucket, "return": Future[torch.Tensor]}
    hook.__name__ = "braid_powersgd_hook"
    return state, hook
