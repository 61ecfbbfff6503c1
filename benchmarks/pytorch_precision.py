#!/usr/bin/python3
"""PyTorch's side of benchmarks/compare_precision: the same measurements as bench_precision.cpp,
one thread, printed as JSON lines {"group", "name", "precision", "value", "unit", ...}.

fp32 is plain PyTorch; bf16 is torch.autocast("cpu", dtype=torch.bfloat16) for GEMM, Linear and
the training step (PyTorch's mixed precision on CPU, oneDNN kernels), and bf16 tensors for the
activations. PyTorch 1.13's CPU autocast has no fp16: those rows are absent.
Each figure is the median of 7 timed repeats after a warm-up.
"""
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def median_seconds(fn, min_time=0.2):
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    reps = max(1, int(min_time / 7 / once))
    samples = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        samples.append((time.perf_counter() - t) / reps)
    return statistics.median(samples)


def emit(**row):
    print(json.dumps(row), flush=True)


def autocast(precision):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def gemm(precision):
    for m, n, k in [(32, 32, 784), (256, 1024, 784), (2048, 2048, 2048)]:
        a, w = torch.randn(m, k), torch.randn(n, k)

        def run():
            with autocast(precision):
                F.linear(a, w)
        s = median_seconds(run)
        emit(group="gemm", name=f"{m}x{n}x{k}", precision=precision, value=2e-9 * m * n * k / s, unit="GFLOP/s")


def linear(precision):
    for n, i, o in [(32, 784, 32), (256, 784, 1024)]:
        lin = nn.Linear(i, o)
        x = torch.randn(n, i, requires_grad=True)
        dy = torch.randn(n, o) * 0.01

        def run():
            with autocast(precision):
                y = lin(x)
            y.backward(dy.to(y.dtype))
        s = median_seconds(run)
        emit(group="linear", name=f"{n}x{i}x{o}", precision=precision, value=6e-9 * n * i * o / s, unit="GFLOP/s")


def train_step(precision):
    x_all, y_all = fashion_mnist.load(fashion_mnist.DEFAULT_DIR, "train")
    x_all, y_all = torch.from_numpy(x_all), torch.from_numpy(y_all)
    torch.manual_seed(42)
    models = {"homework": (nn.Sequential(nn.Linear(784, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10)), 32),
              "wide": (nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 10)), 256)}
    for name, (model, batch) in models.items():
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = nn.CrossEntropyLoss()
        state = {"k": 0}

        def run():
            k = state["k"] % (len(x_all) // batch)
            state["k"] += 1
            xb, yb = x_all[k * batch:(k + 1) * batch], y_all[k * batch:(k + 1) * batch]
            opt.zero_grad(set_to_none=True)
            with autocast(precision):
                out = model(xb)
            loss = loss_fn(out.float(), yb)
            loss.backward()
            opt.step()
        s = median_seconds(run, 0.5)
        emit(group="train_step", name=name, precision=precision, value=batch / s, unit="samples/s")


ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
               "gelu": lambda t: F.gelu(t), "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}


def activations(precision):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    for rows, cols in [(32, 32), (4096, 1024)]:
        for name, f in ACTIVATIONS.items():
            x0 = (torch.rand(rows, cols) * 8 - 4).to(dtype)
            dy = torch.randn(rows, cols).to(dtype)
            for backward in (False, True):
                x = x0.clone().requires_grad_(backward)

                def run():
                    y = f(x)
                    if backward:
                        x.grad = None
                        y.backward(dy)
                s = median_seconds(run)
                elem = torch.finfo(dtype).bits // 8
                emit(group="activation", name=name, shape=f"{rows}x{cols}", backward=backward, precision=precision,
                     value=s * 1e6, unit="us", bytes=rows * cols * elem * (2 if backward else 1))


def main():
    torch.set_num_threads(1)
    emit(group="info", name="torch", precision="", value=0, unit=torch.__version__)
    for precision in ("fp32", "bf16"):
        gemm(precision)
        linear(precision)
        train_step(precision)
        activations(precision)


if __name__ == "__main__":
    main()
