#!/usr/bin/env bash
# Mixed-precision cost on the CPU: peak host bytes and step time of a short
# training run in each precision, against fp32 in the same run of this script.
# Models (MODELS, space-separated; config and batch):
#   resnet50   configs/resnet50-synthetic.yaml, batch 32 (224 px, SGD; the config's micro-batch)
#   bert-base  configs/bert-base-synthetic.yaml, batch 32 x 128 tokens in one micro-batch (AdamW)
#   gpt2-124m  configs/gpt2-124m-synthetic.yaml, batch 8 x 64 tokens in one micro-batch
#              (AdamW; about 2 GB of fp32 weights and optimizer state)
# For each model and each of DTYPES (default "fp32 bf16"; fp16 is computed widened
# on CPUs and is slow) one `dtrain train` of STEPS steps (default 3; the first is
# warm-up: oneDNN builds its primitives) reads peak_host_bytes from the summary
# and the median step_time_s of the steps after the first from metrics.jsonl.
# Writes JSON to $1 (default bench-precision.json): per run the figures, per model
# the ratios peak(dtype) / peak(fp32) and step(dtype) / step(fp32). Speed and
# memory are reported, never asserted.
# GEMM section (before the models): bench_peak once (the measured fp32 FMA and bf16
# peaks, JSON key "peak") and, for each of GEMM_SHAPES (default "2048x2048x2048
# 4096x3072x768", m x n x k; the second is BERT-base's FFN up-projection at batch
# 32 x 128 tokens; "" skips the section), bench_gemm NN in bf16 and f32 (median of 10
# after 3 warm-up runs): key "gemm", per shape bf16 and f32 GFLOP/s, bf16 / measured
# bf16 peak and f32 / measured fp32 peak. Environment: DTRAIN (default
# build/src/cli/dtrain), BENCH (where bench_gemm and bench_peak are, default build/bench),
# THREADS (OpenMP threads, default: all cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-bench-precision.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
BENCH="${BENCH:-$ROOT/build/bench}"
MODELS="${MODELS:-resnet50 bert-base gpt2-124m}"
GEMM_SHAPES="${GEMM_SHAPES-2048x2048x2048 4096x3072x768}"
DTYPES="${DTYPES:-fp32 bf16}"
STEPS="${STEPS:-3}"
THREADS="${THREADS:-$(nproc)}"
WORK="$(mktemp -d /tmp/bench-precision.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# config, global batch and extra --set flags (none: "-").
config_of() {
  case "$1" in
    resnet50) echo "configs/resnet50-synthetic.yaml 32 -" ;;
    bert-base) echo "configs/bert-base-synthetic.yaml 32 data.micro_batch=32" ;;
    gpt2-124m) echo "configs/gpt2-124m-synthetic.yaml 8 data.micro_batch=8" ;;
    *) echo "bench-precision: unknown model $1 (resnet50, bert-base, gpt2-124m)" >&2; exit 2 ;;
  esac
}

