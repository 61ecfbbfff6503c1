#!/usr/bin/python3
"""Interop test (ctest interop.torch_nested): loads the model.safetensors that xtrain_tests
'[.export_nested]' wrote (the nested residual model after 2 training steps) into the equivalent
torch.nn module with load_state_dict(strict=True), recomputes in eval mode the logits of the same
fixed input (DIR/input.f32, [2, 3, 6]) and compares them with xtrain's (DIR/logits.f32, [2, 3, 4])
to 1e-5 of their largest magnitude. Exits 0 on success, 1 on a mismatch, 77 (skip) when torch
is absent.

    Sequential(Linear(6, 8), Residual(Sequential(Linear(8, 8), Tanh(), Linear(8, 8))), ReLU(),
               Sequential(Linear(8, 4)))

usage: torch_nested_interop.py DIR"""
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
try:
    import numpy as np
    import torch
    from torch import nn
except ImportError as e:
    print(f"SKIP: {e.name} is not installed (torch_nested_interop.py needs python3-torch and python3-numpy)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import safetensors_np  # noqa: E402


class Residual(nn.Sequential):
    """x + Sequential(x): xtrain's Residual{Sequential{...}}, transparent in names."""

    def forward(self, x):
        return x + super().forward(x)


out_dir = sys.argv[1]
torch.set_num_threads(1)
weights = {k: torch.from_numpy(np.array(v)) for k, v in safetensors_np.load(os.path.join(out_dir, "model.safetensors")).items()}
model = nn.Sequential(nn.Linear(6, 8), Residual(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)), nn.ReLU(),
                      nn.Sequential(nn.Linear(8, 4)))
model.load_state_dict(weights, strict=True)  # raises on any missing, unexpected or misshapen name
model.eval()
x = np.fromfile(os.path.join(out_dir, "input.f32"), dtype=np.float32).reshape(2, 3, 6)
ours = np.fromfile(os.path.join(out_dir, "logits.f32"), dtype=np.float32).reshape(2, 3, 4)
with torch.no_grad():
    logits = model(torch.from_numpy(x)).numpy()
diff, scale = float(np.abs(ours - logits).max()), float(np.abs(logits).max())
ok = diff <= 1e-5 * scale and scale > 0
print(f"PyTorch {torch.__version__} load_state_dict(strict=True) of {len(weights)} tensors "
      f"({', '.join(sorted(weights))}); logits of a fixed [2, 3, 6] input in eval mode vs xtrain: "
      f"max |diff| {diff:.3g}, max |logit| {scale:.3g}: {'OK' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
