#!/usr/bin/python3
"""PyTorch DDP (gloo, CPU, one thread per process) twin of bench_ddp: trains the homework model
(784-32-BN-ReLU-10) or the wide model (784-1024-ReLU-10) on Fashion-MNIST for a fixed number of
steps and prints training samples/s over all processes. Launch with benchmarks/torchrun.py
--nproc_per_node=N, or run alone for one process.

usage: pytorch_ddp.py --model homework|wide --batch B --steps S [--broadcast-buffers 0|1]
"""
import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import fashion_mnist  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["homework", "wide"], default="homework")
    p.add_argument("--batch", type=int, default=32, help="per process")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--broadcast-buffers", type=int, default=1)
    p.add_argument("--data", default=os.environ.get("XTRAIN_DATA_DIR") or "/usr/share/datasets/fashion-mnist")
    a = p.parse_args()
    torch.set_num_threads(1)
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    x, y = fashion_mnist.load(a.data, "train")
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    torch.manual_seed(42)
    if a.model == "homework":
        model = nn.Sequential(nn.Linear(784, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
    else:
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 10))
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, broadcast_buffers=bool(a.broadcast_buffers))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x), generator=g)  # one global permutation, this rank's shard of each batch
    global_batch = a.batch * world
    times = []
    for step in range(a.warmup + a.steps):
        start = (step * global_batch) % (len(x) - global_batch)
        index = perm[start + rank * a.batch: start + (rank + 1) * a.batch]
        t = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x[index]), y[index])
        loss.backward()
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t)
    if distributed:
        dist.barrier()
    total = sum(times)
    if rank == 0:
        print(f"pytorch ddp model={a.model} processes={world} batch/process={a.batch} "
              f"broadcast_buffers={a.broadcast_buffers}: {global_batch * a.steps / total:.0f} samples/s "
              f"({1e3 * total / a.steps:.3f} ms/step)")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
