"""Minimal safetensors reader/writer on NumPy, for the reference scripts and interop tests (the
`safetensors` package is not in Debian). Format: 8-byte little-endian header length, a JSON
header {name: {dtype, shape, data_offsets}}, then the little-endian data."""
import json
import struct

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "F16": np.float16, "U8": np.uint8}


def load(path):
    """{name: ndarray} from a .safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def save(path, tensors):
    """Writes {name: ndarray} to a .safetensors file."""
    names = {v: k for k, v in DTYPES.items()}
    header, data, offset = {}, [], 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": names[array.dtype.type], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        data.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(data))
