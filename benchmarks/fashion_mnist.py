"""Fashion-MNIST from its IDX files (gzip), as NumPy arrays: shared by the PyTorch reference
scripts (benchmarks/pytorch_*.py, tests/fixtures/make_parity_fixture.py)."""
import gzip
import os

import numpy as np

DEFAULT_DIR = os.environ.get("XTRAIN_DATA_DIR") or "/usr/share/datasets/fashion-mnist"


def idx(path):
    """The array in an IDX file of unsigned bytes (.gz)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    rank = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load(data_dir, split):
    """(features float32 [n, 784] in [0, 1], labels int64 [n]) of split "train" or "t10k"."""
    x = idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    y = idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    return x.reshape(len(x), -1).astype(np.float32) / 255.0, y.astype(np.int64)
