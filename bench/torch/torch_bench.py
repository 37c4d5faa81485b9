"""torch_bench: dist.all_reduce of CPU tensors through braid's torch backend against
ProcessGroupGloo, in one job, the two alternating run by run.

    braidrun -n 2 -- python bench/torch/torch_bench.py [--sizes 1K,64K,1M,16M] [--iters N] [--runs R]

Each run times N calls, each waited (work.wait()), after a warm-up; rank 0 prints per size
the median over R runs of each backend's time per call (the slowest rank's), and braid's
ratio to Gloo (< 1: braid faster). f32 sum, in place."""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import braid.torch as bt


def parse_size(s: str) -> int:
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1].upper()] if s[-1].upper() in m else int(s)


def timed(group, t: torch.Tensor, iters: int) -> float:
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group, async_op=True).wait()
    us = (time.perf_counter() - t0) / iters * 1e6
    worst = torch.tensor([us], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return worst.item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1K,64K,1M,16M")
    ap.add_argument("--iters", type=int, default=0, help="calls per run (0: by size, 1000 at 1 KiB)")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    bt.init_process_group("braid")
    gloo = dist.new_group(backend="gloo")
    rank = dist.get_rank()
    if rank == 0:
        print(f"# torch_bench: {dist.get_world_size()} ranks, f32 sum in place, each call waited; "
              f"median of {a.runs} runs, time per call in us")
        print(f"{'size':>8} {'braid':>10} {'gloo':>10} {'braid/gloo':>11}")
    for size in [parse_size(s) for s in a.sizes.split(",")]:
        t = torch.ones(size // 4, dtype=torch.float32)
        iters = a.iters or max(10, min(1000, (64 << 20) // max(size, 1) // 64))
        timed(None, t, 10)
        timed(gloo, t, 10)
        b, g = [], []
        for _ in range(a.runs):
            b.append(timed(None, t, iters))
            g.append(timed(gloo, t, iters))
        if rank == 0:
            mb, mg = statistics.median(b), statistics.median(g)
            label = f"{size >> 20}M" if size >= 1 << 20 else f"{size >> 10}K"
            print(f"{label:>8} {mb:10.1f} {mg:10.1f} {mb / mg:11.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
