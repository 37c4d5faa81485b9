"""One rank of a torch.distributed test job (started by braidrun from test_multirank.py).

The default group runs on gloo, a second group over the same ranks on braid; every
collective runs on both with the same inputs and the results must agree.
Usage: ranks_torch.py SCENARIO
"""
import sys

import torch
import torch.distributed as dist

import braid
import braid.torch as bt


def same(a, b, what, exact=False):
    if exact or not a.is_floating_point():
        ok = torch.equal(a, b)
    else:
        ok = torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    if not ok:
        raise AssertionError(f"{what}: braid {a.flatten()[:6].tolist()} != gloo {b.flatten()[:6].tolist()}")


def data(shape, dtype, rank, salt=0):
    g = torch.Generator().manual_seed(100 * rank + salt)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


def vs_gloo(braid_pg, gloo_pg):
    r, n = dist.get_rank(), dist.get_world_size()
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.int8):
        for numel in (1, 17, 5000):
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
                if op == dist.ReduceOp.PRODUCT and numel > 17:
                    continue
                x = data((numel,), dtype, r)
                a, b = x.clone(), x.clone()
                dist.all_reduce(a, op=op, group=braid_pg)
                dist.all_reduce(b, op=op, group=gloo_pg)
                same(a, b, f"all_reduce {op} {dtype} {numel}")
    x = data((3, 5), torch.float32, r)
    for root in range(n):
        a, b = x.clone(), x.clone()
        dist.broadcast(a, src=root, group=braid_pg)
        dist.broadcast(b, src=root, group=gloo_pg)
        same(a, b, f"broadcast {root}", exact=True)
        a, b = x.clone(), x.clone()
        dist.reduce(a, dst=root, group=braid_pg)
        dist.reduce(b, dst=root, group=gloo_pg)
        if r == root:
            same(a, b, f"reduce {root}")
    la = [torch.empty(3, 5) for _ in range(n)]
    lb = [torch.empty(3, 5) for _ in range(n)]
    dist.all_gather(la, x, group=braid_pg)
    dist.all_gather(lb, x, group=gloo_pg)
    for i in range(n):
        same(la[i], lb[i], "all_gather", exact=True)
    ta, tb = torch.empty(n * 3, 5), torch.empty(n * 3, 5)
    dist.all_gather_into_tensor(ta, x, group=braid_pg)
    dist.all_gather_into_tensor(tb, x, group=gloo_pg)
    same(ta, tb, "all_gather_into_tensor", exact=True)
    # reduce_scatter: gloo's reduce_scatter_tensor exists in recent torch; compare with the
    # all_reduce reference from gloo otherwise
    big = data((n * 4,), torch.float32, r, salt=1)
    out = torch.empty(4)
    dist.reduce_scatter_tensor(out, big, group=braid_pg)
    ref = big.clone()
    dist.all_reduce(ref, group=gloo_pg)
    same(out, ref[r * 4:(r + 1) * 4], "reduce_scatter_tensor")
    out2 = torch.empty(4)
    dist.reduce_scatter(out2, list(big.chunk(n)), group=braid_pg)
    same(out2, ref[r * 4:(r + 1) * 4], "reduce_scatter (list)")
    # all_to_all_single (alltoall_base) and all_to_all (lists)
    xa = data((n * 6,), torch.float32, r, salt=2)
    oa, ob = torch.empty(n * 6), torch.empty(n * 6)
    dist.all_to_all_single(oa, xa, group=braid_pg)
    dist.all_to_all_single(ob, xa, group=gloo_pg)
    same(oa, ob, "all_to_all_single", exact=True)
    ins = list(xa.chunk(n))
    outs = [torch.empty(6) for _ in range(n)]
    dist.all_to_all(outs, ins, group=braid_pg)
    same(torch.cat(outs), ob, "all_to_all", exact=True)
    # gather / scatter
    gl = [torch.empty(3, 5) for _ in range(n)] if r == 0 else None
    dist.gather(x, gl, dst=0, group=braid_pg)
    if r == 0:
        for i in range(n):
            same(gl[i], lb[i], "gather", exact=True)
    so = torch.empty(2)
    dist.scatter(so, [torch.full((2,), float(i)) for i in range(n)] if r == 0 else None, src=0, group=braid_pg)
    same(so, torch.full((2,), float(r)), "scatter", exact=True)
    # send / recv around the ring; async ops with futures
    right, left = (r + 1) % n, (r - 1) % n
    s = torch.full((9,), float(r))
    got = torch.empty(9)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, right, braid_pg),
                                   dist.P2POp(dist.irecv, got, left, braid_pg)])
    for q in reqs:
        q.wait()
    same(got, torch.full((9,), float(left)), "send/recv", exact=True)
    # Pairs with the rank itself, as NCCL and MPI accept (the receive posted first here).
    mine = torch.empty(9)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, mine, r, braid_pg),
                                   dist.P2POp(dist.isend, s, r, braid_pg)])
    for q in reqs:
        q.wait()
    same(mine, s, "send/recv to itself", exact=True)
    if r == 0:
        dist.send(torch.arange(4.0), dst=1, group=braid_pg)
    elif r == 1:
        t = torch.empty(4)
        dist.recv(t, src=0, group=braid_pg)
        same(t, torch.arange(4.0), "send/recv blocking", exact=True)
    y = torch.ones(1000)
    w = dist.all_reduce(y, group=braid_pg, async_op=True)
    fut = w.get_future()
    res = fut.then(lambda f: f.value()[0] * 2).wait()
    same(res, torch.full((1000,), 2.0 * n), "async all_reduce future", exact=True)
    assert w.is_completed()
    # A work that wait() returned from reads as completed at once (as PyTorch's test_isend
    # asks), every time: its future completes a moment later, from callbacks.
    for k in range(200):
        t = torch.full((8,), float(k))
        if r == 0:
            req = dist.isend(t, dst=n - 1, group=braid_pg)
        elif r == n - 1:
            req = dist.irecv(t, src=0, group=braid_pg)
        else:
            continue
        req.wait()
        assert req.is_completed() and req.is_success(), f"isend/irecv {k}: done but not completed"
    dist.barrier(group=braid_pg)
    # bfloat16 / float16 tensors through the braid group (gloo has no bf16 sum on CPU in every build)
    h = torch.full((33,), 1.5, dtype=torch.bfloat16)
    dist.all_reduce(h, group=braid_pg)
    same(h, torch.full((33,), 1.5 * n, dtype=torch.bfloat16), "bf16 all_reduce", exact=True)
    print(f"rank {r}: braid backend == gloo backend on every collective")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 10))


