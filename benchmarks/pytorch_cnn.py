#!/usr/bin/python3
"""The PyTorch twin of the CNN example (models lenet, convbn, resnet; tests/cnn_models.py), for
side-by-side speed and accuracy comparisons.

Same data (the Fashion-MNIST IDX files, pixels / 255, as [N, 1, 28, 28]), Adam, cross-entropy, one
global shuffle per epoch, the last batch kept. The data set is held in memory as tensors and batches
are gathered by index (no DataLoader), as in pytorch_mlp.py. One thread (OMP/OpenBLAS set before
torch is imported). Prints the example's epoch lines. --max-steps N stops each epoch after N steps,
for a quick timing: the epoch line's loss, accuracy and samples/s are then those of the steps run
(the test metrics are always over the whole test set).
"""
import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import cnn_models  # noqa: E402
import fashion_mnist  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402


def load(data, split):
    x, y = fashion_mnist.load(data, split)
    return torch.from_numpy(x).reshape(-1, 1, 28, 28), torch.from_numpy(y)


def evaluate(model, loss_fn, x, y, chunk=1000):
    """(mean loss, accuracy %) over the whole set, in chunks (bounded activation memory)."""
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), chunk):
            out = model(x[i:i + chunk])
            loss_sum += loss_fn(out, y[i:i + chunk]).item() * len(out)
            correct += (out.argmax(1) == y[i:i + chunk]).sum().item()
    return loss_sum / len(x), 100.0 * correct / len(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=os.environ.get("XTRAIN_DATA_DIR") or "/usr/share/datasets/fashion-mnist")
    p.add_argument("--model", default="lenet", choices=sorted(cnn_models.MODELS))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-steps", type=int, default=0, help="stop each epoch after N steps (0: the whole epoch)")
    p.add_argument("--test-limit", type=int, default=0, help="evaluate on the first N test images (0: all 10,000)")
    p.add_argument("--bare", action="store_true",
                   help="no per-step loss/accuracy bookkeeping (no .item() sync): PyTorch's fastest loop")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    train_x, train_y = load(a.data, "train")
    test_x, test_y = load(a.data, "t10k")
    if a.test_limit:
        test_x, test_y = test_x[:a.test_limit], test_y[:a.test_limit]
    model = cnn_models.MODELS[a.model](int(train_y.max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()
    count = sum(p.numel() for p in model.parameters())
    steps = f" | max {a.max_steps} steps/epoch" if a.max_steps else ""
    print(f"pytorch {torch.__version__} | threads {torch.get_num_threads()} | model {a.model} | parameters {count} "
          f"| batch {a.batch} | {a.epochs} epochs{steps}", flush=True)
    n = len(train_x)
    start_all = time.perf_counter()
    for epoch in range(a.epochs):
        model.train()
        perm = torch.randperm(n)
        loss_sum, correct, seen = 0.0, 0, 0
        start = time.perf_counter()
        for step, i in enumerate(range(0, n, a.batch)):
            if a.max_steps and step >= a.max_steps:
                break
            index = perm[i:i + a.batch]
            x, y = train_x[index], train_y[index]
            opt.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            opt.step()
            seen += len(y)
            if not a.bare:
                loss_sum += loss.item() * len(y)
                correct += (out.argmax(1) == y).sum().item()
        seconds = time.perf_counter() - start
        test_loss, test_acc = evaluate(model, loss_fn, test_x, test_y)
        print(f"Epoch [{epoch + 1}/{a.epochs}], Train Loss: {loss_sum / seen:.4f}, Train Accuracy: {100.0 * correct / seen:.2f}%, "
              f"Test Loss: {test_loss:.4f}, Test Accuracy: {test_acc:.2f}%, Time: {seconds:.2f}s, {seen / seconds:.0f} samples/s",
              flush=True)
    print(f"Final Test Accuracy: {test_acc:.2f}%")
    print(f"Total Training Time: {time.perf_counter() - start_all:.2f} seconds")


if __name__ == "__main__":
    main()
