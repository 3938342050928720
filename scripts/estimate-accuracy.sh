#!/usr/bin/env bash
# `dtrain estimate` against the measured peak for full-size models on the CPU:
# ResNet-50 (224 px), BERT-base (128 tokens), ViT-B/16 (224 px) and GPT-2 124M (128
# tokens), each at two micro-batch sizes, in fp32 and bf16. For every case one
# `dtrain estimate --json` and one `dtrain train` of 2 steps (the final evaluation
# over one batch, the final checkpoint) whose summary line gives peak_host_bytes,
# the host allocator's high-water mark over the whole run. Writes JSON to $1
# (default estimate-accuracy.json): per case both figures and estimate / measured.
# Reported, never asserted here (tests/train/test_estimate.cpp asserts 3% on small
# shapes in every CI run). Environment: DTRAIN (default build/src/cli/dtrain),
# CASES (default: all, "name:batch" words, e.g. "resnet50:16 gpt2:4"), DTYPES
# (default "fp32 bf16"), THREADS (default: all cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-estimate-accuracy.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
CASES="${CASES:-resnet50:16 resnet50:32 bert-base:8 bert-base:16 vit-b16:8 vit-b16:16 gpt2:4 gpt2:8}"
DTYPES="${DTYPES:-fp32 bf16}"
THREADS="${THREADS:-$(nproc)}"
WORK="$(mktemp -d /tmp/estimate-accuracy.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

model_of() {
  case "$1" in
    resnet50) echo "{arch: resnet50, image_size: 224, in_channels: 3, num_classes: 1000}|sgd" ;;
    bert-base) echo "{arch: bert-base, seq_len: 128}|adamw" ;;
    vit-b16) echo "{arch: vit-base, image_size: 224, in_channels: 3, num_classes: 1000}|adamw" ;;
    gpt2) echo "{arch: gpt2, seq_len: 128}|adamw" ;;
    *) echo "estimate-accuracy: unknown model $1" >&2; exit 2 ;;
  esac
}

rows="[]"
for c in $CASES; do
  name=${c%%:*} batch=${c##*:}
  IFS='|' read -r model optim <<<"$(model_of "$name")"
  job="$WORK/$name.yaml"
  cat >"$job" <<YAML
run: {seed: 1}
model: $model
data: {dataset: synthetic, global_batch: $batch, micro_batch: $batch, workers: 1, limit: {test: $batch}}
optimizer: {name: $optim, lr: 1.0e-4, momentum: 0.9}
train: {steps: 2, log_every: 1}
logging: {console: false}
YAML
  [ "$optim" = sgd ] || sed -i 's/, momentum: 0.9//' "$job"
  for dtype in $DTYPES; do
    out="$WORK/$name-$batch-$dtype"
    echo "estimate-accuracy: $name batch $batch $dtype" >&2
    "$DTRAIN" estimate "$job" --set precision.dtype="$dtype" --json >"$out.estimate.json"
    OMP_NUM_THREADS="$THREADS" OMP_WAIT_POLICY=passive "$DTRAIN" train "$job" \
      --set precision.dtype="$dtype" --set run.output_dir="$out" >"$out.log" 2>&1 ||
      { echo "estimate-accuracy: $name $dtype failed:" >&2; tail -5 "$out.log" >&2; exit 1; }
    rows=$(python3 - "$out.estimate.json" "$out/metrics.jsonl" "$name" "$batch" "$dtype" "$rows" <<'PY'
import json, sys
est, metrics, name, batch, dtype, rows = sys.argv[1:7]
e = json.load(open(est))
measured = next(json.loads(l)["peak_host_bytes"] for l in open(metrics) if json.loads(l).get("summary"))
rows = json.loads(rows)
rows.append({"model": name, "batch": int(batch), "dtype": dtype, "estimate_bytes": e["peak_bytes"],
             "measured_bytes": measured, "ratio": e["peak_bytes"] / measured,
             "peak_at": e["peak_at"], "state_bytes": e["state_bytes"],
             "train_activation_bytes": e["train_activation_bytes"]})
print(json.dumps(rows))
PY
)
  done
done
python3 - "$OUT" "$rows" <<'PY'
import json, sys
out, rows = sys.argv[1], json.loads(sys.argv[2])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
json.dump({"cpu": cpu, "cases": rows}, open(out, "w"), indent=2)
for r in rows:
    print(f"{r['model']:>9} b{r['batch']:<3} {r['dtype']}: estimate {r['estimate_bytes'] / 1e9:.3f} GB, "
          f"measured {r['measured_bytes'] / 1e9:.3f} GB, ratio {r['ratio']:.4f} (peak at {r['peak_at']})")
print(f"-> {out}")
PY
