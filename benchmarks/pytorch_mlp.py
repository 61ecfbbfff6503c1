#!/usr/bin/python3
"""The PyTorch twin of examples/fashion_mnist_mlp.cpp, for side-by-side comparisons.

Same model (Linear -> BatchNorm1d -> activation -> Linear), same data (the Fashion-MNIST IDX files,
pixels / 255), Adam, cross-entropy, one global shuffle per epoch, the last batch kept. The data
set is held in memory as tensors and batches are gathered by index (no DataLoader, which the
homework's profile found costing 34 % of the time), so this measures PyTorch at its best.
One thread (OMP/OpenBLAS set before torch is imported). Prints the example's epoch lines.
"""
import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
import fashion_mnist  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402


def load(data, split):
    x, y = fashion_mnist.load(data, split)
    return torch.from_numpy(x), torch.from_numpy(y)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=os.environ.get("XTRAIN_DATA_DIR") or "/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--activation", default="relu", choices=["relu", "tanh", "sigmoid", "gelu"])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--bare", action="store_true",
                   help="no per-step loss/accuracy bookkeeping (no .item() sync): PyTorch's fastest loop")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (intra-op threads)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    train_x, train_y = load(a.data, "train")
    test_x, test_y = load(a.data, "t10k")
    act = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU}[a.activation]
    model = nn.Sequential(nn.Linear(train_x.shape[1], a.hidden), nn.BatchNorm1d(a.hidden), act(),
                          nn.Linear(a.hidden, int(train_y.max()) + 1))
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()
    print(f"pytorch {torch.__version__} | threads {torch.get_num_threads()} | batch {a.batch} | {a.epochs} epochs")
    n = len(train_x)
    start_all = time.perf_counter()
    for epoch in range(a.epochs):
        model.train()
        perm = torch.randperm(n)
        loss_sum, correct = 0.0, 0
        start = time.perf_counter()
        for i in range(0, n, a.batch):
            index = perm[i:i + a.batch]
            x, y = train_x[index], train_y[index]
            opt.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            opt.step()
            if not a.bare:
                loss_sum += loss.item() * len(y)
                correct += (out.argmax(1) == y).sum().item()
        seconds = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            out = model(test_x)
            test_loss = loss_fn(out, test_y).item()
            test_acc = 100.0 * (out.argmax(1) == test_y).float().mean().item()
        print(f"Epoch [{epoch + 1}/{a.epochs}], Train Loss: {loss_sum / n:.4f}, Train Accuracy: {100.0 * correct / n:.2f}%, "
              f"Test Loss: {test_loss:.4f}, Test Accuracy: {test_acc:.2f}%, Time: {seconds:.2f}s, {n / seconds:.0f} samples/s",
              flush=True)
    print(f"Final Test Accuracy: {test_acc:.2f}%")
    print(f"Total Training Time: {time.perf_counter() - start_all:.2f} seconds")


if __name__ == "__main__":
    main()
