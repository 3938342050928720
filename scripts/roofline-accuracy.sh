#!/usr/bin/env bash
# The roofline step time (runtime/roofline.h) against the measured one, on the CPU, for
# small models: ResNet-18 (small stem, width 0.25, 28 px, batch 32), BERT-mini and
# GPT-2 tiny (batch 8 x 128 tokens), in fp32 and bf16 by default. Per case one
# `dtrain estimate --json` (the prediction, its step_seconds: this host's measured
# peaks, the job's graph) and one `dtrain train` of STEPS steps on synthetic data whose
# metrics.jsonl gives each step's step_time_s; the measured figure is the mean of the
# steps after the first. Writes JSON to $1 (default roofline-accuracy.json) with
# predicted / measured per case. The roofline is a lower bound (every kernel at peak,
# no framework time), so the ratio sits below 1; reported, never asserted.
# Environment: DTRAIN (default build/src/cli/dtrain), CASES (default all, "name:batch"
# words, e.g. "resnet18:32 gpt2-tiny:8"), DTYPES (default "fp32 bf16"), STEPS (default
# 6), THREADS (default: all cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-roofline-accuracy.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
CASES="${CASES:-resnet18:32 bert-mini:8 gpt2-tiny:8}"
DTYPES="${DTYPES:-fp32 bf16}"
STEPS="${STEPS:-6}"
THREADS="${THREADS:-$(nproc)}"
WORK="$(mktemp -d /tmp/roofline-accuracy.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

[ -x "$DTRAIN" ] || { echo "roofline-accuracy: $DTRAIN not found (build it, or set DTRAIN)" >&2; exit 2; }

model_of() {
  case "$1" in
    resnet18) echo "{arch: resnet18, stem: small, width: 0.25, image_size: 28, in_channels: 1, num_classes: 10}|sgd" ;;
    bert-mini) echo "{arch: bert-mini, seq_len: 128}|adamw" ;;
    gpt2-tiny) echo "{arch: gpt2-tiny, seq_len: 128}|adamw" ;;
    *) echo "roofline-accuracy: unknown model $1" >&2; exit 2 ;;
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
data: {dataset: synthetic, global_batch: $batch, micro_batch: $batch, limit: {test: $batch}}
optimizer: {name: $optim, lr: 1.0e-4, momentum: 0.9}
train: {steps: $STEPS, log_every: 1}
logging: {console: false}
YAML
  [ "$optim" = sgd ] || sed -i 's/, momentum: 0.9//' "$job"
  for dtype in $DTYPES; do
    out="$WORK/$name-$batch-$dtype"
    echo "roofline-accuracy: $name batch $batch $dtype" >&2
    OMP_NUM_THREADS="$THREADS" OMP_WAIT_POLICY=passive "$DTRAIN" estimate "$job" --json \
      --set precision.dtype="$dtype" >"$out.roofline.json"
    OMP_NUM_THREADS="$THREADS" OMP_WAIT_POLICY=passive "$DTRAIN" train "$job" \
      --set precision.dtype="$dtype" --set run.output_dir="$out" >"$out.log" 2>&1 ||
      { echo "roofline-accuracy: $name $dtype failed:" >&2; tail -5 "$out.log" >&2; exit 1; }
    rows=$(python3 - "$out.roofline.json" "$out/metrics.jsonl" "$name" "$batch" "$dtype" "$rows" <<'PY'
import json, statistics, sys
roof, metrics, name, batch, dtype, rows = sys.argv[1:7]
e = json.load(open(roof))
if e["step_seconds"] is None:
    sys.exit(f"roofline-accuracy: {name} {dtype}: {e['step_time_missing']}")
r = e["step_time"]
steps = [j["step_time_s"] for j in map(json.loads, open(metrics))
         if not j.get("summary") and "step_time_s" in j]
measured = statistics.mean(steps[1:] or steps)
rows = json.loads(rows)
rows.append({"model": name, "batch": int(batch), "dtype": dtype,
             "predicted_s": r["seconds"], "measured_s": measured,
             "ratio": r["seconds"] / measured,
             "compute_bound_s": r["compute_bound_seconds"],
             "memory_bound_s": r["memory_bound_seconds"],
             "recompute_s": r["recompute_seconds"], "optimizer_s": r["optimizer_seconds"], "flops": r["flops"], "bytes": r["bytes"],
             "peak_source": r["source"], "step_times_s": steps})
print(json.dumps(rows))
PY
)
  done
done
python3 - "$OUT" "$rows" "$THREADS" <<'PY'
import json, sys
out, rows, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
json.dump({"cpu": cpu, "threads": threads, "cases": rows}, open(out, "w"), indent=2)
for r in rows:
    print(f"{r['model']:>9} b{r['batch']:<3} {r['dtype']}: predicted {r['predicted_s'] * 1e3:.1f} ms "
          f"(compute-bound {r['compute_bound_s'] * 1e3:.1f}, memory-bound {r['memory_bound_s'] * 1e3:.1f}), "
          f"measured {r['measured_s'] * 1e3:.1f} ms, ratio {r['ratio']:.3f}")
    print(f"{'':>14}peak: {r['peak_source']}")
print(f"-> {out}")
PY
