#!/usr/bin/env bash
# Fine-tuning step time: the same training steps with every parameter trained, with the
# first half of the model frozen, and as a linear probe (everything but the head
# frozen), optimizer.freeze in each (README "Fine-tuning"). Backward skips what only
# frozen parameters need, so the frozen runs' steps are shorter; this measures by how
# much, and what each holds: frozen layers keep no activations for backward. The three
# run interleaved round by round (full, half, probe, full, ...) so that load from other
# jobs hits all alike. Writes JSON to $1 (default bench-finetune.json): per round each
# run's median step time (the first WARMUP steps left out), and per setting the median
# over rounds and its ratio to the full run's (under 1: faster); per setting the
# measured peak (peak_host_bytes, the first round's summary) beside `dtrain estimate`'s
# peak, training activations and FLOPs per step. Speed is reported, never asserted.
#
# Environment: DTRAIN (binary; default build/src/cli/dtrain), JOB (default
# configs/vit-b16-synthetic.yaml, whose names the default patterns use), HALF and PROBE
# (optimizer.freeze values), HALF_NAME and PROBE_NAME (their labels in the JSON: "half",
# "probe"), ROUNDS (2), STEPS (6), WARMUP (2), BATCH (global batch, 8).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-bench-finetune.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
JOB="${JOB:-$ROOT/configs/vit-b16-synthetic.yaml}"
HALF_DEFAULT="[conv_proj, encoder.embed"
for l in 0 1 2 3 4 5; do HALF_DEFAULT+=", encoder.layers.encoder_layer_$l"; done
HALF="${HALF:-$HALF_DEFAULT]}"
PROBE="${PROBE:-[conv_proj, encoder]}"
HALF_NAME="${HALF_NAME:-half}"
PROBE_NAME="${PROBE_NAME:-probe}"
ROUNDS="${ROUNDS:-2}"
STEPS="${STEPS:-6}"
WARMUP="${WARMUP:-2}"
BATCH="${BATCH:-8}"
die() { echo "bench-finetune: $*" >&2; exit 1; }
[[ -x "$DTRAIN" ]] || die "no dtrain binary at $DTRAIN (build it, or set DTRAIN=path)"
((STEPS > WARMUP)) || die "STEPS=$STEPS must exceed WARMUP=$WARMUP"

WORK="$(mktemp -d /tmp/bench-finetune.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
declare -A FREEZE=([full]="[]" [half]="$HALF" [probe]="$PROBE")
SETS=(--set "data.global_batch=$BATCH" --set "data.micro_batch=$BATCH" --set train.eval_every=null)
for name in full half probe; do
  "$DTRAIN" estimate "$JOB" --json "${SETS[@]}" --set "optimizer.freeze=${FREEZE[$name]}" \
    >"$WORK/$name-estimate.json" 2>"$WORK/$name-estimate.log" ||
    { cat "$WORK/$name-estimate.log" >&2; die "the $name estimate failed"; }
done
for round in $(seq 1 "$ROUNDS"); do
  for name in full half probe; do
    echo "bench-finetune: round $round, $name" >&2
    "$DTRAIN" train "$JOB" --set "run.output_dir=$WORK/$name-$round" --set "train.steps=$STEPS" \
      --set train.log_every=1 "${SETS[@]}" --set train.checkpoint.every=1000000 \
      --set logging.console=false --set "optimizer.freeze=${FREEZE[$name]}" >"$WORK/$name-$round.log" 2>&1 ||
      { cat "$WORK/$name-$round.log" >&2; die "the $name run failed"; }
  done
done

python3 - "$WORK" "$OUT" "$ROUNDS" "$WARMUP" "$JOB" "$HALF" "$PROBE" "$("$DTRAIN" --version)" \
  "$HALF_NAME" "$PROBE_NAME" "$BATCH" <<'PY'
import json, os, statistics, sys
work, out, rounds, warmup, job, half, probe, version, half_name, probe_name, batch = sys.argv[1:]
rounds, warmup = int(rounds), int(warmup)
per_round = {}
for name in ("full", "half", "probe"):
    per_round[name] = []
    for r in range(1, rounds + 1):
        with open(os.path.join(work, f"{name}-{r}", "metrics.jsonl")) as f:
            lines = [json.loads(x) for x in f]
        steps = [x["step_time_s"] for x in lines if "step_time_s" in x and not x.get("eval")]
        per_round[name].append(statistics.median(steps[warmup:]))
median = {k: statistics.median(v) for k, v in per_round.items()}
memory = {}
for name in ("full", "half", "probe"):
    with open(os.path.join(work, f"{name}-estimate.json")) as f:
        text = f.read()
    est = json.loads(text[text.index("{"):])
    with open(os.path.join(work, f"{name}-1", "summary.json")) as f:
        measured = json.load(f)["peak_host_bytes"]
    memory[name] = {
        "measured_peak_bytes": measured, "estimated_peak_bytes": est["peak_bytes"],
        "estimated_peak_at": est["peak_at"],
        "estimated_train_activation_bytes": est["train_activation_bytes"],
        "estimated_step_flops": est["step_flops"],
    }
labels = {"full": "full", "half": half_name, "probe": probe_name}
relabel = lambda d: {labels[k]: v for k, v in d.items()}
result = {
    "job": job, "dtrain": version,
    "freeze": {"full": [], half_name: half, probe_name: probe},
    "batch": int(batch),
    "rounds": rounds, "warmup_steps_left_out": warmup,
    "step_s_per_round": relabel(per_round), "median_step_s": relabel(median),
    "ratio_to_full": relabel({k: median[k] / median["full"] for k in median}),
    "memory": relabel(memory),
}
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump(result, f, indent=2)
os.replace(tmp, out)
for k in ("full", "half", "probe"):
    m = memory[k]
    print(f"{labels[k]:6s} median step {median[k]:.3f} s, {median[k] / median['full']:.2f} of full;"
          f" peak {m['measured_peak_bytes'] / 1e9:.3f} GB measured,"
          f" {m['estimated_peak_bytes'] / 1e9:.3f} GB estimated")
PY
