#!/usr/bin/env python3
"""An independent GPT-2 forward (Hugging Face GPT2LMHeadModel's arithmetic, written
from its definition in plain Python, float64, no libraries) that checks what
`dtrain generate --json` printed: for every sample, the log-probability dtrain gave
each new token must be the reference's, and with --greedy each token must be the
reference's most likely candidate (unless two candidates are within the tolerance).
The reference keeps a key/value cache while the text fits the context and recomputes
the window of the last CONTEXT tokens (positions from 0) once it does not, as dtrain
does. Exit 0 when everything agrees, 1 with the first difference.

    gpt2_reference.py MODEL.safetensors GENERATE.json --heads H --context T
                      --candidates N [--greedy] [--tol 1e-4]

MODEL.safetensors: `dtrain ckpt export` of the checkpoint generate read, or a Hugging
Face GPT2Model / GPT2LMHeadModel file (F32).
--candidates N: ids [0, N) may be drawn (a trained vocabulary's ordinary tokens and
<|endoftext|>).
"""
import argparse
import json
import math
import sys

from f32_safetensors import read_f32_safetensors


def gpt2_name(name):
    if name.endswith(".attn.bias") or name == "lm_head.weight":
        return None  # causal-mask buffers and the tied head's copy: nothing to read
    return name if name.startswith("transformer.") else "transformer." + name  # GPT2Model's


def read_safetensors(path):
    return read_f32_safetensors(path, gpt2_name)


def layer_norm(x, w, b, eps=1e-5):
    mean = sum(x) / len(x)
    var = sum((v - mean) ** 2 for v in x) / len(x)
    inv = 1.0 / math.sqrt(var + eps)
    return [(v - mean) * inv * wi + bi for v, wi, bi in zip(x, w, b)]


def conv1d(x, w, b):  # Hugging Face's Conv1D: y = x @ W + b, W [in, out]
    out = list(b)
    for xi, row in zip(x, w):
        if xi != 0.0:
            for j, wij in enumerate(row):
                out[j] += xi * wij
    return out


def gelu_tanh(v):
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


class Model:
    def __init__(self, weights, heads):
        self.w = weights
        self.heads = heads
        self.hidden = len(weights["transformer.wte.weight"][0])
        self.layers = 0
        while f"transformer.h.{self.layers}.ln_1.weight" in weights:
            self.layers += 1

    def step(self, token, position, cache):
        """The logits after `token` at `position`; cache[layer] holds (keys, values)."""
        w, h, nh = self.w, self.hidden, self.heads
        d = h // nh
        x = [a + b for a, b in zip(w["transformer.wte.weight"][token],
                                   w["transformer.wpe.weight"][position])]
        for i in range(self.layers):
            p = f"transformer.h.{i}."
            a = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
            qkv = conv1d(a, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"])
            q, k, v = qkv[:h], qkv[h:2 * h], qkv[2 * h:]
            keys, values = cache[i]
            keys.append(k)
            values.append(v)
            att = []
            for head in range(nh):
                s = slice(head * d, (head + 1) * d)
                scores = [sum(qi * ki for qi, ki in zip(q[s], kk[s])) / math.sqrt(d)
                          for kk in keys]
                top = max(scores)
                e = [math.exp(sc - top) for sc in scores]
                z = sum(e)
                att.extend(sum(e[t] / z * values[t][s][j] for t in range(len(keys)))
                           for j in range(d))
            x = [xi + yi for xi, yi in
                 zip(x, conv1d(att, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"]))]
            m = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
            m = [gelu_tanh(v) for v in conv1d(m, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"])]
            x = [xi + yi for xi, yi in
                 zip(x, conv1d(m, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"]))]
        x = layer_norm(x, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"])
        return [sum(a * b for a, b in zip(x, row)) for row in w["transformer.wte.weight"]]

    def last_logits(self, tokens):
        cache = [([], []) for _ in range(self.layers)]
        for pos, t in enumerate(tokens):
            logits = self.step(t, pos, cache)
        return logits


def log_softmax(logits):
    top = max(logits)
    z = top + math.log(sum(math.exp(v - top) for v in logits))
    return [v - z for v in logits]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("generated")
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--context", type=int, required=True)
    ap.add_argument("--candidates", type=int, required=True)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    model = Model(read_safetensors(a.model), a.heads)
    g = json.load(open(a.generated))
    prompt = g["prompt_ids"]
    checked = 0
    for n, sample in enumerate(g["samples"]):
        tokens = list(prompt)
        cache = [([], []) for _ in range(model.layers)]
        for pos, t in enumerate(tokens[:-1]):
            if pos < a.context:
                model.step(t, pos, cache)
        for k, (tok, lp) in enumerate(zip(sample["ids"], sample["logprobs"])):
            if len(tokens) <= a.context:
                logits = model.step(tokens[-1], len(tokens) - 1, cache)
            else:
                logits = model.last_logits(tokens[-a.context:])
            ref = log_softmax(logits)
            if abs(ref[tok] - lp) > a.tol:
                print(f"sample {n} token {k} (id {tok}): log-probability {lp} from dtrain, "
                      f"{ref[tok]} from the reference")
                return 1
            if a.greedy:
                best = max(range(a.candidates), key=lambda i: (ref[i], -i))
                if best != tok and ref[best] - ref[tok] > a.tol:
                    print(f"sample {n} token {k}: dtrain took {tok} ({ref[tok]}), the most "
                          f"likely candidate is {best} ({ref[best]})")
                    return 1
            tokens.append(tok)
            checked += 1
    print(f"ok: {checked} tokens of {len(g['samples'])} samples agree with the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
