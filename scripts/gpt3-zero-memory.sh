#!/usr/bin/env bash
# ZeRO on a GPT-3-shaped model (96 layers, hidden 12288, 96 heads, 2048 tokens, a
# 50257-token vocabulary: 175B parameters), bf16 with fp32 masters, AdamW, block
# checkpointing, micro-batch 1, global batch 1024, per GPU (`dtrain estimate --device
# cuda`: answered without a GPU), for ZeRO stages 0-3 at each world size in $WORLDS
# (default "16 32 64 1024"), and how many 80 GB GPUs the smallest stage that fits needs.
# Writes JSON to $1 (default gpt3-zero-memory.json). Environment: DTRAIN (default
# build/src/cli/dtrain), WORLDS, GPU_GB (default 80).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-gpt3-zero-memory.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
WORLDS="${WORLDS:-16 32 64 1024}"
GPU_GB="${GPU_GB:-80}"
WORK="$(mktemp -d /tmp/gpt3-zero-memory.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

job="$WORK/gpt3.yaml"
cat >"$job" <<YAML
run: {seed: 1}
model: {arch: gpt2, layers: 96, hidden: 12288, heads: 96, seq_len: 2048, max_positions: 2048,
        vocab_size: 50257, dropout: 0.0}
data: {dataset: synthetic, global_batch: 1024, micro_batch: 1}
precision: {dtype: bf16}
memory: {checkpointing: block}
optimizer: {name: adamw, lr: 1.0e-4}
train: {steps: 1}
YAML

rows="[]"
for world in $WORLDS; do
  for stage in 0 1 2 3; do
    "$DTRAIN" estimate "$job" --device cuda --world "$world" --set "parallel.data=$world" \
      --set "parallel.micro_batches=$((1024 / world))" --set "parallel.zero_stage=$stage" \
      --json >"$WORK/e.json"
    rows=$(python3 - "$WORK/e.json" "$world" "$stage" "$rows" <<'PY'
import json, sys
est, world, stage, rows = sys.argv[1:5]
e = json.load(open(est))
rows = json.loads(rows)
rows.append({"world": int(world), "zero_stage": int(stage), "peak_bytes": e["peak_bytes"],
             "state_bytes": e["state_bytes"], "train_activation_bytes": e["train_activation_bytes"],
             "state": {i["kind"]: i["bytes"] for i in e["state"]}})
print(json.dumps(rows))
PY
)
  done
done

python3 - "$OUT" "$GPU_GB" "$rows" <<'PY'
import json, sys
out, gpu_gb, rows = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
print(f"{'world':>6} {'stage':>5} {'state GB':>10} {'activations GB':>15} {'peak GB':>9} fits {gpu_gb:.0f} GB")
for r in rows:
    fits = r["peak_bytes"] <= gpu_gb * 1e9
    print(f"{r['world']:>6} {r['zero_stage']:>5} {r['state_bytes'] / 1e9:>10.1f} "
          f"{r['train_activation_bytes'] / 1e9:>15.1f} {r['peak_bytes'] / 1e9:>9.1f} {'yes' if fits else 'no'}")
json.dump({"model": "GPT-3-shaped 175B, bf16 + fp32 masters, AdamW, block checkpointing, "
                    "micro-batch 1, global batch 1024", "gpu_gb": gpu_gb, "rows": rows},
          open(out, "w"), indent=2)
print(f"wrote {out}")
PY
