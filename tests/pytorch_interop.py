#!/usr/bin/python3
"""PyTorch interop (by hand, not in CI; needs python3-torch): loads the model.safetensors that
`build/tests/checkpoint_probe export DIR` wrote into the same nn.Sequential with PyTorch's
load_state_dict(strict=True), recomputes the logits of the first 10 Fashion-MNIST test images in
eval mode and compares them with xtrain's (DIR/logits.f32) to 1e-5 of their largest magnitude.
Then writes DIR/from_pytorch.safetensors from PyTorch's state_dict for the reverse direction
(xtrain's load_model reads it in tests/checkpoint/test_safetensors.cpp's fixture test).

usage: tests/pytorch_interop.py DIR"""
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "benchmarks"))
import fashion_mnist  # noqa: E402
import numpy as np  # noqa: E402
import safetensors_np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

out_dir = sys.argv[1]
weights = {k: torch.from_numpy(np.array(v)) for k, v in safetensors_np.load(os.path.join(out_dir, "model.safetensors")).items()}
hidden = weights["0.weight"].shape[0]
model = nn.Sequential(nn.Linear(784, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, 10))
model.load_state_dict(weights, strict=True)
model.eval()
x, _ = fashion_mnist.load(fashion_mnist.DEFAULT_DIR, "t10k")
with torch.no_grad():
    logits = model(torch.from_numpy(x[:10])).numpy()
ours = np.fromfile(os.path.join(out_dir, "logits.f32"), dtype=np.float32).reshape(10, -1)
diff, scale = np.abs(ours - logits).max(), np.abs(logits).max()
print(f"PyTorch load_state_dict(strict=True) vs xtrain logits: max |diff| {diff:.3g}, max |logit| {scale:.3g}")
safetensors_np.save(os.path.join(out_dir, "from_pytorch.safetensors"),
                    {k: v.numpy() for k, v in model.state_dict().items()})
sys.exit(0 if diff <= 1e-5 * scale else 1)
