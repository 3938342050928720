#!/usr/bin/env python3
"""Loads a safetensors file with the `safetensors` package (as PyTorch users would)
and prints each tensor's name, dtype, shape and a checksum (sum and sum of squares in
float64), then the metadata. Exits 1 when the file does not load, a tensor is not
finite, or a name given with --expect-names is missing. Not part of ctest (it needs
PyPI): pip install safetensors numpy.

    scripts/check-safetensors.py model.safetensors [--expect-names a.weight,b.bias]
"""
import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--expect-names", default="", help="comma-separated names that must exist")
    args = ap.parse_args()
    try:
        import numpy as np
        from safetensors import safe_open
    except ImportError as e:
        print(f"check-safetensors: {e}; pip install safetensors numpy", file=sys.stderr)
        return 1
    try:
        # BF16 has no numpy dtype: safe_open(framework="numpy") refuses to load it, so
        # such tensors are widened here from their raw bits.
        with safe_open(args.file, framework="numpy") as f:
            names = list(f.keys())
            meta = f.metadata() or {}
            bad = []
            for name in names:
                sl = f.get_slice(name)
                dtype, shape = sl.get_dtype(), sl.get_shape()
                if dtype == "BF16":
                    x = bf16_tensor(args.file, name)
                else:
                    x = f.get_tensor(name)
                if list(x.shape) != list(shape):
                    bad.append(f"{name}: shape {list(x.shape)} vs header {shape}")
                x64 = x.astype(np.float64)
                if not np.all(np.isfinite(x64)):
                    bad.append(f"{name}: not finite")
                print(f"{name}\t{dtype}\t{list(shape)}\tsum={x64.sum():.9g}\tsumsq={(x64 * x64).sum():.9g}")
    except Exception as e:  # noqa: BLE001: any failure to load is the answer
        print(f"check-safetensors: {args.file}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"metadata: {meta}")
    print(f"{len(names)} tensors")
    expected = [n for n in args.expect_names.split(",") if n]
    missing = [n for n in expected if n not in names]
    for m in missing:
        bad.append(f"missing {m}")
    for b in bad:
        print(f"check-safetensors: {args.file}: {b}", file=sys.stderr)
    return 1 if bad else 0


def bf16_tensor(path, name):
    import json
    import struct

    import numpy as np

    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        begin, end = header[name]["data_offsets"]
        fh.seek(8 + n + begin)
        raw = np.frombuffer(fh.read(end - begin), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(header[name]["shape"])


if __name__ == "__main__":
    sys.exit(main())
