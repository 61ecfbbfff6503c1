#!/usr/bin/python3
"""torch.profiler over PyTorch's twin of the example's training steps: where a step's time goes.

The homework profiled 100 forward batches with torch.profiler; this profiles training steps
(forward, loss, backward, Adam) of the same model on the same data, one thread, with the schedule
the example's --profile uses (10 skipped, 5 warmup, N active), and prints per activation its
forward and backward operators' self CPU time per step and the step time (prefix "torch:").

usage: pytorch_profile.py --activation relu [--steps 200] [--batch 32] [--hidden 32]
"""
import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
import fashion_mnist  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

OPS = {  # the activation's forward and backward operators
    "relu": ("aten::relu", "aten::threshold_backward"),
    "tanh": ("aten::tanh", "aten::tanh_backward"),
    "sigmoid": ("aten::sigmoid", "aten::sigmoid_backward"),
    "gelu": ("aten::gelu", "aten::gelu_backward"),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=os.environ.get("XTRAIN_DATA_DIR") or "/usr/share/datasets/fashion-mnist")
    p.add_argument("--activation", default="relu", choices=sorted(OPS))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=32)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(42)
    x_all, y_all = (torch.from_numpy(v) for v in fashion_mnist.load(a.data, "train"))
    act = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU}[a.activation]
    model = nn.Sequential(nn.Linear(x_all.shape[1], a.hidden), nn.BatchNorm1d(a.hidden), act(), nn.Linear(a.hidden, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    perm = torch.randperm(len(x_all))
    total = 15 + a.steps
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(skip_first=10, wait=0, warmup=5, active=a.steps, repeat=1)) as prof:
        for step in range(10 + total):
            index = perm[step * a.batch:(step + 1) * a.batch]
            x, y = x_all[index], y_all[index]
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            prof.step()
    events = {e.key: e for e in prof.key_averages()}
    fwd, bwd = OPS[a.activation]
    per_step = lambda key: events[key].self_cpu_time_total / a.steps if key in events else float("nan")  # noqa: E731
    step_us = events["ProfilerStep*"].cpu_time_total / a.steps if "ProfilerStep*" in events else float("nan")
    print(f"torch: {a.activation} forward {per_step(fwd):.2f} us/step, backward {per_step(bwd):.2f} us/step, "
          f"step {step_us:.1f} us (torch {torch.__version__}, 1 thread)")


if __name__ == "__main__":
    main()
