#!/usr/bin/env python3
"""An independent BERT forward (Hugging Face BertForSequenceClassification's and
BertForMaskedLM's arithmetic, written from their definitions in plain Python, float64,
no libraries) that checks what `dtrain predict --json` printed for each text, from the
ids it says the model read:
  - a classifier: every class's probability, and the label is the most likely class
    (unless two classes are within the tolerance);
  - fill-mask: each [MASK]'s listed tokens and probabilities are the reference's most
    likely ordinary tokens (ids below --ordinary), in order (ties within the tolerance
    may swap).
Exit 0 when everything agrees, 1 with the first difference.

    bert_reference.py MODEL.safetensors PREDICT.json --heads H [--ordinary N] [--tol 1e-5]

MODEL.safetensors: `dtrain ckpt export` of the checkpoint predict read (F32).
"""
import argparse
import json
import math
import sys

from f32_safetensors import read_f32_safetensors


def layer_norm(x, w, b, eps=1e-12):
    mean = sum(x) / len(x)
    var = sum((v - mean) ** 2 for v in x) / len(x)
    inv = 1.0 / math.sqrt(var + eps)
    return [(v - mean) * inv * wi + bi for v, wi, bi in zip(x, w, b)]


def linear(x, w, b):  # torch.nn.Linear: y = W x + b, W [out, in]
    return [sum(wi * xi for wi, xi in zip(row, x)) + bi for row, bi in zip(w, b)]


def gelu(v):  # the exact (erf) GELU
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


def softmax(logits):
    top = max(logits)
    e = [math.exp(v - top) for v in logits]
    z = sum(e)
    return [v / z for v in e]


class Bert:
    def __init__(self, w, heads):
        self.w = w
        self.heads = heads
        self.layers = 0
        while f"bert.encoder.layer.{self.layers}.attention.self.query.weight" in w:
            self.layers += 1

    def p(self, name):
        return self.w[name]

    def encode(self, ids):
        """The encoder's output rows for `ids`: every position attends to every other."""
        e = "bert.embeddings."
        x = []
        for pos, t in enumerate(ids):
            row = [a + b + c for a, b, c in zip(self.p(e + "word_embeddings.weight")[t],
                                                self.p(e + "position_embeddings.weight")[pos],
                                                self.p(e + "token_type_embeddings.weight")[0])]
            x.append(layer_norm(row, self.p(e + "LayerNorm.weight"), self.p(e + "LayerNorm.bias")))
        c = len(x[0])
        d = c // self.heads
        for i in range(self.layers):
            L = f"bert.encoder.layer.{i}."
            q = [linear(r, self.p(L + "attention.self.query.weight"),
                        self.p(L + "attention.self.query.bias")) for r in x]
            k = [linear(r, self.p(L + "attention.self.key.weight"),
                        self.p(L + "attention.self.key.bias")) for r in x]
            v = [linear(r, self.p(L + "attention.self.value.weight"),
                        self.p(L + "attention.self.value.bias")) for r in x]
            att = []
            for t in range(len(x)):
                out = []
                for h in range(self.heads):
                    lo, hi = h * d, (h + 1) * d
                    s = [sum(a * b for a, b in zip(q[t][lo:hi], k[u][lo:hi])) / math.sqrt(d)
                         for u in range(len(x))]
                    pr = softmax(s)
                    out += [sum(pr[u] * v[u][j] for u in range(len(x))) for j in range(lo, hi)]
                att.append(out)
            a = [linear(r, self.p(L + "attention.output.dense.weight"),
                        self.p(L + "attention.output.dense.bias")) for r in att]
            x = [layer_norm([p + q_ for p, q_ in zip(r, s)],
                            self.p(L + "attention.output.LayerNorm.weight"),
                            self.p(L + "attention.output.LayerNorm.bias")) for r, s in zip(x, a)]
            f = [[gelu(v_) for v_ in linear(r, self.p(L + "intermediate.dense.weight"),
                                           self.p(L + "intermediate.dense.bias"))] for r in x]
            f = [linear(r, self.p(L + "output.dense.weight"), self.p(L + "output.dense.bias"))
                 for r in f]
            x = [layer_norm([p + q_ for p, q_ in zip(r, s)], self.p(L + "output.LayerNorm.weight"),
                            self.p(L + "output.LayerNorm.bias")) for r, s in zip(x, f)]
        return x

    def classify(self, ids):
        x = self.encode(ids)
        h = [math.tanh(v) for v in linear(x[0], self.p("bert.pooler.dense.weight"),
                                          self.p("bert.pooler.dense.bias"))]
        return softmax(linear(h, self.p("classifier.weight"), self.p("classifier.bias")))

    def fill(self, ids, positions):
        x = self.encode(ids)
        t = "cls.predictions.transform."
        out = []
        for pos in positions:
            h = [gelu(v) for v in linear(x[pos], self.p(t + "dense.weight"),
                                         self.p(t + "dense.bias"))]
            h = layer_norm(h, self.p(t + "LayerNorm.weight"), self.p(t + "LayerNorm.bias"))
            words = self.p("bert.embeddings.word_embeddings.weight")
            bias = self.p("cls.predictions.bias")
            out.append(softmax([sum(a * b for a, b in zip(h, row)) + bb
                                for row, bb in zip(words, bias)]))
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("predict")
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--ordinary", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    bert = Bert(read_f32_safetensors(a.model), a.heads)
    with open(a.predict) as f:
        got = json.load(f)
    worst = 0.0
    for n, text in enumerate(got["texts"]):
        ids = text["ids"]
        if got["task"] == "classify":
            want = bert.classify(ids)
            for k, (g, w) in enumerate(zip(text["probabilities"], want)):
                worst = max(worst, abs(g - w))
                if abs(g - w) > a.tol:
                    print(f"text {n} class {k}: dtrain {g}, reference {w}")
                    return 1
            best = max(range(len(want)), key=lambda k: (want[k], -k))
            if text["label_id"] != best and abs(want[text["label_id"]] - want[best]) > a.tol:
                print(f"text {n}: dtrain says class {text['label_id']}, reference {best}")
                return 1
        else:
            positions = [i for i, t in enumerate(ids) if t == got["mask_id"]]
            want = bert.fill(ids, positions)
            if len(want) != len(text["masks"]):
                print(f"text {n}: {len(text['masks'])} masks listed, {len(want)} in its ids")
                return 1
            for m, (listed, p) in enumerate(zip(text["masks"], want)):
                ranked = sorted(range(a.ordinary), key=lambda i: (-p[i], i))
                for j, c in enumerate(listed):
                    w = p[c["id"]]
                    worst = max(worst, abs(c["probability"] - w))
                    if abs(c["probability"] - w) > a.tol:
                        print(f"text {n} mask {m} token {c['id']}: dtrain {c['probability']}, "
                              f"reference {w}")
                        return 1
                    if c["id"] != ranked[j] and abs(p[ranked[j]] - w) > a.tol:
                        print(f"text {n} mask {m} rank {j}: dtrain {c['id']}, reference "
                              f"{ranked[j]}")
                        return 1
    print(f"{len(got['texts'])} text(s) agree; largest probability difference {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
