#!/usr/bin/env python3
"""PyTorch's twin of examples/fashion_mnist_cuda on a GPU: the homework MLP (784-H-BN-ReLU-10),
LeNet-5, convbn or the small ResNet (tests/cnn_models.py's twins), Adam, cross-entropy, Fashion-MNIST in device memory, batch B, the last partial batch dropped.

Two ways, as the CUDA issue measured them: eager (fused Adam) and the whole step captured by hand as
one CUDA graph (torch.cuda.graph, capturable fused Adam; the batch gathered into the graph's static
inputs before each replay). With --precision bf16, forward and loss under torch.autocast (bf16; in
the graph with its cache off, as PyTorch's CUDA-graph notes ask). Prints one line per way:
  pytorch-gpu <model> <eager|graph>[_bf16] samples/s <rate> us/step <t> test_accuracy <acc>

usage: pytorch_gpu.py DATA_DIR [--model mlp|lenet|convbn|resnet] [--epochs N] [--batch B] [--hidden H] [--lr X]
                      [--modes eager,graph] [--precision fp32|bf16]
"""
import argparse
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def idx(path):
    d = gzip.open(path).read()
    ndim = d[3]
    dims = struct.unpack(">" + "I" * ndim, d[4:4 + 4 * ndim])
    return np.frombuffer(d, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(folder, device):
    # As xtrain's IDX reader: pixels / 255 as float32, labels as int64 here (PyTorch's loss wants them).
    def pair(prefix):
        x = idx(os.path.join(folder, prefix + "-images-idx3-ubyte.gz")).reshape(-1, 784).astype(np.float32) / 255.0
        y = idx(os.path.join(folder, prefix + "-labels-idx1-ubyte.gz")).astype(np.int64)
        return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    return pair("train"), pair("t10k")


def model_for(args, device):
    torch.manual_seed(42)
    nn = torch.nn
    if args.model == "resnet":
        # tests/cnn_models.py: beside this script in a gpu-check bundle, else in the source tree.
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:0] = [here, os.path.join(here, "..", "tests")]
        import cnn_models
        return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), cnn_models.resnet()).to(device)
    if args.model == "convbn":
        return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32),
                             nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Dropout(0.25),
                             nn.Linear(128, 10)).to(device)
    if args.model == "lenet":
        return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(400, 120),
                             nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10)).to(device)
    return nn.Sequential(nn.Linear(784, args.hidden), nn.BatchNorm1d(args.hidden), nn.ReLU(),
                         nn.Linear(args.hidden, 10)).to(device)


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        a = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return a


def run(mode, args, train, test, device):
    x, y = train
    model = model_for(args, device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True, capturable=mode == "graph")
    b = args.batch
    steps = x.shape[0] // b
    bf16 = args.precision == "bf16"

    def loss_of(inputs, targets):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            return F.cross_entropy(model(inputs), targets)
    gen = torch.Generator(device=device)
    gen.manual_seed(42)
    if mode == "eager":
        def epoch():
            perm = torch.randperm(x.shape[0], device=device, generator=gen)
            for s in range(steps):
                i = perm[s * b:(s + 1) * b]
                opt.zero_grad(set_to_none=True)
                loss_of(x[i], y[i]).backward()
                opt.step()
    else:
        sx = torch.empty(b, 784, device=device)
        sy = torch.empty(b, dtype=torch.long, device=device)
        sx.copy_(x[:b])
        sy.copy_(y[:b])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before the capture, as PyTorch's docs do it
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                loss_of(sx, sy).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            loss_of(sx, sy).backward()
            opt.step()

        def epoch():
            perm = torch.randperm(x.shape[0], device=device, generator=gen)
            for s in range(steps):
                i = perm[s * b:(s + 1) * b]
                torch.index_select(x, 0, i, out=sx)
                torch.index_select(y, 0, i, out=sy)
                graph.replay()
    epoch()  # the first epoch: warm-up, not timed
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.epochs - 1):
        epoch()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    n = steps * (args.epochs - 1)
    acc = accuracy(model, *test)
    name = mode + ("_bf16" if bf16 else "")
    print(f"pytorch-gpu {args.model} {name} samples/s {n * b / seconds:.0f} us/step {1e6 * seconds / n:.2f} "
          f"test_accuracy {acc:.4f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--model", default="mlp", choices=["mlp", "lenet", "convbn", "resnet"])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--modes", default="eager,graph")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("pytorch-gpu: no CUDA device for PyTorch")
        return
    device = torch.device("cuda")
    print(f"pytorch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    train, test = load(args.data, device)
    for mode in args.modes.split(","):
        run(mode, args, train, test, device)


if __name__ == "__main__":
    main()
