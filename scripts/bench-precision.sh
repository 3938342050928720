#!/usr/bin/env bash
# Mixed-precision cost on the CPU: peak host bytes and step time of a short
# training run in each precision, against fp32 in the same run of this script.
# Models (MODELS, space-separated; config and batch):
#   resnet50   configs/resnet50-synthetic.yaml, batch 32 (224 px, SGD)
#   bert-base  configs/bert-base-synthetic.yaml, batch 32 x 128 tokens (AdamW)
# For each model and each of DTYPES (default "fp32 bf16"; fp16 is computed widened
# on CPUs and is slow) one `dtrain train` of STEPS steps (default 3; the first is
# warm-up: oneDNN builds its primitives) reads peak_host_bytes from the summary
# and the median step_time_s of the steps after the first from metrics.jsonl.
# Writes JSON to $1 (default bench-precision.json): per run the figures, per model
# the ratios peak(dtype) / peak(fp32) and step(dtype) / step(fp32). Speed and
# memory are reported, never asserted. Environment: DTRAIN (default
# build/src/cli/dtrain), THREADS (OpenMP threads, default: all cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-bench-precision.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
MODELS="${MODELS:-resnet50 bert-base}"
DTYPES="${DTYPES:-fp32 bf16}"
STEPS="${STEPS:-3}"
THREADS="${THREADS:-$(nproc)}"
WORK="$(mktemp -d /tmp/bench-precision.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

config_of() {
  case "$1" in
    resnet50) echo "configs/resnet50-synthetic.yaml 32" ;;
    bert-base) echo "configs/bert-base-synthetic.yaml 32" ;;
    *) echo "bench-precision: unknown model $1 (resnet50, bert-base)" >&2; exit 2 ;;
  esac
}

runs="[]"
for model in $MODELS; do
  read -r config batch <<<"$(config_of "$model")"
  for dtype in $DTYPES; do
    out="$WORK/$model-$dtype"
    echo "bench-precision: $model $dtype ($STEPS steps, batch $batch)" >&2
    OMP_NUM_THREADS="$THREADS" OMP_WAIT_POLICY=passive "$DTRAIN" train "$ROOT/$config" \
      --set data.global_batch="$batch" --set train.steps="$STEPS" --set train.log_every=1 \
      --set precision.dtype="$dtype" --set run.output_dir="$out" --set logging.console=false \
      >"$out.log" 2>&1 || { echo "bench-precision: $model $dtype failed:" >&2; tail -5 "$out.log" >&2; exit 1; }
    runs=$(python3 - "$out/metrics.jsonl" "$model" "$dtype" "$runs" <<'PY'
import json, statistics, sys
path, model, dtype, runs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
steps, peak = [], None
for line in open(path):
    j = json.loads(line)
    if j.get("summary"):
        peak = j["peak_host_bytes"]
    elif "step_time_s" in j:
        steps.append(j["step_time_s"])
runs.append({"model": model, "dtype": dtype, "peak_host_bytes": peak,
             "step_time_s": statistics.median(steps[1:] or steps), "step_times_s": steps})
print(json.dumps(runs))
PY
)
  done
done
python3 - "$OUT" "$runs" "$THREADS" <<'PY'
import json, platform, sys
out, runs, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
ratios = []
for r in runs:
    base = next((b for b in runs if b["model"] == r["model"] and b["dtype"] == "fp32"), None)
    if base and r["dtype"] != "fp32":
        ratios.append({"model": r["model"], "dtype": r["dtype"],
                       "peak_ratio": r["peak_host_bytes"] / base["peak_host_bytes"],
                       "step_ratio": r["step_time_s"] / base["step_time_s"]})
doc = {"cpu": cpu, "threads": threads, "runs": runs, "ratios_vs_fp32": ratios}
json.dump(doc, open(out, "w"), indent=2)
for q in ratios:
    print(f"{q['model']} {q['dtype']}: peak {q['peak_ratio']:.2f}x fp32, step {q['step_ratio']:.2f}x fp32")
print(f"-> {out}")
PY
