"""A safetensors file of F32 tensors as plain Python lists, for the reference forwards
(gpt2_reference.py, bert_reference.py): {name: a list (1-D) or a list of rows (2-D)}.
`keep(name)` returns the name to store the tensor under, or None to skip it."""
import json
import struct


def read_f32_safetensors(path, keep=lambda name: name):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        name = keep(name)
        if name is None:
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{name}: {t['dtype']}, expected F32")
        lo, hi = t["data_offsets"]
        flat = struct.unpack_from(f"<{(hi - lo) // 4}f", data, base + lo)
        shape = t["shape"]
        if len(shape) == 1:
            out[name] = list(flat)
        else:
            cols = shape[1]
            out[name] = [list(flat[r * cols:(r + 1) * cols]) for r in range(shape[0])]
    return out