def _train(pg, hook=None, steps=6, dtype=torch.float32, accumulate=1):
    """DDP steps; with accumulate > 1, each step accumulates that many micro-batches, all
    but the last under no_sync() (gradient accumulation without communication)."""
    from contextlib import nullcontext

    from torch.nn.parallel import DistributedDataParallel as DDP

    r = dist.get_rank()
    model = DDP(_model().to(dtype), process_group=pg, bucket_cap_mb=0.004)  # several buckets
    if hook is not None:
        model.register_comm_hook(pg, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(7 + r)
    for _ in range(steps):
        opt.zero_grad()
        for micro in range(accumulate):
            x = torch.randn(32, 64, generator=g).to(dtype)
            y = torch.randint(0, 10, (32,), generator=g)
            with model.no_sync() if micro < accumulate - 1 else nullcontext():
                loss = torch.nn.functional.cross_entropy(model(x).float(), y)
                loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def ddp(braid_pg, gloo_pg):
    r = dist.get_rank()
    ref = _train(gloo_pg)
    for name, hook in (("default", None), ("compression_hook(codec=none)", bt.compression_hook("none"))):
        got = _train(braid_pg, hook)
        for i, (a, b) in enumerate(zip(got, ref)):
            if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
                raise AssertionError(f"DDP {name}: parameter {i} differs from gloo by {(a - b).abs().max()}")
    # the parameters really moved (the comparison is not between two untouched models)
    assert not torch.allclose(ref[0], _model()[0].weight.detach())
    # Gradient accumulation with no_sync() (PyTorch's test_accumulate_gradients_no_sync*
    # build their model for gloo, mpi and nccl by name only; this is what they check).
    ref = _train(gloo_pg, accumulate=3)
    for name, hook in (("default", None), ("compression_hook(codec=none)", bt.compression_hook("none"))):
        got = _train(braid_pg, hook, accumulate=3)
        for i, (a, b) in enumerate(zip(got, ref)):
            if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
                raise AssertionError(f"DDP no_sync {name}: parameter {i} differs from gloo by {(a - b).abs().max()}")
    print(f"rank {r}: DDP on braid == DDP on gloo after 6 steps (default and hook, and with no_sync accumulation)")


def ddp_compressed(braid_pg, gloo_pg):
    try:
        bt.get_communicator(braid_pg).allreduce(torch.ones(8), codec="int8", ef_key="probe")
    except braid.UnsupportedError as e:
        print(f"SKIP: {e}")
        sys.exit(3)
    ref = _train(gloo_pg, steps=10)
    got = _train(braid_pg, bt.compression_hook("int8"), steps=10)
    err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, ref))
    assert err < 0.05, f"int8 DDP drifted from gloo by {err}"
    print(f"rank {dist.get_rank()}: int8-compressed DDP within {err:.4f} of gloo")
    # bf16 gradients (a bf16 model): compressed inside braid with f32 accumulation, against
    # the same model's uncompressed bf16 DDP on braid.
    comm = bt.get_communicator(braid_pg)
    before = sum(o["calls"] for o in comm.metrics()["operations"] if o["codec"].startswith("int8"))
    ref16 = _train(braid_pg, None, steps=10, dtype=torch.bfloat16)
    got16 = _train(braid_pg, bt.compression_hook("int8"), steps=10, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in got16)
    after = sum(o["calls"] for o in comm.metrics()["operations"] if o["codec"].startswith("int8"))
    assert after - before >= 10, f"the bf16 buckets were not compressed ({after - before} int8 calls)"
    err16 = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(got16, ref16))
    assert err16 < 0.05, f"int8 DDP of a bf16 model drifted from uncompressed by {err16}"
    print(f"rank {dist.get_rank()}: int8-compressed DDP of a bf16 model within {err16:.4f} of uncompressed")


