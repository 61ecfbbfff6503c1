#!/usr/bin/python3
"""Interop test for the CNN example's models: loads the model.safetensors that xtrain wrote for
MODEL (lenet, convbn or resnet; tests/cnn_models.py holds their PyTorch twins) into the equivalent
torch.nn.Sequential with load_state_dict(strict=True), recomputes in eval mode (BatchNorm on its
running statistics, Dropout off) the logits of the same fixed input (DIR/input.f32, [4, 1, 28, 28])
and compares them with xtrain's (DIR/logits.f32, [4, 10]) to 1e-4 of their largest magnitude.
Exits 0 on success, 1 on a mismatch, 77 (skip) when torch is absent.

BatchNorm's num_batches_tracked is stored by xtrain as an int64 tensor; it is loaded as a torch.int64
scalar (a one-element array of any shape or dtype is accepted and converted).

usage: torch_cnn_interop.py DIR MODEL"""
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: {e.name} is not installed (torch_cnn_interop.py needs python3-torch and python3-numpy)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import cnn_models  # noqa: E402
import safetensors_np  # noqa: E402


def to_torch(name, array):
    if name.endswith("num_batches_tracked"):
        return torch.tensor(int(np.asarray(array).reshape(-1)[0]), dtype=torch.int64)
    return torch.from_numpy(np.array(array))  # a writable copy of the read-only buffer view


if len(sys.argv) != 3 or sys.argv[2] not in cnn_models.MODELS:
    print(f"usage: torch_cnn_interop.py DIR {'|'.join(cnn_models.MODELS)}")
    sys.exit(2)
out_dir, name = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
weights = {k: to_torch(k, v) for k, v in safetensors_np.load(os.path.join(out_dir, "model.safetensors")).items()}
model = cnn_models.MODELS[name]()
model.load_state_dict(weights, strict=True)  # raises on any missing, unexpected or misshapen name
model.eval()
x = np.fromfile(os.path.join(out_dir, "input.f32"), dtype=np.float32).reshape(4, 1, 28, 28)
ours = np.fromfile(os.path.join(out_dir, "logits.f32"), dtype=np.float32).reshape(4, 10)
with torch.no_grad():
    logits = model(torch.from_numpy(x)).numpy()
diff, scale = float(np.abs(ours - logits).max()), float(np.abs(logits).max())
ok = diff <= 1e-4 * scale and scale > 0
buffers = sum(1 for k in weights if "running_" in k or k.endswith("num_batches_tracked"))
print(f"PyTorch {torch.__version__} load_state_dict(strict=True) of {name}: {len(weights)} tensors "
      f"({len(weights) - buffers} parameters, {buffers} BatchNorm buffers); logits of a fixed [4, 1, 28, 28] "
      f"input in eval mode vs xtrain: max |diff| {diff:.3g}, max |logit| {scale:.3g}: {'OK' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
