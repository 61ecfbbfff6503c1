#!/usr/bin/python3
"""Interop test (ctest interop.numpy): loads the model.safetensors that checkpoint_probe exported
with NumPy only, recomputes SimpleModel's logits (Linear, BatchNorm1d in eval mode, ReLU, Linear)
on the first 10 Fashion-MNIST test images and compares them with the logits xtrain computed
(logits.f32) to 1e-5 of their largest magnitude. Exits 77 (skip) when NumPy is absent.

usage: numpy_interop.py DIR"""
import os
import sys

try:
    import numpy as np
except ImportError:
    print("SKIP: NumPy is not installed (scripts/setup installs python3-numpy)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "benchmarks"))
import fashion_mnist  # noqa: E402
import safetensors_np  # noqa: E402

out_dir = sys.argv[1]
w = safetensors_np.load(os.path.join(out_dir, "model.safetensors"))
x, _ = fashion_mnist.load(fashion_mnist.DEFAULT_DIR, "t10k")
x = x[:10].astype(np.float64)
h = x @ w["0.weight"].T + w["0.bias"]
h = (h - w["1.running_mean"]) / np.sqrt(w["1.running_var"] + 1e-5) * w["1.weight"] + w["1.bias"]
h = np.maximum(h, 0)
logits = h @ w["3.weight"].T + w["3.bias"]
ours = np.fromfile(os.path.join(out_dir, "logits.f32"), dtype=np.float32).reshape(10, -1)
diff = np.abs(ours - logits).max()
scale = np.abs(logits).max()
print(f"numpy vs xtrain logits on 10 test images: max |diff| {diff:.3g}, max |logit| {scale:.3g}, "
      f"num_batches_tracked {int(w['1.num_batches_tracked'])}")
sys.exit(0 if diff <= 1e-5 * scale else 1)
