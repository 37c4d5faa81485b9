"""Single-process checks of the Python API: argument checking, exception classes,
a one-rank job. Multi-rank behaviour is in test_multirank.py and test_torch.py."""
import numpy as np
import pytest

import braid


@pytest.fixture(scope="module")
def comm():
    c = braid.init(timeout=30.0)  # no launcher variables: a job of one rank
    yield c
    c.close()


def test_one_rank_job(comm):
    assert (comm.rank, comm.size) == (0, 1)
    x = np.arange(10, dtype=np.float32)
    assert comm.allreduce(x) is x and np.array_equal(x, np.arange(10))
    assert np.array_equal(comm.allgather(x), x.reshape(1, 10))
    comm.barrier()


def test_gpu_status_answers_on_any_host():
    s = braid.gpu_status()
    assert isinstance(s, str) and s
    assert s.startswith(("not built with CUDA", "no GPU: ")) or s.endswith(("CUDA device", "CUDA devices"))


def test_exception_hierarchy():
    assert issubclass(braid.InvalidUsageError, braid.Error) and issubclass(braid.InvalidUsageError, ValueError)
    assert issubclass(braid.TimeoutError, braid.Error) and issubclass(braid.TimeoutError, TimeoutError)
    assert issubclass(braid.UnsupportedError, NotImplementedError)
    assert issubclass(braid.RemoteError, braid.Error) and issubclass(braid.Error, RuntimeError)
    assert braid.Error.__module__ == "braid"


@pytest.mark.parametrize("bad", [np.zeros(4, np.complex64), np.zeros(4, bool), np.zeros(4, ">f4")])
def test_wrong_dtype(comm, bad):
    with pytest.raises(braid.InvalidUsageError, match="dtype"):
        comm.allreduce(bad)


def test_fp8_dtypes_are_element_types(comm):
    """torch's float8 types map to braid's f8e4m3/f8e5m2; a one-rank all-reduce keeps the
    bits, and a codec is refused (the codecs take f32/f16/bf16 only)."""
    torch = pytest.importorskip("torch")
    assert braid._TORCH_DTYPE_NAMES["torch.float8_e4m3fn"] == braid._C.DataType.f8e4m3
    assert braid._TORCH_DTYPE_NAMES["torch.float8_e5m2"] == braid._C.DataType.f8e5m2
    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        x = torch.tensor([1.0, -0.5, 448.0 if dt == torch.float8_e4m3fn else 57344.0]).to(dt)
        before = x.view(torch.uint8).clone()
        assert comm.allreduce(x) is x and torch.equal(x.view(torch.uint8), before)
        with pytest.raises(braid.InvalidUsageError, match="f32, bf16 or f16"):
            comm.allreduce(x, codec="int8")
        assert torch.equal(x.view(torch.uint8), before)


def test_non_contiguous(comm):
    with pytest.raises(braid.InvalidUsageError, match="not C-contiguous"):
        comm.allreduce(np.zeros(10, np.float32)[::2])
    with pytest.raises(braid.InvalidUsageError, match="not C-contiguous"):
        comm.broadcast(np.zeros((4, 4), np.float32).T)


def test_mismatched_sizes(comm):
    with pytest.raises(braid.InvalidUsageError, match="input has 8 elements but output has 7"):
        comm.allreduce(np.zeros(8, np.float32), out=np.zeros(7, np.float32))
    with pytest.raises(braid.InvalidUsageError, match="one dtype"):
        comm.allreduce(np.zeros(8, np.float32), out=np.zeros(8, np.float64))
    with pytest.raises(braid.InvalidUsageError, match="size\\*count"):
        comm.allgather(np.zeros(8, np.float32), out=np.zeros(9, np.float32))


def test_read_only_and_foreign_objects(comm):
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(braid.InvalidUsageError, match="read-only"):
        comm.allreduce(ro)
    comm.allreduce(ro, out=np.zeros(4, np.float32))  # read-only input is fine out of place
    with pytest.raises(braid.InvalidUsageError, match="buffer protocol or DLPack"):
        comm.allreduce([1.0, 2.0])