class _UsedOutOfOrder(torch.nn.Module):
    """Layers registered in another order than the forward uses them, so that DDP's
    rebuild after the first iteration (buckets in gradient-ready order) changes the
    buckets' number, sizes and membership."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.out = torch.nn.Linear(32, 10)
        self.mid = torch.nn.Linear(48, 32)
        self.inp = torch.nn.Linear(64, 48)

    def forward(self, x):
        return self.out(torch.relu(self.mid(torch.relu(self.inp(x)))))


def _batches(steps, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(steps)]


def _steps(model, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def ddp_rebuild(braid_pg, gloo_pg):
    """Error-feedback hooks across DDP's bucket rebuild: the buckets of iteration 0 differ
    from the later ones in number and size; every codec that takes error feedback trains
    on, the residuals held afterwards are exactly those of the rebuilt buckets, and they
    are freed with the hook."""
    import gc

    from torch.nn.parallel import DistributedDataParallel as DDP

    r, n = dist.get_rank(), dist.get_world_size()
    comm = bt.get_communicator(braid_pg)
    batches = _batches(8, 11 + r)
    ref = _UsedOutOfOrder()
    ref_ddp = DDP(ref, process_group=gloo_pg, bucket_cap_mb=0.004)
    _steps(ref_ddp, torch.optim.SGD(ref_ddp.parameters(), lr=0.05), batches)
    before = comm.error_feedback_bytes()
    for codec in ("sign1", "topk:0.1", "int8"):
        model = _UsedOutOfOrder()
        ddp = DDP(model, process_group=braid_pg, bucket_cap_mb=0.004)
        hook = bt.compression_hook(codec, error_feedback=True)
        sizes = []  # per step, the bucket sizes the hook was given

        def spy(state, bucket, hook=hook, sizes=sizes):
            sizes[-1].append(bucket.buffer().numel())
            return hook(state, bucket)

        spy.__annotations__ = hook.__annotations__
        ddp.register_comm_hook(braid_pg, spy)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for b in batches:
            sizes.append([])
            _steps(ddp, opt, [b])
        first, later = sorted(sizes[0]), sorted(sizes[-1])
        assert first != later, f"the test model's buckets did not change at DDP's rebuild: {first} vs {later}"
        # What the library holds now: per rebuilt bucket, the worker residual (its whole
        # count) and, except for topk, the owner residual (this rank's shard of it).
        shard = 0 if codec.startswith("topk") else 1
        want = 4 * sum(c + shard * ((c * (r + 1)) // n - (c * r) // n) for c in later)
        held = comm.error_feedback_bytes() - before
        assert held == want, f"{codec}: {held} bytes of residuals held, the rebuilt buckets need {want}"
        err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(model.parameters(), ref.parameters()))
        assert err < 0.5, f"{codec}: trained {err:.3f} away from uncompressed gloo"
        print(f"rank {r}: {codec}+EF across the bucket rebuild {first} -> {later}: {err:.4f} from gloo")
        del ddp, hook, spy, opt
        gc.collect()
        assert comm.error_feedback_bytes() == before, f"{codec}: the hook's residuals outlived it"
    print(f"rank {r}: error feedback follows DDP's bucket rebuild")


class _StableBuckets(torch.nn.Module):
    """An MLP whose parameters are registered in gradient-ready order (output bias first),
    so DDP's buckets are the same before and after its rebuild: a resumed run then sees
    the buckets the uninterrupted run had, and can match it bit for bit."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        hid, out = torch.nn.Linear(64, 48), torch.nn.Linear(48, 10)
        self.out_b, self.out_w = torch.nn.Parameter(out.bias.detach()), torch.nn.Parameter(out.weight.detach())
        self.hid_b, self.hid_w = torch.nn.Parameter(hid.bias.detach()), torch.nn.Parameter(hid.weight.detach())

    def forward(self, x):
        return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, self.hid_w, self.hid_b)),
                                          self.out_w, self.out_b)


