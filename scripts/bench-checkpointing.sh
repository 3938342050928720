#!/usr/bin/env bash
# Activation checkpointing's cost and saving on the CPU: GPT-2 124M (batch 4 x 1024
# tokens) and BERT-base (batch 32 x 128), fp32, memory.checkpointing none against
# block (and sqrt), in one run of this script. Per run: the measured peak
# (peak_host_bytes), the estimate's training activations (dtrain estimate, which
# matches the allocator: tests/train/test_checkpointing.cpp) and the median step time
# of the steps after the first. Writes JSON to $1 (default bench-checkpointing.json)
# with activation(policy) / activation(none) and step(policy) / step(none). Reported,
# never asserted. Environment: DTRAIN (default build/src/cli/dtrain), STEPS (default
# 3), POLICIES (default "none block sqrt"), THREADS (default: all cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-bench-checkpointing.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
STEPS="${STEPS:-3}"
POLICIES="${POLICIES:-none block sqrt}"
THREADS="${THREADS:-$(nproc)}"
WORK="$(mktemp -d /tmp/bench-checkpointing.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

cat >"$WORK/gpt2.yaml" <<YAML
run: {seed: 1}
model: {arch: gpt2, seq_len: 1024}
data: {dataset: synthetic, global_batch: 4, micro_batch: 4, limit: {test: 4}}
optimizer: {name: adamw, lr: 1.0e-4}
train: {steps: $STEPS, log_every: 1}
logging: {console: false}
YAML
cat >"$WORK/bert-base.yaml" <<YAML
run: {seed: 1}
model: {arch: bert-base, seq_len: 128}
data: {dataset: synthetic, global_batch: 32, micro_batch: 32, limit: {test: 32}}
optimizer: {name: adamw, lr: 1.0e-4}
train: {steps: $STEPS, log_every: 1}
logging: {console: false}
YAML

runs="[]"
for model in ${MODELS:-gpt2 bert-base}; do
  for policy in $POLICIES; do
    out="$WORK/$model-$policy"
    echo "bench-checkpointing: $model $policy" >&2
    "$DTRAIN" estimate "$WORK/$model.yaml" --set memory.checkpointing="$policy" --json >"$out.estimate.json"
    OMP_NUM_THREADS="$THREADS" OMP_WAIT_POLICY=passive "$DTRAIN" train "$WORK/$model.yaml" \
      --set memory.checkpointing="$policy" --set run.output_dir="$out" >"$out.log" 2>&1 ||
      { echo "bench-checkpointing: $model $policy failed:" >&2; tail -5 "$out.log" >&2; exit 1; }
    runs=$(python3 - "$out.estimate.json" "$out/metrics.jsonl" "$model" "$policy" "$runs" <<'PY'
import json, statistics, sys
est, metrics, model, policy, runs = sys.argv[1:6]
e = json.load(open(est))
steps, peak = [], None
for line in open(metrics):
    j = json.loads(line)
    if j.get("summary"):
        peak = j["peak_host_bytes"]
    elif "step_time_s" in j:
        steps.append(j["step_time_s"])
runs = json.loads(runs)
runs.append({"model": model, "policy": policy, "measured_peak_bytes": peak,
             "estimate_peak_bytes": e["peak_bytes"],
             "train_activation_bytes": e["train_activation_bytes"],
             "step_time_s": statistics.median(steps[1:] or steps), "step_times_s": steps})
print(json.dumps(runs))
PY
)
  done
done
python3 - "$OUT" "$runs" "$THREADS" <<'PY'
import json, sys
out, runs, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
ratios = []
for r in runs:
    base = next(b for b in runs if b["model"] == r["model"] and b["policy"] == "none")
    if r["policy"] != "none":
        ratios.append({"model": r["model"], "policy": r["policy"],
                       "activation_ratio": r["train_activation_bytes"] / base["train_activation_bytes"],
                       "peak_ratio": r["measured_peak_bytes"] / base["measured_peak_bytes"],
                       "step_ratio": r["step_time_s"] / base["step_time_s"]})
json.dump({"threads": threads, "runs": runs, "ratios_vs_none": ratios}, open(out, "w"), indent=2)
for r in runs:
    print(f"{r['model']} {r['policy']}: activations {r['train_activation_bytes'] / 1e9:.3f} GB, "
          f"peak {r['measured_peak_bytes'] / 1e9:.3f} GB (estimate {r['estimate_peak_bytes'] / 1e9:.3f}), "
          f"step {r['step_time_s']:.2f} s")
for q in ratios:
    print(f"{q['model']} {q['policy']}: activations {q['activation_ratio']:.2f}x none, "
          f"peak {q['peak_ratio']:.2f}x, step {q['step_ratio']:.2f}x")
print(f"-> {out}")
PY
