#!/usr/bin/env python3
"""Writes a small GPT-2 in Hugging Face's files, as a model directory downloaded from
the Hub holds them: vocab.json and merges.txt (GPT-2's byte-to-unicode token strings,
a few merges, <|endoftext|> last) and model.safetensors with GPT2Model's names
("h.0.attn.c_attn.weight", Conv1D weights [in, out]), the causal-mask buffers
"h.N.attn.bias" and the tied "lm_head.weight" copy that a reader must skip. Weights are
drawn from a seeded generator, wide enough that the next-token distribution is far
from uniform. Standard library only.

    make_hf_gpt2.py DIR --layers L --hidden H --heads N --context T [--seed S]
                    [--poison-position P]

--poison-position P sets row P of the position table to 3e38 (finite, but its
activations overflow): a run that never reaches position P must not notice.
Also writes config.json with GPT2Config's shape keys (n_layer, n_embd, n_head,
n_positions, vocab_size).

Prints the vocabulary size (the model's rows).
"""
import argparse
import json
import random
import struct
from pathlib import Path

MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("n", "d")]


def bytes_to_unicode():
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]  # in id order: GPT-2 numbers them by code point


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        data = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--context", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--poison-position", type=int, default=-1)
    a = ap.parse_args()
    out = Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)

    tokens = bytes_to_unicode() + [l + r for l, r in MERGES] + ["<|endoftext|>"]
    (out / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{l} {r}\n" for l, r in MERGES))

    rng = random.Random(a.seed)
    h, v, t = a.hidden, len(tokens), a.context

    def normal(shape, std, mean=0.0):
        n = 1
        for d in shape:
            n *= d
        return (shape, [mean + rng.gauss(0.0, std) for _ in range(n)])

    w = {"wte.weight": normal([v, h], 0.5), "wpe.weight": normal([t, h], 0.2)}
    mask = [1.0 if j <= i else 0.0 for i in range(t) for j in range(t)]
    for i in range(a.layers):
        p = f"h.{i}."
        w[p + "ln_1.weight"] = normal([h], 0.1, 1.0)
        w[p + "ln_1.bias"] = normal([h], 0.1)
        w[p + "attn.bias"] = ([1, 1, t, t], mask)
        w[p + "attn.c_attn.weight"] = normal([h, 3 * h], 0.3)
        w[p + "attn.c_attn.bias"] = normal([3 * h], 0.1)
        w[p + "attn.c_proj.weight"] = normal([h, h], 0.2)
        w[p + "attn.c_proj.bias"] = normal([h], 0.1)
        w[p + "ln_2.weight"] = normal([h], 0.1, 1.0)
        w[p + "ln_2.bias"] = normal([h], 0.1)
        w[p + "mlp.c_fc.weight"] = normal([h, 4 * h], 0.2)
        w[p + "mlp.c_fc.bias"] = normal([4 * h], 0.1)
        w[p + "mlp.c_proj.weight"] = normal([4 * h, h], 0.1)
        w[p + "mlp.c_proj.bias"] = normal([h], 0.1)
    w["ln_f.weight"] = normal([h], 0.1, 1.0)
    w["ln_f.bias"] = normal([h], 0.1)
    w["lm_head.weight"] = w["wte.weight"]
    if a.poison_position >= 0:
        values = w["wpe.weight"][1]
        values[a.poison_position * h:(a.poison_position + 1) * h] = [3e38] * h
    write_safetensors(out / "model.safetensors", w)
    (out / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "n_layer": a.layers, "n_embd": h, "n_head": a.heads,
        "n_positions": t, "vocab_size": v, "layer_norm_epsilon": 1e-5}))
    print(v)


if __name__ == "__main__":
    main()