def ddp_checkpoint(braid_pg, gloo_pg):
    """A run stopped after 5 steps and resumed from torch.save'd model, optimizer and hook
    state matches the uninterrupted 10-step run bit for bit; resumed without the hook's
    state it does not (so the residuals are what the checkpoint carries). int8:sr also
    needs the step counter of its stochastic rounding, which the checkpoint carries too."""
    import io

    from torch.nn.parallel import DistributedDataParallel as DDP

    r = dist.get_rank()
    batches = _batches(10, 23 + r)

    def fresh(codec):
        ddp = DDP(_StableBuckets(), process_group=braid_pg)
        hook = bt.compression_hook(codec)
        ddp.register_comm_hook(braid_pg, hook)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9), hook

    for codec in ("sign1", "int8", "int8:sr"):
        ddp, opt, _ = fresh(codec)
        _steps(ddp, opt, batches)
        straight = [p.detach().clone() for p in ddp.parameters()]
        del ddp, opt

        ddp, opt, hook = fresh(codec)
        _steps(ddp, opt, batches[:5])
        buf = io.BytesIO()
        torch.save({"model": ddp.module.state_dict(), "opt": opt.state_dict(), "hook": hook.state_dict()}, buf)
        del ddp, opt, hook  # the first run's residuals go with its hook
        results = {}
        for with_hook in (True, False):
            buf.seek(0)
            ckpt = torch.load(buf)
            ddp, opt, hook = fresh(codec)
            ddp.module.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["opt"])
            if with_hook:
                hook.load_state_dict(ckpt["hook"])
            _steps(ddp, opt, batches[5:])
            results[with_hook] = all(torch.equal(a, b) for a, b in zip(ddp.parameters(), straight))
            del ddp, opt, hook
        assert results[True], f"{codec}: the resumed run differs from the uninterrupted one"
        assert not results[False], f"{codec}: resuming without the hook's residuals changed nothing"
        print(f"rank {r}: {codec}+EF resumed from a checkpoint == uninterrupted, bit for bit")


