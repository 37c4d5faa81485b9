"""The NumPy API across real processes (braidrun), against NumPy references, and
failures (dead peer, mismatched sizes, deadlines) surfacing as braid exceptions."""
import pytest


@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_every_dtype_op_count(run_ranks, n):
    p = run_ranks(n, "ranks_numpy.py", "allreduce")
    assert p.stdout.count("allreduce") >= n and "cases ok" in p.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_other_collectives(run_ranks, n):
    p = run_ranks(n, "ranks_numpy.py", "others")
    assert p.stdout.count("send/recv ok") == n


def test_async_work_and_split(run_ranks):
    p = run_ranks(4, "ranks_numpy.py", "async_work")
    assert p.stdout.count("GIL released while blocked ok") == 4


def test_tuner_explains_an_agreed_verdict(run_ranks):
    p = run_ranks(3, "ranks_numpy.py", "tuner")
    assert p.stdout.count("tuner ok") == 3, p.stdout


def test_communicators_over_named_transports(run_ranks):
    p = run_ranks(3, "ranks_numpy.py", "transports", timeout=120)
    assert p.stdout.count("transports ok: tcp,shm") == 3, p.stdout


def test_compressed_allreduce(run_ranks):
    p = run_ranks(2, "ranks_numpy.py", "compressed", check=False)
    if p.returncode != 0 and "SKIP:" in p.stdout:
        pytest.skip(p.stdout.split("SKIP:", 1)[1].splitlines()[0].strip())
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("compressed allreduce ok") == 2
    assert p.stdout.count("error feedback save/restore/reset from Python ok") == 2, p.stdout


def test_dead_peer_raises_remote_error(run_ranks):
    p = run_ranks(2, "ranks_errors.py", "dead_peer", timeout=90)
    assert "rank 0: RemoteError(peer=1)" in p.stdout, p.stdout
    assert "next call fails fast" in p.stdout


def test_survivors_shrink_and_go_on(run_ranks):
    p = run_ranks(3, "ranks_errors.py", "shrink", timeout=90)
    assert p.stdout.count("next all-reduce correct") == 2, p.stdout + p.stderr
    assert p.stdout.count("grown back to 3 ranks with a newcomer") == 2, p.stdout + p.stderr


def test_shrink_bench_times_two_rounds():
    """bench/shrink_bench.py (docs/reliability.md's recovery table) under braidrun
    --keep-going: 5 ranks, one killed per round, two rounds; every round's line is printed."""
    import subprocess
    import sys
    from pathlib import Path

    from conftest import braidrun_path
    bench = Path(__file__).resolve().parents[2] / "bench" / "shrink_bench.py"
    p = subprocess.run([braidrun_path(), "--keep-going", "-n", "5", "--timeout", "120", "--", sys.executable,
                        str(bench), "--victims", "1", "--rounds", "2", "--bytes", "65536"],
                       capture_output=True, text=True, timeout=150)
    assert p.returncode == 128 + 9, p.stdout + p.stderr  # the first victim's SIGKILL
    assert "round 0: 5 ranks, killed [1] -> 4" in p.stdout, p.stdout + p.stderr
    assert "round 1: 4 ranks, killed [1] -> 3" in p.stdout, p.stdout + p.stderr


def test_mismatched_send_recv_sizes(run_ranks):
    p = run_ranks(2, "ranks_errors.py", "size_mismatch", timeout=90)
    assert p.stdout.count("Error: braid") == 2, p.stdout


def test_per_call_timeout(run_ranks):
    p = run_ranks(2, "ranks_errors.py", "timeout", timeout=90)
    assert "rank 0: TimeoutError after" in p.stdout, p.stdout


def test_ctrl_c_interrupts_a_blocking_wait(run_ranks):
    p = run_ranks(2, "ranks_errors.py", "interrupt", timeout=60)
    assert "rank 0: KeyboardInterrupt after 1." in p.stdout, p.stdout


def test_torchrun_launch():
    """braid.init() under torchrun: the store at MASTER_PORT is torch's, reached through torch."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    from conftest import HERE

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(HERE / "ranks_numpy.py"), "others"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "BRAID_TIMEOUT": "60s"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("send/recv ok") == 2, p.stdout


def test_device_arrays_without_a_device_runtime_are_refused_not_dereferenced(run_ranks):
    """Issue 34: a CUDA array (__cuda_array_interface__ or DLPack) handed to a braid that has
    no device runtime raised SIGSEGV on every rank; now UnsupportedError naming it."""
    p = run_ranks(2, "ranks_device.py", "refused", env={"BRAID_GPU_BACKEND": "none"})
    assert p.stdout.count("device arrays refused ok") == 2, p.stdout


def test_device_arrays_on_the_emulated_device_runtime(run_ranks):
    """__cuda_array_interface__ producers (CuPy/Numba-shaped) as device buffers, on the
    host emulation of the device runtime (no GPU here; docs/gpu.md)."""
    p = run_ranks(3, "ranks_device.py", "collectives", env={"BRAID_GPU_BACKEND": "emulated"})
    assert p.stdout.count("device arrays ok") == 3, p.stdout