peak="null"
gemm="[]"
if [ -n "$GEMM_SHAPES" ]; then
  for b in bench_peak bench_gemm; do
    [ -x "$BENCH/$b" ] || { echo "bench-precision: no $BENCH/$b (build it, or set BENCH)" >&2; exit 1; }
  done
  echo "bench-precision: bench_peak" >&2
  peak=$(OMP_NUM_THREADS="$THREADS" OMP_WAIT_POLICY=passive "$BENCH/bench_peak")
  for shape in $GEMM_SHAPES; do
    IFS=x read -r m n k <<<"$shape"
    for dtype in bf16 f32; do
      echo "bench-precision: bench_gemm $dtype m=$m n=$n k=$k" >&2
      OMP_NUM_THREADS="$THREADS" OMP_WAIT_POLICY=passive "$BENCH/bench_gemm" --device cpu \
        --dtype "$dtype" --m "$m" --n "$n" --k "$k" >"$WORK/gemm-$shape-$dtype.json" ||
        { echo "bench-precision: bench_gemm $dtype $shape failed (exit 1: spot check)" >&2; exit 1; }
    done
    gemm=$(python3 - "$WORK/gemm-$shape-bf16.json" "$WORK/gemm-$shape-f32.json" "$peak" "$gemm" <<'PY'
import json, sys
bf, f32, peak, gemm = (json.load(open(sys.argv[1])), json.load(open(sys.argv[2])),
                       json.loads(sys.argv[3]), json.loads(sys.argv[4]))
frac = lambda g, p: g / p if p else None
bf_g, f32_g = bf["tflops_median"] * 1e3, f32["tflops_median"] * 1e3
gemm.append({"m": bf["m"], "n": bf["n"], "k": bf["k"], "trans": bf["trans"],
             "bf16_gflops": bf_g, "bf16_peak_fraction": frac(bf_g, peak["bf16_peak_gflops"]),
             "f32_gflops": f32_g, "f32_peak_fraction": frac(f32_g, peak["fp32_fma_gflops"]),
             "bf16_over_f32": bf_g / f32_g,
             "spot_check_ok": bf["spot_check_ok"] and f32["spot_check_ok"]})
print(json.dumps(gemm))
PY
)
  done
fi

runs="[]"
for model in $MODELS; do
  read -r config batch extra <<<"$(config_of "$model")"
  sets=()
  [ "$extra" = "-" ] || for e in $extra; do sets+=(--set "$e"); done
  for dtype in $DTYPES; do
    out="$WORK/$model-$dtype"
    echo "bench-precision: $model $dtype ($STEPS steps, batch $batch)" >&2
    OMP_NUM_THREADS="$THREADS" OMP_WAIT_POLICY=passive "$DTRAIN" train "$ROOT/$config" \
      --set data.global_batch="$batch" --set train.steps="$STEPS" --set train.log_every=1 \
      --set precision.dtype="$dtype" --set run.output_dir="$out" --set logging.console=false \
      ${sets[@]+"${sets[@]}"} >"$out.log" 2>&1 || { echo "bench-precision: $model $dtype failed:" >&2; tail -5 "$out.log" >&2; exit 1; }
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
python3 - "$OUT" "$runs" "$THREADS" "$peak" "$gemm" <<'PY'
import json, platform, sys
out, runs, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
peak, gemm = json.loads(sys.argv[4]), json.loads(sys.argv[5])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
ratios = []
for r in runs:
    base = next((b for b in runs if b["model"] == r["model"] and b["dtype"] == "fp32"), None)
    if base and r["dtype"] != "fp32":
        ratios.append({"model": r["model"], "dtype": r["dtype"],
                       "peak_ratio": r["peak_host_bytes"] / base["peak_host_bytes"],
                       "step_ratio": r["step_time_s"] / base["step_time_s"]})
doc = {"cpu": cpu, "threads": threads, "runs": runs, "ratios_vs_fp32": ratios,
       "peak": peak, "gemm": gemm}
json.dump(doc, open(out, "w"), indent=2)
if peak:
    print(f"peak: fp32 FMA {peak['fp32_fma_gflops']} GFLOP/s, bf16 {peak['bf16_peak_gflops']} "
          f"GFLOP/s ({peak['bf16_peak_path']})")
pct = lambda f: "n/a" if f is None else f"{100 * f:.0f}%"
for g in gemm:
    print(f"gemm {g['m']}x{g['n']}x{g['k']}: bf16 {g['bf16_gflops']:.0f} GFLOP/s "
          f"({pct(g['bf16_peak_fraction'])} of bf16 peak), f32 {g['f32_gflops']:.0f} GFLOP/s "
          f"({pct(g['f32_peak_fraction'])} of fp32 peak)")
for q in ratios:
    print(f"{q['model']} {q['dtype']}: peak {q['peak_ratio']:.2f}x fp32, step {q['step_ratio']:.2f}x fp32")
print(f"-> {out}")
PY
