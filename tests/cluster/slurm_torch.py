"""A small torch job on braid's torch.distributed backend, under a real srun
(tests/cluster/slurm_test.sh, scripts/slurm.sh).

Rank, world size and the rendezvous address come from braid's own reading of the
launcher's variables (braid._C.launch_environment(): SLURM_PROCID, SLURM_NTASKS, the
step's first node, 15000 + job id mod 10000), handed to torch as tcp://: torch's env://
(what braid.torch.init_process_group picks outside braidrun) reads only torchrun's
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, which srun does not set. Under srun --mpi=pmix
braid derives no address (its own communicators get rank 0's store through PMIx), so
`address()` derives the one --mpi=none would. With no master address the backend's
communicator advertises an interface other hosts reach (it advertised 127.0.0.1 and hung
across nodes until that was fixed; docs/cluster.md, "srun (Slurm)").

Checks: an all_reduce of known values (sum over ranks), a broadcast from the last rank, an
all_gather, and DistributedDataParallel on a tiny linear model for a few steps, whose
parameters must stay identical on every rank. Prints one "slurm_torch ok" line per rank.
"""
import faulthandler
import os
import socket
import sys

import torch
import torch.distributed as dist

import braid
import braid.torch  # noqa: F401  (registers the "braid" backend)


def address(env):
    if env["master_addr"] and env["master_port"]:
        return env["master_addr"], env["master_port"]
    # srun --mpi=pmix: braid leaves the address to PMIx; take what --mpi=none would derive.
    nodes = os.environ["SLURM_STEP_NODELIST"]
    first = nodes.split(",")[0]
    if "[" in first:
        base, rest = first.split("[", 1)
        first = base + rest.split("-")[0].split(",")[0].rstrip("]")
    return first, 15000 + int(os.environ["SLURM_JOB_ID"]) % 10000


def main():
    faulthandler.dump_traceback_later(float(os.environ.get("SLURM_TORCH_TIMEOUT", "60")), exit=True)
    env = braid._C.launch_environment()
    rank, size = env["rank"], env["world_size"]
    host, port = address(env)
    dist.init_process_group("braid", init_method=f"tcp://{host}:{port}", rank=rank, world_size=size)
    assert dist.get_rank() == rank and dist.get_world_size() == size
    assert isinstance(dist.distributed_c10d._get_default_group(), braid.torch.BraidProcessGroup)

    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    want = size * (size + 1) / 2
    assert torch.all(t == want), f"all_reduce: got {t[:4].tolist()}, want {want}"

    b = torch.arange(16, dtype=torch.float64) * (rank + 1)
    dist.broadcast(b, src=size - 1)
    assert torch.equal(b, torch.arange(16, dtype=torch.float64) * size), "broadcast"

    out = [torch.empty(3, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(out, torch.tensor([rank, rank * 2, 7]))
    assert all(o.tolist() == [r, r * 2, 7] for r, o in enumerate(out)), "all_gather"

    torch.manual_seed(1234)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)  # different data per rank
    for _ in range(5):
        x, y = torch.randn(8, 32, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    assert torch.equal(lo, hi), "DDP: parameters differ between ranks"

    dist.barrier()
    print(f"slurm_torch ok: rank {rank} of {size} on {socket.gethostname()}, rendezvous {host}:{port}, "
          f"all_reduce {t[0].item():g}, ddp checksum {flat.sum().item():.6f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
