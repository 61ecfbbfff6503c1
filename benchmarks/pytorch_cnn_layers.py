#!/usr/bin/python3
"""Per-layer time of PyTorch's twin of a CNN example's training step, next to `--profile`.

Trains the model of `fashion_mnist_cnn --model M` (tests/cnn_models.py) with Adam on
Fashion-MNIST, one thread: first `--steps` steps timed as a whole (the median step, no profiler
attached), then as many under torch.profiler (record_shapes, each step's wall time taken too).
Prints, per operator and input
shapes, the time per call (CPU total, children included) and the calls per step: the
convolutions forward (aten::conv2d) and backward (aten::convolution_backward) with their GFLOP/s,
BatchNorm, ReLU, the additions, pooling, the loss and Adam. Layers of one shape (the ResNet's
3.conv1, 3.conv2, 4.conv1 and 4.conv2) share a line: per call it is the per-layer time. Last,
the convolutions' share of the profiled steps' mean time and the share outside them. (On the
dev VM the first PyTorch steps of a fresh ResNet ran 2-3x slower than later ones: --skip.)

usage: pytorch_cnn_layers.py [--model resnet] [--steps 50] [--skip 15] [--batch 64]
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import cnn_models  # noqa: E402
import pytorch_cnn  # noqa: E402  (its load: the images as [N, 1, 28, 28] tensors)
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

TOP = ("aten::conv2d", "aten::convolution_backward", "aten::batch_norm", "aten::native_batch_norm_backward",
       "aten::relu_", "aten::relu", "aten::threshold_backward", "aten::add",
       "aten::adaptive_avg_pool2d", "aten::linear", "aten::cross_entropy_loss", "Optimizer.step#Adam.step")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=os.environ.get("XTRAIN_DATA_DIR") or "/usr/share/datasets/fashion-mnist")
    p.add_argument("--model", default="resnet", choices=sorted(cnn_models.MODELS))
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--skip", type=int, default=15)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=42)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    x_all, y_all = pytorch_cnn.load(a.data, "train")
    model = cnn_models.MODELS[a.model](int(y_all.max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    perm = torch.randperm(len(x_all))
    state = {"step": 0}

    def train_step():
        i = (state["step"] * a.batch) % (len(x_all) - a.batch)
        index = perm[i:i + a.batch]
        state["step"] += 1
        opt.zero_grad(set_to_none=False)
        loss_fn(model(x_all[index]), y_all[index]).backward()
        opt.step()

    for _ in range(a.skip):
        train_step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        train_step()
        times.append(time.perf_counter() - t0)
    step_us = statistics.median(times) * 1e6

    # The convolutions' output planes, for the forward FLOPs (conv2d records only its inputs).
    out_plane = {}
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            m.register_forward_hook(lambda mod, i, o: out_plane.__setitem__(
                (tuple(i[0].shape), tuple(mod.weight.shape)), (o.shape[2], o.shape[3])))
    train_step()  # the hooks' first call
    profiled = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(a.steps):
            t0 = time.perf_counter()
            train_step()
            profiled.append(time.perf_counter() - t0)
    profiled_us = sum(profiled) / len(profiled) * 1e6
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key not in TOP:
            continue
        shapes = [tuple(s) for s in e.input_shapes if s]
        per_call = e.cpu_time_total / e.count
        gflops = ""
        if e.key == "aten::conv2d":
            n = shapes[0][0]
            o, cg, kh, kw = shapes[1]
            oh, ow = out_plane.get((shapes[0], shapes[1]), (0, 0))
            gflops = f"{2.0 * n * o * oh * ow * cg * kh * kw / per_call * 1e-3:.1f} GFLOP/s"
        elif e.key == "aten::convolution_backward":  # (grad_out, input, weight): dW, and dx but for the stem
            (n, o, oh, ow), (_, c, _, _), (_, cg, kh, kw) = shapes[0], shapes[1], shapes[2]
            products = 2 if c > 1 else 1  # the first layer (one input channel) needs no input gradient
            gflops = f"{products * 2.0 * n * o * oh * ow * cg * kh * kw / per_call * 1e-3:.1f} GFLOP/s"
        rows.append((e.key, shapes[:3], per_call, e.count / a.steps, e.cpu_time_total / a.steps, gflops))
    rows.sort(key=lambda r: -r[4])
    print(f"pytorch {torch.__version__} | model {a.model} | batch {a.batch} | one thread | median step "
          f"{step_us:.0f} us over {a.steps} steps after {a.skip} (no profiler)")
    print(f"{'operator':34} {'input shapes':52} {'us/call':>8} {'calls/step':>10} {'us/step':>8}")
    conv = 0.0
    for key, shapes, per_call, calls, per_step, gflops in rows:
        if key in ("aten::conv2d", "aten::convolution_backward"):
            conv += per_step
        print(f"{key:34} {str(shapes)[:52]:52} {per_call:8.0f} {calls:10.1f} {per_step:8.0f} {gflops}")
    print(f"steps under the profiler: mean {profiled_us:.0f} us; the convolutions (forward and backward) "
          f"{conv:.0f} us of it: {100 * conv / profiled_us:.1f} %, outside them {100 * (1 - conv / profiled_us):.1f} %")


if __name__ == "__main__":
    main()