def wait_timeout(braid_pg, gloo_pg):
    """Work.wait(timeout) as c10d's: braid.TimeoutError while the peer is late, then the
    same work still completes with the right result."""
    import time
    from datetime import timedelta

    r, n = dist.get_rank(), dist.get_world_size()
    if r == 1:
        time.sleep(1.5)  # late to the all-reduce
    x = torch.full((1000,), float(r + 1))
    w = dist.all_reduce(x, group=braid_pg, async_op=True)
    if r == 0:
        t0 = time.monotonic()
        try:
            w.wait(timeout=timedelta(seconds=0.3))
        except braid.TimeoutError as e:
            took = time.monotonic() - t0
            assert 0.25 < took < 1.2, took
            assert "did not complete within 0.3 s" in str(e), str(e)
        else:
            raise AssertionError("wait(timeout) returned although the peer was 1.5 s late")
    assert w.wait()
    same(x, torch.full((1000,), float(n * (n + 1) // 2)), "all_reduce after a timed-out wait", exact=True)
    assert w.wait(timeout=timedelta(seconds=1))  # done: returns at once
    print(f"rank {r}: Work.wait(timeout) ok")


def coalesced_and_uneven(braid_pg, gloo_pg):
    """allreduce_coalesced (one collective), allgather_into_tensor_coalesced,
    reduce_scatter_tensor_coalesced, all_to_all with uneven splits (single and list
    forms, including empty blocks) and sparse all-reduce, each equal to gloo on the same
    inputs."""
    r, n = dist.get_rank(), dist.get_world_size()
    xs = [data((5, 3), torch.float32, r, 1), data((7,), torch.float32, r, 2), data((1,), torch.float32, r, 3)]
    a, b = [x.clone() for x in xs], [x.clone() for x in xs]
    braid_pg.allreduce_coalesced(a).wait()
    for t in b:
        dist.all_reduce(t, group=gloo_pg)
    for k in range(3):
        same(a[k], b[k], f"allreduce_coalesced tensor {k}")
    outs = [torch.empty(n * x.numel(), dtype=x.dtype) for x in xs]
    braid_pg.allgather_into_tensor_coalesced(outs, [x.reshape(-1) for x in xs]).wait()
    for k, x in enumerate(xs):
        ref = torch.empty(n * x.numel())
        dist.all_gather_into_tensor(ref, x.reshape(-1).contiguous(), group=gloo_pg)
        same(outs[k], ref, f"allgather_into_tensor_coalesced {k}", exact=True)
    ins = [data((n * 4,), torch.float32, r, 4), data((n * 2,), torch.float32, r, 5)]
    rs = [torch.empty(4), torch.empty(2)]
    braid_pg.reduce_scatter_tensor_coalesced(rs, ins).wait()
    for k, x in enumerate(ins):
        ref = torch.empty(x.numel() // n)
        dist.reduce_scatter_tensor(ref, x.clone(), group=gloo_pg)
        same(rs[k], ref, f"reduce_scatter_tensor_coalesced {k}")
    # Uneven splits: rank r sends (r + j) % 3 rows of 2 to rank j (0 rows included).
    in_splits = [(r + j) % 3 for j in range(n)]
    out_splits = [(j + r) % 3 for j in range(n)]
    x = data((sum(in_splits), 2), torch.float32, r, 6)
    oa, ob = torch.empty(sum(out_splits), 2), torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(oa, x, out_splits, in_splits, group=braid_pg)
    dist.all_to_all_single(ob, x, out_splits, in_splits, group=gloo_pg)
    same(oa, ob, "all_to_all_single with uneven splits", exact=True)
    ins_l = [data((in_splits[j] + 1,), torch.float32, r, 7 + j) for j in range(n)]
    outs_a = [torch.empty(out_splits[j] + 1) for j in range(n)]
    dist.all_to_all(outs_a, ins_l, group=braid_pg)
    # gloo's list form takes equal tensors only: its single form with splits is the reference
    ref = torch.empty(sum(out_splits) + n)
    dist.all_to_all_single(ref, torch.cat(ins_l), [s + 1 for s in out_splits], [s + 1 for s in in_splits],
                           group=gloo_pg)
    same(torch.cat(outs_a), ref, "all_to_all of uneven tensors", exact=True)
    # all_gather_coalesced (PyTorch's test_all_gather_coalesced_*: an empty tensor too)
    ins = [data((3,), torch.float32, r, 11), data((2, 4), torch.float32, r, 12), torch.empty(0)]
    oa = [[torch.empty(3), torch.empty(2, 4), torch.empty(0)] for _ in range(n)]
    ob = [[torch.empty(3), torch.empty(2, 4), torch.empty(0)] for _ in range(n)]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "will be deprecated"
        dist.all_gather_coalesced(oa, ins, group=braid_pg)
        dist.all_gather_coalesced(ob, ins, group=gloo_pg)
    for j in range(n):
        for k in range(3):
            same(oa[j][k], ob[j][k], f"all_gather_coalesced rank {j} tensor {k}", exact=True)
    # Sparse COO all-reduce (sum), as gloo's: torch's own cases (1-3 sparse dims, dense
    # dims), a rank with no entries, async; the result is coalesced in place.
    from torch.testing._internal.common_distributed import simple_sparse_reduce_tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # sparse invariant checks
        for inputs, _ in simple_sparse_reduce_tests(r, n, num_inputs=1):
            a, b = inputs[0].clone(), inputs[0].clone()
            dist.all_reduce(a, group=braid_pg)
            dist.all_reduce(b, group=gloo_pg)
            assert a.is_coalesced(), "sparse all-reduce left the result uncoalesced"
            same(a.to_dense(), b.coalesce().to_dense(), "sparse all_reduce", exact=True)
        none = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0), (n,))
        mine = torch.sparse_coo_tensor(torch.tensor([[r]]), torch.tensor([r + 1.0]), (n,))
        a = none.clone() if r == 0 else mine
        dist.all_reduce(a, group=braid_pg, async_op=True).wait()
        same(a.to_dense(), torch.tensor([0.0] + [j + 1.0 for j in range(1, n)]), "sparse, rank 0 empty", exact=True)
        try:
            dist.all_reduce(mine.clone(), op=dist.ReduceOp.MAX, group=braid_pg)
        except braid.UnsupportedError as e:
            assert "sums only" in str(e), e
        else:
            raise AssertionError("sparse all-reduce took MAX")
    try:
        braid_pg.allreduce_coalesced([torch.ones(2), torch.ones(2, dtype=torch.float64)])
    except braid.InvalidUsageError as e:
        assert "several dtypes" in str(e), e
    else:
        raise AssertionError("allreduce_coalesced took tensors of two dtypes")
    print(f"rank {r}: coalesced and uneven collectives == gloo")


def dead_peer(braid_pg, gloo_pg):
    """A peer that dies fails the braid group's Work with the library's message, naming it."""
    import os
    dist.barrier(group=braid_pg)
    if dist.get_rank() == 1:
        os._exit(0)
    w1 = dist.all_reduce(torch.ones(1 << 14), group=braid_pg, async_op=True)
    w2 = dist.all_reduce(torch.ones(1 << 14), group=braid_pg, async_op=True)
    try:
        w1.wait()
    except braid.RemoteError as e:
        print(f"rank 0: RemoteError(peer={e.peer}): {e}")
        assert e.peer == 1 and "braid RemoteError" in str(e), str(e)
    else:
        raise AssertionError("all_reduce with a dead peer succeeded")
    # the future of the call queued behind it fails too (DDP reads futures)
    try:
        w2.get_future().wait()
    except Exception as e:  # noqa: BLE001 — torch wraps callback errors in RuntimeError
        assert "braid " in str(e), str(e)
        print("rank 0: queued future failed: " + str(e).splitlines()[0][:120])
    else:
        raise AssertionError("a failed group completed a queued all_reduce")
    try:  # and every later call fails fast
        dist.all_reduce(torch.ones(4), group=braid_pg)
    except braid.AbortedError:
        print("rank 0: later call: AbortedError")
    else:
        raise AssertionError("a failed group accepted a new all_reduce")
    os._exit(0)  # the gloo group would wait for rank 1 at shutdown


def monitored(braid_pg, gloo_pg):
    """monitored_barrier as gloo's: passes when every rank arrives; otherwise rank 0 names
    the ranks that did not (all of them with wait_all_ranks) and the others time out
    waiting for rank 0's answer."""
    import os
    import time
    from datetime import timedelta

    r = dist.get_rank()
    bt.monitored_barrier(braid_pg, timeout=timedelta(seconds=20))
    braid_pg.monitored_barrier(timedelta(seconds=20), wait_all_ranks=True)
    print(f"rank {r}: monitored_barrier passed")
    t0 = time.monotonic()
    if r >= 2:  # ranks 2 and 3 never arrive
        time.sleep(4)
        os._exit(0)
    try:
        bt.monitored_barrier(braid_pg, timeout=timedelta(seconds=1), wait_all_ranks=True)
    except braid.TimeoutError as e:
        took = time.monotonic() - t0
        assert took < 3.5, f"took {took:.1f} s with a 1 s timeout"
        if r == 0:
            assert "ranks 2, 3 did not arrive within 1 s" in str(e) and e.peer == 2, str(e)
        else:
            assert "rank 1: monitored_barrier got no answer from rank 0 within 1 s" in str(e), str(e)
        print(f"rank {r}: named: {str(e).splitlines()[0][:100]}")
    else:
        raise AssertionError("monitored_barrier passed without ranks 2 and 3")
    try:
        bt.monitored_barrier(gloo_pg)
    except braid.InvalidUsageError as e:
        assert "needs a braid process group" in str(e), str(e)
    else:
        raise AssertionError("braid's monitored_barrier accepted a gloo group")
    os._exit(0)  # the gloo group would wait for ranks 2 and 3 at shutdown


def groups(braid_pg, gloo_pg):
    """Named groups that can be destroyed one by one (PyTorch's test_destroy_group): the
    names torch gives, a group destroyed while the others keep working."""
    r, n = dist.get_rank(), dist.get_world_size()
    sub = dist.new_group(backend="braid")
    names = {braid_pg.group_name, sub.group_name, gloo_pg.group_name}
    assert len(names) == 3 and "" not in names, names
    t = torch.ones(4)
    dist.all_reduce(t, group=sub)
    dist.destroy_process_group(sub)
    dist.all_reduce(t, group=braid_pg)  # the other braid group still works
    same(t, torch.full((4,), float(n * n)), "all_reduce after destroying another group", exact=True)
    print(f"rank {r}: named groups destroyed one by one")


def fsdp2_dtensor(braid_pg, gloo_pg):
    """Issue 36 item 3: the functional collectives, DTensor and FSDP2 (fully_shard) on a
    device mesh over a braid group, against the same on a gloo group: equal results."""
    import torch.distributed._functional_collectives as fc
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, pg in (("braid", braid_pg), ("gloo", gloo_pg)):
        mesh = DeviceMesh.from_group(pg, "cpu")
        x = data((6, 4), torch.float32, r)
        got = [fc.wait_tensor(fc.all_reduce(x, "sum", pg)),
               fc.wait_tensor(fc.all_gather_single(x, 0, pg)),
               fc.wait_tensor(fc.reduce_scatter_single(torch.cat([x] * n), "sum", 0, pg)),
               fc.wait_tensor(fc.broadcast(x, n - 1, pg)),
               fc.wait_tensor(fc.all_to_all_single(torch.cat([x] * n), None, None, pg))]
        full = data((8, 6), torch.float32, 0)  # the same on every rank
        dt = distribute_tensor(full, mesh, [Shard(0)])
        assert torch.equal(dt.redistribute(mesh, [Replicate()]).to_local(), full), f"{name}: DTensor round trip"
        got.append((dt * 2).sum().full_tensor())  # a partial sum reduced across the mesh
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            loss = model(data((8, 16), torch.float32, r, salt=step)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        got += [p.full_tensor() for p in model.parameters()]
        out[name] = got
    for i, (a, b) in enumerate(zip(out["braid"], out["gloo"])):
        same(a, b, f"fsdp2_dtensor result {i}")
    print(f"rank {r}: functional collectives, DTensor and FSDP2 on braid == gloo")


def fp8(braid_pg, gloo_pg):
    """float8_e4m3fn / float8_e5m2 tensors on the braid backend (gloo has no fp8): sums of
    multiples of 1/4 small enough to stay exact in any order, min, max, saturation at the
    largest finite value, all_gather and broadcast, against references built here."""
    r, n = dist.get_rank(), dist.get_world_size()

    def bits(t):
        return t.view(torch.uint8)

    for dtype, k, top in ((torch.float8_e4m3fn, 2, 448.0), (torch.float8_e5m2, 1, 57344.0)):
        def vals(rank):
            g = torch.Generator().manual_seed(1000 + rank)
            return torch.randint(-k, k + 1, (1001,), generator=g).float() * 0.25

        x = vals(r).to(dtype)
        for op, ref in ((dist.ReduceOp.SUM, lambda a, b: a + b), (dist.ReduceOp.MAX, torch.maximum),
                        (dist.ReduceOp.MIN, torch.minimum)):
            want = vals(0)
            for q in range(1, n):
                want = ref(want, vals(q))
            y = x.clone()
            dist.all_reduce(y, op=op, group=braid_pg)
            assert torch.equal(bits(y), bits(want.to(dtype))), f"{dtype} {op}: {y[:6].float().tolist()}"
        big = torch.full((7,), top).to(dtype)
        dist.all_reduce(big, group=braid_pg)  # n x max saturates to max: no NaN, no inf
        assert torch.equal(bits(big), bits(torch.full((7,), top).to(dtype))), f"{dtype} saturation: {big.tolist()}"
        outs = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(outs, x, group=braid_pg)
        for q in range(n):
            assert torch.equal(bits(outs[q]), bits(vals(q).to(dtype))), f"{dtype} all_gather block {q}"
        b = x.clone()
        dist.broadcast(b, src=n - 1, group=braid_pg)
        assert torch.equal(bits(b), bits(vals(n - 1).to(dtype))), f"{dtype} broadcast"
    print(f"rank {r}: fp8 all_reduce, all_gather and broadcast ok")


def premul(braid_pg, gloo_pg):
    """PREMUL_SUM (torch.distributed._make_nccl_premul_sum, which FSDP uses to fold the
    gradient division into the reduction; gloo has none): each rank's input times the
    factor, then the sum, in all_reduce, reduce and reduce_scatter_tensor, with a number or
    a one-element tensor as the factor; f16 inputs whose plain sum would overflow stay finite."""
    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.arange(12, dtype=torch.float32) * (r + 1)
    total = sum(q + 1 for q in range(n))
    for factor in (0.5, torch.tensor([0.25])):
        f = float(factor) if not isinstance(factor, torch.Tensor) else float(factor.item())
        y = x.clone()
        dist.all_reduce(y, op=dist._make_nccl_premul_sum(factor), group=braid_pg)
        assert torch.equal(y, torch.arange(12, dtype=torch.float32) * total * f), f"all_reduce {factor}: {y.tolist()}"
        z = x.clone()
        dist.reduce(z, dst=n - 1, op=dist._make_nccl_premul_sum(factor), group=braid_pg)
        if r == n - 1:
            assert torch.equal(z, y), f"reduce {factor}: {z.tolist()}"
        inp = torch.arange(3 * n, dtype=torch.float32) * (r + 1)
        out = torch.empty(3)
        dist.reduce_scatter_tensor(out, inp, op=dist._make_nccl_premul_sum(factor), group=braid_pg)
        want = torch.arange(3 * r, 3 * r + 3, dtype=torch.float32) * total * f
        assert torch.equal(out, want), f"reduce_scatter_tensor {factor}: {out.tolist()}"
    h = torch.full((5,), 40000.0, dtype=torch.float16)
    dist.all_reduce(h, op=dist._make_nccl_premul_sum(1.0 / n), group=braid_pg)
    assert torch.isfinite(h).all() and abs(float(h[0]) - 40000.0) < 200, f"f16: {h.tolist()}"
    # Uneven blocks, as NCCL allows them (gloo refuses): all_gather into outputs of their own
    # sizes (allgatherv), reduce_scatter of inputs of their own sizes (reduce_scatter_v), and
    # all_to_all_single with split sizes (alltoallv), empty blocks included.
    sizes = [(2 * q + 1) % 4 for q in range(n)]
    outs = [torch.full((sizes[q],), -1.0) for q in range(n)]
    dist.all_gather(outs, torch.arange(sizes[r], dtype=torch.float32) + 10 * r, group=braid_pg)
    for q in range(n):
        assert torch.equal(outs[q], torch.arange(sizes[q], dtype=torch.float32) + 10 * q), f"all_gather {q}: {outs[q]}"
    ins = [torch.arange(sizes[q], dtype=torch.float32) * (r + 1) + q for q in range(n)]
    out = torch.empty(sizes[r])
    dist.reduce_scatter(out, ins, group=braid_pg)
    want = sum(torch.arange(sizes[r], dtype=torch.float32) * (q + 1) + r for q in range(n))
    assert torch.equal(out, want), f"reduce_scatter: {out} != {want}"
    send_rows = [(r + q) % 3 for q in range(n)]
    recv_rows = [(q + r) % 3 for q in range(n)]
    x = torch.cat([torch.full((send_rows[q], 2), float(10 * r + q)) for q in range(n)])
    y = torch.empty(sum(recv_rows), 2)
    dist.all_to_all_single(y, x, recv_rows, send_rows, group=braid_pg)
    want = torch.cat([torch.full((recv_rows[q], 2), float(10 * q + r)) for q in range(n)])
    assert torch.equal(y, want), f"all_to_all_single: {y} != {want}"
    print(f"rank {r}: premul_sum and uneven blocks ok")


def main():
    bt.init_process_group("gloo")  # braid:// rendezvous under braidrun
    braid_pg = dist.new_group(backend="braid")
    assert isinstance(braid_pg, bt.BraidProcessGroup), type(braid_pg)
    assert braid_pg.getBackendName() == "braid"
    gloo_pg = dist.group.WORLD
    globals()[sys.argv[1]](braid_pg, gloo_pg)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