def test_dlpack_producer_without_buffer_protocol(comm):
    class OnlyDLPack:  # exports memory through DLPack only, like many array libraries
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    a = np.arange(6, dtype=np.float64)
    comm.allreduce(OnlyDLPack(a), op="max")  # a size-1 job: the values stay, the call goes through
    assert np.array_equal(a, np.arange(6))
    g = comm.allgather(OnlyDLPack(a))
    assert np.array_equal(g[0], a)
    b = np.zeros(6)
    comm.allreduce(a, out=OnlyDLPack(b))  # the result lands in b's own memory: no copy
    assert np.array_equal(b, a)


def test_bad_options(comm):
    with pytest.raises(braid.InvalidUsageError, match="unknown reduction"):
        comm.allreduce(np.zeros(2, np.float32), op="median")
    with pytest.raises(braid.InvalidUsageError, match="unknown algorithm"):
        comm.allreduce(np.zeros(2, np.float32), algorithm="butterfly")


def test_library_errors_keep_message_and_code(comm):
    # checked by the C++ library, translated by the extension
    with pytest.raises(braid.InvalidUsageError) as e:
        comm.broadcast(np.zeros(2, np.float32), root=3)
    assert str(e.value).startswith("braid InvalidUsage: ") and e.value.code == "InvalidUsage"
    assert e.value.peer == -1


def test_codec_option_reaches_the_library(comm):
    x = np.ones(16, np.float32)
    try:
        comm.allreduce(x, codec="int8", ef_key="b0")
    except braid.UnsupportedError as e:
        assert "codec" in str(e) or "int8" in str(e), str(e)
        pytest.skip(f"this build has no compression: {e}")
    assert np.allclose(x, 1.0, atol=0.05)


def test_closed_communicator():
    c = braid.init()
    c.close()
    with pytest.raises(braid.InvalidUsageError, match="closed"):
        c.allreduce(np.zeros(2, np.float32))
    c.close()  # idempotent


def test_torch_tensors_without_copy(comm):
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32)
    assert comm.allreduce(t) is t
    with pytest.raises(braid.InvalidUsageError, match="not contiguous"):
        comm.allreduce(torch.zeros(4, 4).t())
    with pytest.raises(braid.InvalidUsageError, match="dtype"):
        comm.allreduce(torch.zeros(4, dtype=torch.complex64))
    # the collective writes the tensor's own memory: a view sees the result
    base = torch.ones(8)
    view = base[2:6]
    comm.allreduce(view, op="max")
    g = comm.allgather(torch.ones(3, dtype=torch.bfloat16))
    assert g.dtype == torch.bfloat16 and g.shape == (1, 3)


def test_completion_queue_reports_each_set_once_all_its_works_finished(comm):
    # The torch backend completes its futures from this queue (Work.on_complete underneath).
    from braid import _C

    q = _C.CompletionQueue()
    assert q.next(timeout=0.05) is None and q.ready() == 0  # nothing watched: times out
    a, b = np.ones(1 << 16, np.float32), np.ones(1 << 10, np.float64)
    works = [comm._impl.allreduce(x.ctypes.data, x.ctypes.data, x.size, dt, _C.ReduceOp.sum, 30.0,
                                  _C.Algorithm.auto, "", "", False)
             for x, dt in ((a, _C.DataType.f32), (b, _C.DataType.f64))]
    token = object()
    q.watch(works, token)
    got = q.next(timeout=30)
    assert got is not None and got[0] is token and got[1] is None
    assert all(w.test() for w in works)
    q.watch([], "empty set")  # reported at once
    assert q.next(timeout=5) == ("empty set", None)
    q.watch([_C.Work()], "before close")
    q.close()
    assert q.closed
    assert q.next() == ("before close", None)  # what finished before close() is still handed out
    assert q.next() is None  # then None, at once
