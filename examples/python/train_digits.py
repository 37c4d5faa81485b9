"""Data-parallel training of a small MLP on scikit-learn's bundled digits data set,
once per gradient codec, over the braid torch.distributed backend.

    braidrun -n 4 python examples/python/train_digits.py
    torchrun --nproc-per-node 4 examples/python/train_digits.py

Every rank trains on its shard of the training set; DistributedDataParallel averages
the gradients with braid's all-reduce, compressed inside the collective by the DDP
hook braid.torch.compression_hook(codec, error_feedback) (with --bucket-cap-mb 0.004
in buckets that change at DDP's rebuild after the first iteration, as a real model's
do, which error feedback follows); the last row is PowerSGD
(rank-2 low-rank factors, braid.torch.powersgd_hook) after two uncompressed warm-up
epochs. Rank 0 prints a table
(final test accuracy, final training loss, bytes this rank sent over TCP, wall time)
and saves the loss curves as a PNG.

Bytes are measured, not modelled: braid is told to use its TCP transport between the
local ranks (BRAID_TRANSPORT=tcp, unless --transport says otherwise) and the example
sums the kernel's per-socket bytes_acked counters (TCP_INFO) of this process before
and after each run. A codec this build of braid does not have is reported as
"unsupported in this build" instead of failing the job.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import time

CODECS = [  # (label, codec, error feedback)
    ("none", "none", False),
    ("fp16", "fp16", False),
    ("int8", "int8", False),
    ("sign1+EF", "sign1", True),
    ("topk+EF", "topk:0.01", True),
    ("powersgd", "powersgd", True),  # low-rank (rank 2) over plain braid all-reduces
    # More codecs, for the training-quality table of docs/codecs.md (--codecs all):
    ("bf16", "bf16", False),
    ("fp16+EF", "fp16", True),
    ("int8+EF", "int8", True),
    ("int4+EF", "int4", True),
    ("fp8+EF", "fp8e4m3", True),
    ("mxfp8+EF", "mxfp8", True),
    ("mxfp4+EF", "mxfp4", True),
]
DEFAULT_CODECS = "none,fp16,int8,sign1+EF,topk+EF,powersgd"


def make_model(kind: str, torch):
    """The MLP (64-128-10, 9,610 parameters) or a small convnet on the 8x8 images (two 3x3
    convolutions, 16 and 32 channels, a 2x2 max-pool, 512-64-10: 38,282 parameters)."""
    nn = torch.nn
    if kind == "mlp":
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10))


def tcp_bytes_sent() -> int:
    """Sum of tcpi_bytes_acked over this process's TCP sockets (Linux)."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
                if len(info) >= 128:
                    total += struct.unpack_from("Q", info, 120)[0]  # tcpi_bytes_acked
        except OSError:
            pass
        finally:
            s.close()
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16, help="per-rank batch size")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--codecs", default=DEFAULT_CODECS,
                    help="comma-separated subset of: " + ", ".join(c[0] for c in CODECS) + "; or 'all'")
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                    help="mlp: 64-128-10; cnn: two convolutions and two linear layers (38,282 parameters)")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0,
                    help="DDP bucket_cap_mb (25, DDP's default: one bucket for this model); 0.004 gives the "
                         "model's 9610 gradients one bucket in the first iteration and two after DDP rebuilds "
                         "them, as a real model's are")
    ap.add_argument("--seeds", type=int, default=1,
                    help="training runs per codec (model seeds 0..N-1); the table gives their means, which "
                         "tell a codec's effect from the run-to-run spread of a 360-image test set")
    ap.add_argument("--transport", default="tcp", help="BRAID_TRANSPORT for the run (tcp: bytes are measurable)")
    ap.add_argument("--plot", default="train_digits_loss.png", help="PNG of the loss curves ('' for none)")
    ap.add_argument("--json", default="", help="also write the results to this JSON file (rank 0)")
    args = ap.parse_args()

    if args.transport:
        os.environ["BRAID_TRANSPORT"] = args.transport  # read once, when braid first starts
    import numpy as np
    import torch
    import torch.distributed as dist
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.nn.parallel import DistributedDataParallel as DDP

    import braid
    import braid.torch as bt

    torch.set_num_threads(1)
    bt.init_process_group("braid")  # braid:// under braidrun, env:// under torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = bt.get_communicator()

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, digits.target, test_size=0.2, random_state=0,
                                              stratify=digits.target)
    x_tr, y_tr = torch.from_numpy(x_tr[rank::world]), torch.from_numpy(y_tr[rank::world])
    x_te, y_te = torch.from_numpy(x_te), torch.from_numpy(y_te)
    steps = len(x_tr) // args.batch

    def train_once(codec, ef, seed):
        """One training run: (test accuracy, loss curve, bytes this rank sent, seconds)."""
        torch.manual_seed(seed)
        model = make_model(args.model, torch)
        ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
        if codec == "powersgd":
            ddp.register_comm_hook(*bt.powersgd_hook(rank=2, start_iter=2 * steps))
        elif codec != "none":
            ddp.register_comm_hook(None, bt.compression_hook(codec, error_feedback=ef))
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        gen = torch.Generator().manual_seed(1 + rank + 1000 * seed)
        dist.barrier()
        b0, t0 = tcp_bytes_sent(), time.perf_counter()
        curve = []
        for _ in range(args.epochs):
            perm = torch.randperm(len(x_tr), generator=gen)
            total = torch.zeros(1)
            for s in range(steps):
                idx = perm[s * args.batch:(s + 1) * args.batch]
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(ddp(x_tr[idx]), y_tr[idx])
                loss.backward()
                opt.step()
                total += loss.detach()
            dist.all_reduce(total)  # mean loss over ranks and steps
            curve.append(total.item() / (world * steps))
        dist.barrier()
        seconds, sent = time.perf_counter() - t0, tcp_bytes_sent() - b0
        with torch.no_grad():
            acc = (model(x_te).argmax(1) == y_te).float().mean().item()
        return acc, curve, sent, seconds

    labels = [c[0] for c in CODECS] if args.codecs == "all" else args.codecs.split(",")
    unknown = [x for x in labels if x not in [c[0] for c in CODECS]]
    if unknown:
        ap.error(f"unknown codec label(s) {unknown}; choose from {[c[0] for c in CODECS]}")
    wanted = [c for c in CODECS if c[0] in labels]
    results = []
    for label, codec, ef in wanted:
        try:  # every rank gets the same answer: the library checks the codec before sending
            if codec != "powersgd":
                comm.allreduce(torch.zeros(64), codec="" if codec == "none" else codec,
                               ef_key=f"probe-{codec}" if ef else None)
        except braid.UnsupportedError as e:
            results.append((label, None, None, None, None, None, str(e)))
            continue
        runs = [train_once(codec, ef, seed) for seed in range(args.seeds)]
        curve = [sum(c) / len(runs) for c in zip(*(r[1] for r in runs))]
        results.append((label, sum(r[0] for r in runs) / len(runs), curve[-1], sum(r[2] for r in runs) // len(runs),
                        sum(r[3] for r in runs) / len(runs), curve, None))

    if rank == 0:
        print(f"\ntorch {torch.__version__}, {args.model}, {world} ranks, {args.epochs} epochs, {args.seeds} seed(s), "
              f"BRAID_TRANSPORT={os.environ.get('BRAID_TRANSPORT', 'auto')}")
        print(f"{'codec':<10} {'test acc':>9} {'loss':>8} {'bytes sent/rank':>16} {'vs none':>8} {'time s':>7}")
        base = next((r[3] for r in results if r[0] == "none" and r[3]), None)
        for label, acc, loss, sent, secs, _, why in results:
            if why is not None:
                print(f"{label:<10} unsupported in this build ({why})")
                continue
            ratio = f"{sent / base:.3f}" if base else "-"
            print(f"{label:<10} {acc * 100:8.2f}% {loss:8.4f} {sent:16,d} {ratio:>8} {secs:7.2f}")
        if args.plot and any(r[5] for r in results):
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(figsize=(6, 4))
            for label, acc, _, _, _, curve, why in results:
                if why is None:
                    ax.plot(range(1, len(curve) + 1), curve, label=f"{label} ({acc * 100:.1f}%)")
            ax.set_xlabel("epoch")
            ax.set_ylabel("training loss (mean over ranks)")
            ax.set_yscale("log")
            ax.set_title(f"digits {args.model.upper()}, {world} ranks, braid backend")
            ax.legend()
            fig.tight_layout()
            fig.savefig(args.plot, dpi=120)
            print(f"loss curves: {args.plot}")
        if args.json:
            import json
            with open(args.json, "w") as f:
                json.dump({"torch": torch.__version__, "world": world, "epochs": args.epochs, "seeds": args.seeds,
                           "results": [dict(codec=r[0], accuracy=r[1], loss=r[2], bytes_sent=r[3], seconds=r[4],
                                            curve=r[5], unsupported=r[6]) for r in results]}, f, indent=1)
        sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
