#!/usr/bin/python3
# PyTorch peers of dtrain's transformer throughput jobs: times one fp32 eager
# training step (zero_grad, forward, loss, backward, AdamW) of BERT-base masked-LM
# (configs/bert-base-synthetic.yaml: batch 8 x 128 tokens) or GPT-2 124M
# (configs/gpt2-124m-synthetic.yaml: batch 4 x 64 tokens) on fixed random tokens,
# and prints one JSON line with every step time. The models are written out here
# in the Hugging Face / nanoGPT layout (same parameter count as dtrain's, checked),
# with dropout 0.1 on hidden states and on attention probabilities, as dtrain
# has. Not a test; Debian's /usr/bin/python3.
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# dtrain's counts for the same graphs: BERT-base with the masked-LM head (tied
# decoder, so no pooler: BertModel's 109,482,240 - 590,592 pooler + 592,128
# transform + 30,522 decoder bias) and GPT-2 small (tied head).
EXPECTED_PARAMS = {"bert-base": 109_514_298, "gpt2": 124_439_808}


def attention(q, k, v, causal, p, training):
    """q, k, v [B, H, T, D] -> [B, H, T, D]: dropout(softmax(q k^T / sqrt(D))) v."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        t = q.shape[-2]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return F.dropout(F.softmax(s, dim=-1), p, training) @ v


class SelfAttention(nn.Module):
    def __init__(self, c, heads, causal, p):
        super().__init__()
        self.heads, self.causal, self.p = heads, causal, p
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = attention(q, k, v, self.causal, self.p, self.training).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class BertLayer(nn.Module):
    """Post-LN: x = LN(x + drop(attn(x))); x = LN(x + drop(ffn(x)))."""

    def __init__(self, c, heads, ffn, p):
        super().__init__()
        self.attn = SelfAttention(c, heads, causal=False, p=p)
        self.ln1 = nn.LayerNorm(c, eps=1e-12)
        self.fc1, self.fc2 = nn.Linear(c, ffn), nn.Linear(ffn, c)
        self.ln2 = nn.LayerNorm(c, eps=1e-12)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        x = self.ln1(x + self.drop(self.attn(x)))
        return self.ln2(x + self.drop(self.fc2(F.gelu(self.fc1(x)))))


class BertMLM(nn.Module):
    def __init__(self, vocab=30522, positions=512, c=768, layers=12, heads=12, p=0.1):
        super().__init__()
        self.word = nn.Embedding(vocab, c)
        self.pos = nn.Embedding(positions, c)
        self.token_type = nn.Embedding(2, c)
        self.ln = nn.LayerNorm(c, eps=1e-12)
        self.drop = nn.Dropout(p)
        self.layers = nn.ModuleList(BertLayer(c, heads, 4 * c, p) for _ in range(layers))
        self.transform = nn.Linear(c, c)
        self.transform_ln = nn.LayerNorm(c, eps=1e-12)
        self.decoder_bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, ids, labels):
        t = ids.shape[1]
        x = self.word(ids) + self.pos.weight[:t] + self.token_type.weight[0]
        x = self.drop(self.ln(x))
        for layer in self.layers:
            x = layer(x)
        h = self.transform_ln(F.gelu(self.transform(x)))
        logits = h @ self.word.weight.t() + self.decoder_bias  # decoder tied to the embeddings
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)


class GptBlock(nn.Module):
    """Pre-LN: x = x + drop(attn(LN(x))); x = x + drop(mlp(LN(x)))."""

    def __init__(self, c, heads, p):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.attn = SelfAttention(c, heads, causal=True, p=p)
        self.fc, self.proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class Gpt2(nn.Module):
    def __init__(self, vocab=50257, positions=1024, c=768, layers=12, heads=12, p=0.1):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(positions, c)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(GptBlock(c, heads, p) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)

    def forward(self, ids, labels):
        t = ids.shape[1]
        x = self.drop(self.wte(ids) + self.wpe.weight[:t])
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def make_batch(model_name, batch, seq, vocab):
    ids = torch.randint(0, vocab, (batch, seq))
    if model_name == "gpt2":
        return ids, torch.randint(0, vocab, (batch, seq))
    labels = torch.full((batch, seq), -100, dtype=torch.long)
    chosen = torch.rand(batch, seq) < 0.15
    chosen[:, 0] = True  # at least one masked position per row, as dtrain's MLM batches
    labels[chosen] = ids[chosen]
    return ids, labels


def sync(device):
    """Step times on a GPU count the work, not just its launch."""
    if device != "cpu":
        torch.cuda.synchronize()


def use_fp32(device):
    """On a GPU: plain FP32 maths as dtrain's (no TF32 in matmuls or cuDNN convolutions)."""
    if device != "cpu":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["bert-base", "gpt2"], required=True)
    ap.add_argument("--steps", type=int, default=7, help="timed steps including warm-up")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (scripts/gpu-check.sh)")
    ap.add_argument("--amp", choices=["none", "bf16"], default="none",
                    help="bf16: torch.autocast around forward and loss (fp32 weights and "
                         "optimizer, bf16 compute; no loss scaler needed), PyTorch AMP")
    args = ap.parse_args()
    if args.steps < args.warmup + 5:
        sys.exit("--steps must leave at least 5 timed steps after --warmup")
    batch = args.batch or (8 if args.model == "bert-base" else 4)
    seq = args.seq or (128 if args.model == "bert-base" else 64)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    # Flush denormals to zero: without it this torch's GPT-2 steps slowed from 1.9 s to
    # 9.6 s over 7 steps here (denormal arithmetic); the peer gets its best setting.
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    model = BertMLM() if args.model == "bert-base" else Gpt2()
    vocab = 30522 if args.model == "bert-base" else 50257
    params = sum(p.numel() for p in model.parameters())
    want = EXPECTED_PARAMS[args.model]
    assert params == want, f"{args.model} has {params} parameters, want {want}"
    use_fp32(args.device)
    model.to(args.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids, labels = (t.to(args.device) for t in make_batch(args.model, batch, seq, vocab))
    times = []
    for _ in range(args.steps):
        sync(args.device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=args.device.split(":")[0], dtype=torch.bfloat16,
                            enabled=args.amp == "bf16"):
            loss = model(ids, labels)
        loss.backward()
        opt.step()
        sync(args.device)
        times.append(time.perf_counter() - t0)
        assert torch.isfinite(loss), "non-finite loss"
    print(json.dumps({
        "median_step_s": statistics.median(times[args.warmup:]),
        "step_times_s": times,
        "warmup": args.warmup,
        "params": params,
        "model": args.model,
        "batch": batch,
        "seq": seq,
        "amp": args.amp,
        "torch": torch.__version__,
        "torchvision": None,
        "threads": torch.get_num_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "flush_denormal": True,
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "device": args.device,
        "peak_device_bytes": torch.cuda.max_memory_allocated() if args.device != "cpu" else None,
    }))


if __name__ == "__main__":
    main()
