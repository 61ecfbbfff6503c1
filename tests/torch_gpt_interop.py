#!/usr/bin/python3
"""Interop test for the character-level GPT example: loads the safetensors file that
`char_gpt --export FILE` wrote into tests/gpt_model.py's GPT with load_state_dict(strict=True),
recomputes the logits of the token ids in --ids (.npy, [B, T], int32/int64, or float32 holding
integers) and compares them with those xtrain computed for the same ids (--logits, .npy float32
[B, T, V]): max |diff| must be <= TOL * (max |logit| + 1). Also checks the weight tying: the file's
wte.weight and head.weight must be equal, and after loading model.head.weight must still be
model.wte.weight. Exits 0 on success, 1 on a mismatch or a bad file, 2 on bad arguments, 77 (skip)
when torch is absent.

The config comes from, in this order: the command line (--vocab --block --layers --heads --embd),
the file's __metadata__ (string values under the same keys: "vocab", "block", "layers", "heads",
"embd"), the tensor shapes (vocab and embd from wte.weight, block from wpe.weight, layers from the
blocks.<i> names; heads cannot be inferred and must be given one of the other two ways).

usage: torch_gpt_interop.py MODEL.safetensors --ids IDS.npy --logits LOGITS.npy
                            [--vocab V --block T --layers L --heads H --embd C] [--tol 1e-4]"""
import argparse
import json
import os
import struct
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: {e.name} is not installed (torch_gpt_interop.py needs python3-torch and python3-numpy)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import gpt_model  # noqa: E402
import safetensors_np  # noqa: E402

