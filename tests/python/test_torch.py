"""The torch.distributed backend "braid" against torch's own gloo backend, and DDP."""
import pytest

pytest.importorskip("torch")

ENV = {"GLOO_SOCKET_IFNAME": "lo"}  # gloo's traffic stays on loopback


@pytest.mark.parametrize("n", [2, 3])
def test_backend_equals_gloo(run_ranks, n):
    p = run_ranks(n, "ranks_torch.py", "vs_gloo", env=ENV, timeout=150)
    assert p.stdout.count("braid backend == gloo backend") == n


def test_ddp_matches_gloo(run_ranks):
    p = run_ranks(2, "ranks_torch.py", "ddp", env=ENV, timeout=150)
    assert p.stdout.count("DDP on braid == DDP on gloo") == 2


def test_ddp_int8_hook(run_ranks):
    p = run_ranks(2, "ranks_torch.py", "ddp_compressed", env=ENV, timeout=150, check=False)
    if p.returncode != 0 and "SKIP:" in p.stdout:
        pytest.skip(p.stdout.split("SKIP:", 1)[1].splitlines()[0].strip())
    assert p.returncode == 0, p.stdout + p.stderr


def test_error_feedback_hook_follows_ddp_bucket_rebuild(run_ranks):
    p = run_ranks(2, "ranks_torch.py", "ddp_rebuild", env=ENV, timeout=200)
    assert p.stdout.count("error feedback follows DDP's bucket rebuild") == 2, p.stdout


def test_error_feedback_hook_checkpoint_resumes_bit_for_bit(run_ranks):
    p = run_ranks(2, "ranks_torch.py", "ddp_checkpoint", env=ENV, timeout=200)
    assert p.stdout.count("resumed from a checkpoint == uninterrupted, bit for bit") == 4, p.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_coalesced_and_uneven_collectives_equal_gloo(run_ranks, n):
    p = run_ranks(n, "ranks_torch.py", "coalesced_and_uneven", env=ENV, timeout=150)
    assert p.stdout.count("coalesced and uneven collectives == gloo") == n, p.stdout


def test_work_wait_honors_its_timeout(run_ranks):
    p = run_ranks(2, "ranks_torch.py", "wait_timeout", env=ENV, timeout=120)
    assert p.stdout.count("Work.wait(timeout) ok") == 2, p.stdout


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
