#!/usr/bin/env bash
# The article's ViT-L memory table (48 GB falling to 22 GB with activation
# checkpointing, optimizer offload and a memory pool), row by row with `dtrain
# estimate`, for ViT-L/16 at 224 px, fp32, AdamW, micro-batch $BATCH (default 128) on
# one GPU (--device cuda: answered without a GPU). Each row adds one setting to the
# one above: baseline; + memory.checkpointing=block; + memory.offload.optimizer;
# + the pool (memory.pool true against false).
# The rows the CPU can measure (baseline, + checkpointing, and the pool switch: offload
# means nothing on the CPU) are then trained for 2 steps on the CPU at micro-batch
# $CPU_BATCH (default 4) and the estimate is set against the host allocator's
# measured peak (peak_host_bytes in the run's summary).
# Writes JSON to $1 (default vit-large-memory.json). Environment: DTRAIN (default
# build/src/cli/dtrain), BATCH, CPU_BATCH, THREADS (default: all cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-vit-large-memory.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
BATCH="${BATCH:-128}"
CPU_BATCH="${CPU_BATCH:-4}"
THREADS="${THREADS:-$(nproc)}"
WORK="$(mktemp -d /tmp/vit-large-memory.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

job="$WORK/vit-large.yaml"
cat >"$job" <<YAML
run: {seed: 1}
model: {arch: vit-large, image_size: 224, patch_size: 16, in_channels: 3, num_classes: 1000}
data: {dataset: synthetic, global_batch: $BATCH, workers: 1, limit: {test: $CPU_BATCH}}
optimizer: {name: adamw, lr: 1.0e-4, weight_decay: 0.05}
train: {steps: 2, log_every: 1}
logging: {console: false}
YAML

# name|--set arguments (cumulative, as the article's table)
ROWS=(
  "baseline (pool off)|--set memory.pool=false"
  "+ activation checkpointing|--set memory.pool=false --set memory.checkpointing=block"
  "+ optimizer offload|--set memory.pool=false --set memory.checkpointing=block --set memory.offload.optimizer=true"
  "+ memory pool|--set memory.pool=true --set memory.checkpointing=block --set memory.offload.optimizer=true"
)

gpu_rows="[]"
i=0
for row in "${ROWS[@]}"; do
  name=${row%%|*} sets=${row#*|}
  # shellcheck disable=SC2086  # $sets is a list of --set arguments
  "$DTRAIN" estimate "$job" --device cuda $sets --json >"$WORK/gpu-$i.json"
  gpu_rows=$(python3 - "$WORK/gpu-$i.json" "$name" "$sets" "$gpu_rows" <<'PY'
import json, sys
est, name, sets, rows = sys.argv[1:5]
e = json.load(open(est))
rows = json.loads(rows)
rows.append({"row": name, "sets": sets.replace("--set ", "").split(), "peak_bytes": e["peak_bytes"],
             "state_bytes": e["state_bytes"], "train_activation_bytes": e["train_activation_bytes"],
             "host_bytes": e["host_bytes"], "peak_at": e["peak_at"]})
print(json.dumps(rows))
PY
)
  i=$((i + 1))
done

# The CPU-measurable rows at a batch a CPU trains: the baseline, + checkpointing, and
# + the pool (with checkpointing; no offload on the CPU).
CPU_ROWS=(
  "baseline (pool off)|--set memory.pool=false"
  "+ activation checkpointing|--set memory.pool=false --set memory.checkpointing=block"
  "+ memory pool (no offload)|--set memory.pool=true --set memory.checkpointing=block"
)
cpu_rows="[]"
i=0
for row in "${CPU_ROWS[@]}"; do
  name=${row%%|*} sets=${row#*|}
  out="$WORK/cpu-$i"
  echo "vit-large-memory: CPU row '$name' at micro-batch $CPU_BATCH" >&2
  # shellcheck disable=SC2086
  "$DTRAIN" estimate "$job" --set data.global_batch="$CPU_BATCH" $sets --json >"$out.json"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS="$THREADS" OMP_WAIT_POLICY=passive "$DTRAIN" train "$job" \
    --set data.global_batch="$CPU_BATCH" $sets --set run.output_dir="$out" >"$out.log" 2>&1 ||
    { echo "vit-large-memory: '$name' failed:" >&2; tail -5 "$out.log" >&2; exit 1; }
  cpu_rows=$(python3 - "$out.json" "$out/metrics.jsonl" "$name" "$cpu_rows" <<'PY'
import json, sys
est, metrics, name, rows = sys.argv[1:5]
e = json.load(open(est))
s = next(json.loads(l) for l in open(metrics) if json.loads(l).get("summary"))
rows = json.loads(rows)
rows.append({"row": name, "estimate_bytes": e["peak_bytes"], "measured_bytes": s["peak_host_bytes"],
             "ratio": e["peak_bytes"] / s["peak_host_bytes"],
             "reserved_host_bytes": s.get("reserved_host_bytes")})
print(json.dumps(rows))
PY
)
  i=$((i + 1))
done

python3 - "$OUT" "$BATCH" "$CPU_BATCH" "$gpu_rows" "$cpu_rows" <<'PY'
import json, sys
out, batch, cpu_batch, gpu, cpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), json.loads(sys.argv[5])
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
json.dump({"job": f"ViT-L/16 224px fp32 AdamW, micro-batch {batch} (GPU rows), {cpu_batch} (CPU rows)",
           "cpu": model, "gpu_rows": gpu, "cpu_rows": cpu}, open(out, "w"), indent=2)
base = gpu[0]["peak_bytes"]
print(f"ViT-L/16, 224 px, fp32, AdamW, batch {batch}, one GPU (dtrain estimate --device cuda):")
for r in gpu:
    host = f", host {r['host_bytes'] / 1e9:.2f} GB" if r["host_bytes"] else ""
    print(f"  {r['row']:<28} {r['peak_bytes'] / 1e9:6.2f} GB ({r['peak_bytes'] / base:.2f}x){host}")
print(f"CPU, batch {cpu_batch}: estimate against the measured peak")
for r in cpu:
    print(f"  {r['row']:<28} estimate {r['estimate_bytes'] / 1e9:.3f} GB, measured "
          f"{r['measured_bytes'] / 1e9:.3f} GB, ratio {r['ratio']:.4f}")
print(f"-> {out}")
PY