CONFIG = ("vocab", "block", "layers", "heads", "embd")


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def read_header(path):
    """The JSON header of a safetensors file (8-byte little-endian length, then the JSON)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            fail(f"{path} is not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        try:
            return json.loads(f.read(n))
        except ValueError as e:
            fail(f"{path}: unreadable safetensors header ({e})")


def load_tensors(path, header):
    """{name: float32/int ndarray}; BF16 (not in safetensors_np's table) is widened to float32."""
    bf16 = [k for k, v in header.items() if k != "__metadata__" and v.get("dtype") == "BF16"]
    unknown = {v["dtype"] for k, v in header.items()
               if k != "__metadata__" and k not in bf16 and v.get("dtype") not in safetensors_np.DTYPES}
    if unknown:
        fail(f"{path}: unsupported dtypes {sorted(unknown)} (known: {sorted(safetensors_np.DTYPES)} and BF16)")
    if not bf16:
        return safetensors_np.load(path)
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if name in bf16:
            bits = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype="<u2").astype(np.uint32) << 16
            out[name] = bits.view(np.float32).reshape(info["shape"])
        else:
            out[name] = np.frombuffer(raw[8 + n + begin:8 + n + end],
                                      dtype=safetensors_np.DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def resolve_config(args, metadata, tensors):
    """{key: int} from the command line, else __metadata__, else the shapes; the source of each."""
    inferred = {}
    if "wte.weight" in tensors and tensors["wte.weight"].ndim == 2:
        inferred["vocab"], inferred["embd"] = tensors["wte.weight"].shape
    if "wpe.weight" in tensors and tensors["wpe.weight"].ndim == 2:
        inferred["block"] = tensors["wpe.weight"].shape[0]
    layer_ids = {int(k.split(".")[1]) for k in tensors if k.startswith("blocks.") and k.split(".")[1].isdigit()}
    if layer_ids:
        inferred["layers"] = max(layer_ids) + 1
    config, source = {}, {}
    for key in CONFIG:
        if getattr(args, key) is not None:
            config[key], source[key] = getattr(args, key), "command line"
        elif key in metadata:
            try:
                config[key], source[key] = int(metadata[key]), "metadata"
            except ValueError:
                fail(f"__metadata__ {key} = {metadata[key]!r} is not an integer")
        elif key in inferred:
            config[key], source[key] = int(inferred[key]), "shapes"
        else:
            what = "pass --heads (the file's __metadata__ has no 'heads')" if key == "heads" else f"pass --{key}"
            print(f"error: cannot tell the model's {key}: {what}")
            sys.exit(2)
    return config, source


def load_ids(path):
    ids = np.load(path)
    if ids.ndim != 2:
        fail(f"--ids {path}: shape {list(ids.shape)}, expected [B, T]")
    if ids.dtype.kind == "f":
        if not np.all(np.isfinite(ids)) or np.any(ids != np.round(ids)):
            fail(f"--ids {path}: float ids that are not whole numbers")
    elif ids.dtype.kind not in "iu":
        fail(f"--ids {path}: dtype {ids.dtype}, expected int32, int64 or float32")
    return torch.from_numpy(ids.astype(np.int64))


def main():
    p = argparse.ArgumentParser(description="Checks xtrain's char_gpt export against tests/gpt_model.py's GPT.")
    p.add_argument("model", help="the safetensors file written by char_gpt --export")
    p.add_argument("--ids", required=True, help=".npy [B, T] token ids (int32, int64 or float32)")
    p.add_argument("--logits", required=True, help=".npy float32 [B, T, V]: xtrain's logits for --ids")
    for key in CONFIG:
        p.add_argument(f"--{key}", type=int, default=None)
    p.add_argument("--tol", type=float, default=1e-4, help="max |diff| <= TOL * (max |logit| + 1) (default 1e-4)")
    args = p.parse_args()
    for path in (args.model, args.ids, args.logits):
        if not os.path.isfile(path):
            print(f"error: {path} does not exist")
            sys.exit(2)
    torch.set_num_threads(1)

    header = read_header(args.model)
    metadata = header.get("__metadata__") or {}
    tensors = load_tensors(args.model, header)
    config, source = resolve_config(args, metadata, tensors)

    for name in ("wte.weight", "head.weight"):
        if name not in tensors:
            fail(f"{args.model} has no {name} (a tied GPT exports both wte.weight and head.weight)")
    wte, head = tensors["wte.weight"], tensors["head.weight"]
    if wte.shape != head.shape or not np.array_equal(wte, head):
        diff = float(np.abs(wte - head).max()) if wte.shape == head.shape else float("nan")
        fail(f"wte.weight {list(wte.shape)} and head.weight {list(head.shape)} differ in the file "
             f"(max |diff| {diff:.3g}): the head is not tied to the token embedding")

    try:
        model = gpt_model.GPT(**config)
    except ValueError as e:
        fail(f"config {config}: {e}")
    weights = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in tensors.items()}
    try:
        model.load_state_dict(weights, strict=True)  # raises on any missing, unexpected or misshapen name
    except RuntimeError as e:
        fail(f"load_state_dict(strict=True) with config {config} ({', '.join(f'{k} from {source[k]}' for k in CONFIG)}) "
             f"failed:\n{e}")
    if model.head.weight is not model.wte.weight:
        fail("after load_state_dict, model.head.weight is no longer model.wte.weight (tying broken)")
    model.eval()

    ids = load_ids(args.ids)
    ours = np.load(args.logits)
    B, T = ids.shape
    if T > config["block"]:
        fail(f"--ids has T = {T} > block {config['block']}")
    if ids.min() < 0 or ids.max() >= config["vocab"]:
        fail(f"--ids holds ids outside [0, {config['vocab']}): min {int(ids.min())}, max {int(ids.max())}")
    if list(ours.shape) != [B, T, config["vocab"]]:
        fail(f"--logits shape {list(ours.shape)}, expected [{B}, {T}, {config['vocab']}] for ids [{B}, {T}]")
    with torch.no_grad():
        logits = model(ids).numpy()
    diff = float(np.abs(ours.astype(np.float32) - logits).max())
    scale = float(np.abs(logits).max())
    ok = bool(np.isfinite(diff)) and diff <= args.tol * (scale + 1)
    count = sum(p.numel() for p in model.parameters())
    print(f"PyTorch {torch.__version__} load_state_dict(strict=True) of GPT({', '.join(f'{k} {config[k]}' for k in CONFIG)}): "
          f"{len(weights)} tensors, {count} parameters, head tied to wte; logits of ids [{B}, {T}] vs xtrain:")
    print(f"max |diff| = {diff:.3g} (max |logit| {scale:.3g}, tolerance {args.tol:g} * (max |logit| + 1) = "
          f"{args.tol * (scale + 1):.3g}): {'OK' if ok else 'MISMATCH'}")
    if not ok:
        fail("xtrain's logits differ from PyTorch's by more than the tolerance (or are not finite)")


if __name__ == "__main__":
    main()
