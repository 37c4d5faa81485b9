"""The torch.distributed backend "braid" against torch's own gloo backend, and DDP."""
import pytest

pytest.importorskip("torch")

ENV = {"GLOO_SOCKET_IFNAME": "lo"}  # gloo's traffic stays on loopback


# Scenarios of ranks_torch.py that print one line per rank (or per check) when they pass:
# (test id, ranks, scenario, the line, how many times, timeout in s).
SCENARIOS = [
    ("backend_equals_gloo_2", 2, "vs_gloo", "braid backend == gloo backend", 2, 150),
    ("backend_equals_gloo_3", 3, "vs_gloo", "braid backend == gloo backend", 3, 150),
    ("ddp_matches_gloo", 2, "ddp", "DDP on braid == DDP on gloo", 2, 150),
    ("error_feedback_hook_follows_ddp_bucket_rebuild", 2, "ddp_rebuild",
     "error feedback follows DDP's bucket rebuild", 2, 200),
    ("error_feedback_hook_checkpoint_resumes_bit_for_bit", 2, "ddp_checkpoint",
     "resumed from a checkpoint == uninterrupted, bit for bit", 6, 200),
    ("coalesced_and_uneven_collectives_equal_gloo_2", 2, "coalesced_and_uneven",
     "coalesced and uneven collectives == gloo", 2, 150),
    ("coalesced_and_uneven_collectives_equal_gloo_3", 3, "coalesced_and_uneven",
     "coalesced and uneven collectives == gloo", 3, 150),
    ("work_wait_honors_its_timeout", 2, "wait_timeout", "Work.wait(timeout) ok", 2, 120),
    ("groups_are_named_and_destroyed_one_by_one", 2, "groups", "named groups destroyed one by one", 2, 120),
    ("functional_collectives_dtensor_and_fsdp2_equal_gloo", 2, "fsdp2_dtensor",
     "functional collectives, DTensor and FSDP2 on braid == gloo", 2, 150),
    ("fp8_tensors_reduce_gather_and_broadcast_3", 3, "fp8", "fp8 all_reduce, all_gather and broadcast ok", 3, 120),
    ("premul_sum_and_uneven_blocks_3", 3, "premul", "premul_sum and uneven blocks ok", 3, 120),
]


@pytest.mark.parametrize("n,scenario,line,times,timeout", [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_scenario(run_ranks, n, scenario, line, times, timeout):
    p = run_ranks(n, "ranks_torch.py", scenario, env=ENV, timeout=timeout)
    assert p.stdout.count(line) == times, p.stdout


def test_ddp_int8_hook(run_ranks):
    p = run_ranks(2, "ranks_torch.py", "ddp_compressed", env=ENV, timeout=150, check=False)
    if p.returncode != 0 and "SKIP:" in p.stdout:
        pytest.skip(p.stdout.split("SKIP:", 1)[1].splitlines()[0].strip())
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("int8-compressed DDP of a bf16 model within") == 2, p.stdout


def test_monitored_barrier_names_the_ranks_that_did_not_arrive(run_ranks):
    p = run_ranks(4, "ranks_torch.py", "monitored", env=ENV, timeout=150)
    assert p.stdout.count("monitored_barrier passed") == 4, p.stdout
    assert "rank 0: named: braid Timeout: monitored_barrier: ranks 2, 3 did not arrive" in p.stdout, p.stdout
    assert "rank 1: named: braid Timeout: rank 1: monitored_barrier got no answer from rank 0" in p.stdout, p.stdout


def test_dead_peer_fails_the_work(run_ranks):
    p = run_ranks(2, "ranks_torch.py", "dead_peer", env=ENV, timeout=120)
    assert "rank 0: RemoteError(peer=1)" in p.stdout, p.stdout
    assert "queued future failed" in p.stdout and "later call: AbortedError" in p.stdout, p.stdout


def test_completer_stop_waits_for_its_helper_threads():
    # A helper still running a future's callbacks when the interpreter finalizes drops its
    # last torch references then, and the process aborts ("terminate called without an
    # active exception", one run in ten of the digits example). stop() must wait for it.
    import threading
    import time

    import braid.torch as bt

    c = bt._Completer("test")
    release = threading.Event()
    src, out = c.submit([], lambda: (release.wait(10), 1)[1])  # the waiter holds until released
    ran = []
    out.then(lambda f: (time.sleep(0.5), ran.append(f.value())))  # runs on a helper thread
    release.set()
    c.stop()
    left = [t.name for t in threading.enumerate() if t.name.startswith("braid-done-test")]
    assert not left, f"helper threads still running after stop(): {left}"
    assert ran == [1]


def test_completer_finishes_works_already_done_on_the_callers_thread():
    # A small call runs on the caller's thread and has finished when braid returns its Work:
    # its futures complete at once, there, without a dispatcher thread's hand-off.
    import threading

    import braid
    import braid.torch as bt

    c = bt._Completer("inline")
    try:
        src, out = c.submit([braid._C.Work()], lambda: threading.current_thread().name)
        assert out.done() and src.done()
        assert out.value() == threading.current_thread().name
    finally:
        c.stop()


def test_backend_is_registered_for_cpu_and_cuda_and_names_what_it_refuses():
    # One braid group serves CPU and CUDA tensors (torch keeps a ProcessGroup subclass as
    # the group itself). CUDA tensors cannot be made here (no GPU): a device neither CPU
    # nor CUDA shows the refusal, and the check of a CUDA-only path waits for a GPU run.
    import torch
    import torch.distributed as dist

    import braid
    import braid.torch as bt

    assert sorted(dist.Backend.backend_capability["braid"]) == ["cpu", "cuda"]
    with pytest.raises(braid.UnsupportedError, match="takes CPU and CUDA tensors"):
        bt._check(torch.empty(3, device="meta"), "x")
    assert bt._cuda_device([torch.zeros(2), torch.zeros(3)], "allreduce") is None
    with pytest.raises(braid.InvalidUsageError, match="one device"):
        bt._cuda_device([torch.zeros(2), torch.empty(2, device="meta")], "allreduce")
