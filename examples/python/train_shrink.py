"""Data-parallel training that keeps going when a rank dies (issue 39).

    braidrun --keep-going -n 4 python examples/python/train_shrink.py --plot shrink.png

The digits MLP of train_digits.py, trained with DistributedDataParallel over the braid
backend. Halfway through the second epoch, rank --victim (default: the last) kills itself
with SIGKILL, as an out-of-memory killer or a lost node would. The survivors' next
gradient all-reduce fails with an error naming the dead rank; each survivor then calls
braid.torch.shrink_group(), which agrees through the launcher's store on who is left and
returns a process group of the survivors, renumbered. The survivors rebuild DDP on it
(which broadcasts the parameters of the new rank 0, so that every survivor restarts from
one model even if the failed step had completed on some of them), agree on the step to
resume from, redo the failed step, and train to the end.

Then, on the same survivors and in the same job, a second run trains from scratch with
the smaller world from the start: the baseline. Rank 0 prints both runs' final test
accuracy and saves their loss curves (per step) with --plot.

braidrun must run with --keep-going: by default it ends the job when a rank dies. Under
torchrun, give --max-restarts 0 and note that torchrun's agent tears the group down on a
worker's death (its elastic restart is the alternative to shrinking).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--victim", type=int, default=-1, help="the rank that dies (default: the last)")
    ap.add_argument("--plot", default="", help="save the loss curves to this PNG (rank 0)")
    ap.add_argument("--timeout", type=float, default=30.0, help="the group's timeout in seconds")
    args = ap.parse_args()

    import numpy as np
    import torch
    import torch.distributed as dist
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.nn.parallel import DistributedDataParallel as DDP
    from datetime import timedelta

    import braid.torch as bt

    torch.set_num_threads(1)
    bt.init_process_group("braid", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    victim = args.victim if args.victim >= 0 else world - 1

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, digits.target, test_size=0.2, random_state=0,
                                              stratify=digits.target)
    x_te, y_te = torch.from_numpy(x_te), torch.from_numpy(y_te)

    def train(start_world, kill_at=None):
        """Trains from scratch; returns (test accuracy, (epoch, mean loss) per step, recovery seconds)."""
        group_rank, size = dist.get_rank(), dist.get_world_size()
        # Each rank's shard of the training set, fixed by its rank at the start of the run.
        xs, ys = torch.from_numpy(x_tr[group_rank::size]), torch.from_numpy(y_tr[group_rank::size])
        steps = len(xs) // args.batch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        gen = torch.Generator().manual_seed(1 + group_rank)
        curve, recovery = [], None
        step_total = args.epochs * steps
        s = 0
        perm = None
        while s < step_total:
            epoch, i = divmod(s, steps)
            if i == 0 or perm is None:
                perm = torch.randperm(len(xs), generator=gen)
            if kill_at is not None and s == kill_at and dist.get_rank() == victim and recovery is None:
                os.kill(os.getpid(), signal.SIGKILL)
            idx = perm[i * args.batch:(i + 1) * args.batch]
            try:
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(ddp(xs[idx]), ys[idx])
                loss.backward()
                opt.step()
                mean = loss.detach().clone()
                dist.all_reduce(mean)
                curve.append(((s + 1) / steps, mean.item() / dist.get_world_size()))
                s += 1
            except Exception as e:  # noqa: BLE001 — a collective of this step failed
                t0 = time.monotonic()
                print(f"rank {dist.get_rank()}: step {s} failed: {str(e).splitlines()[0][:160]}", flush=True)
                new = bt.shrink_group()  # the survivors agree on who is left
                ddp = DDP(model, process_group=new)  # broadcasts new rank 0's parameters
                opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
                # Resume where the new rank 0 stands: a survivor whose step had completed
                # before the failure reached it is one step ahead.
                where = torch.tensor([s, len(curve)])
                dist.broadcast(where, 0, group=new)
                s, kept = where.tolist()
                del curve[kept:]
                recovery = time.monotonic() - t0
                print(f"rank {dist.get_rank()} of {dist.get_world_size()} (was {group_rank}): resuming at step {s} "
                      f"after {recovery * 1000:.0f} ms", flush=True)
        with torch.no_grad():
            acc = (model(x_te).argmax(1) == y_te).float().mean().item()
        return acc, curve, recovery

    steps_per_epoch = len(x_tr[0::world]) // args.batch
    acc_a, curve_a, recovery = train(world, kill_at=steps_per_epoch + steps_per_epoch // 2)
    small = dist.get_world_size()
    acc_b, curve_b, _ = train(small)  # the smaller world from the start, on the same survivors

    if dist.get_rank() == 0:
        print(f"\n{world} ranks, rank {victim} killed at step {steps_per_epoch + steps_per_epoch // 2} "
              f"(halfway through epoch 2): survivors recovered in {recovery * 1000:.0f} ms and trained to the end: "
              f"test accuracy {acc_a * 100:.2f}%, final loss {curve_a[-1][1]:.4f}")
        print(f"{small} ranks from the start: test accuracy {acc_b * 100:.2f}%, final loss {curve_b[-1][1]:.4f}")
        if args.plot:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(figsize=(6, 4))
            ax.plot(*zip(*curve_a), label=f"{world} ranks, rank {victim} killed ({acc_a * 100:.1f}%)")
            ax.plot(*zip(*curve_b), label=f"{small} ranks from the start ({acc_b * 100:.1f}%)", alpha=0.8)
            ax.axvline(1.5, color="grey", linestyle=":", label="SIGKILL")
            ax.set_xlabel("epoch")
            ax.set_ylabel("training loss (mean over ranks)")
            ax.set_yscale("log")
            ax.set_title("digits MLP, braid backend: shrink and continue")
            ax.legend()
            fig.tight_layout()
            fig.savefig(args.plot, dpi=120)
            print(f"loss curves: {args.plot}")
        sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
