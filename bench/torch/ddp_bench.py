"""ddp_bench: the time of one DDP training step (forward, backward with DDP's bucketed
gradient all-reduce, optimizer step) of an MLP on CPU, with ProcessGroupGloo and with braid's
backend, uncompressed and with braid's compression hook, in one job, the configurations
alternating round by round.

    braidrun -n 4 -- python bench/torch/ddp_bench.py [--configs gloo,braid,int8,sign1] [--steps 5] [--rounds 7]

Across emulated hosts (scripts/vcluster.sh, docs/codecs.md "DDP step"), under mpirun:
    ... mpirun ... -x MASTER_ADDR=10.99.0.1 -x MASTER_PORT=29500 -x GLOO_SOCKET_IFNAME=eth0 \\
        -np 4 build-py/venv/bin/python bench/torch/ddp_bench.py

Configurations: "gloo" (DDP over a gloo group, torch's own all-reduce), "braid" (DDP over the
braid group, no hook), and any codec name ("fp16", "int8", "sign1", ...: DDP over the braid
group with braid.torch.compression_hook(codec), error feedback on) and "compute" (forward,
backward and step with no gradient exchange at all: the floor). Every configuration trains
its own copy of the same model (same seed) on the same batches. Each round runs every
configuration in a fresh random order (the same on every rank), `--steps` steps each after
one warm-up step; a round's figure is the slowest rank's mean step time. Rank 0 prints per
configuration the median over rounds, in ms, and Gloo's median divided by it (> 1: faster
than Gloo).

The default model is 1024-2048-1024-1024 with ReLU (5.25M parameters, 21 MB of f32
gradients, two DDP buckets at the default bucket_cap_mb), batch 64."""
import argparse
import os
import random
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import braid.torch as bt


def model_of(widths, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="compute,gloo,braid,int8,sign1")
    ap.add_argument("--widths", default="1024,2048,1024,1024")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per configuration and round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (25: its default)")
    a = ap.parse_args()

    # Under mpirun (no torchrun), torch's env:// rendezvous takes its rank from Open MPI's.
    for ours, theirs in (("RANK", "OMPI_COMM_WORLD_RANK"), ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")):
        if ours not in os.environ and theirs in os.environ:
            os.environ[ours] = os.environ[theirs]
    bt.init_process_group("braid")
    gloo = dist.new_group(backend="gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    widths = [int(w) for w in a.widths.split(",")]
    configs = a.configs.split(",")

    runs = {}
    for c in configs:
        m = model_of(widths, 0)
        if c == "compute":
            net = m
        elif c == "gloo":
            net = DDP(m, process_group=gloo, bucket_cap_mb=a.bucket_cap_mb)
        else:
            net = DDP(m, bucket_cap_mb=a.bucket_cap_mb)  # the default group: braid
            if c != "braid":
                net.register_comm_hook(None, bt.compression_hook(c, error_feedback=True, name=f"bench-{c}"))
        runs[c] = (net, torch.optim.SGD(net.parameters(), lr=1e-3))
    nparams = sum(p.numel() for p in runs[configs[0]][0].parameters())

    gen = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(a.batch, widths[0], generator=gen)
    y = torch.randn(a.batch, widths[-1], generator=gen)
    loss_fn = nn.MSELoss()

    def step(c: str) -> None:
        net, opt = runs[c]
        opt.zero_grad(set_to_none=False)
        loss_fn(net(x), y).backward()
        opt.step()

    def timed(c: str) -> float:
        step(c)  # warm-up: DDP's first steps build and rebuild its buckets
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step(c)
        ms = (time.perf_counter() - t0) / a.steps * 1e3
        worst = torch.tensor([ms], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=gloo)
        return worst.item()

    if rank == 0:
        print(f"# ddp_bench: {size} ranks, MLP {a.widths} ({nparams / 1e6:.2f}M parameters), "
              f"batch {a.batch}, bucket_cap_mb {a.bucket_cap_mb}; {a.rounds} rounds of {a.steps} steps per configuration, order shuffled per round",
              flush=True)
    times = {c: [] for c in configs}
    order = random.Random(12345)
    for _ in range(a.rounds):
        shuffled = configs[:]
        order.shuffle(shuffled)
        for c in shuffled:
            times[c].append(timed(c))
    if rank == 0:
        ref = statistics.median(times["gloo"]) if "gloo" in times else None
        print(f"{'config':>10} {'ms/step':>9} {'range':>17} {'gloo/this':>10}")
        for c in configs:
            med = statistics.median(times[c])
            rng = f"{min(times[c]):.1f}-{max(times[c]):.1f}"
            rel = f"{ref / med:10.2f}" if ref else f"{'-':>10}"
            print(f"{c:>10} {med:9.1f} {rng:>17} {rel}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    main()
