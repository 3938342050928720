#!/usr/bin/env bash
# Fine-tuning step time: the same training steps with every parameter trained, with the
# first half of the model frozen, and as a linear probe (everything but the head
# frozen), optimizer.freeze in each (README "Fine-tuning"). Backward skips what only
# frozen parameters need, so the frozen runs' steps are shorter; this measures by how
# much. The three run interleaved round by round (full, half, probe, full, ...) so
# that load from other jobs hits all alike. Writes JSON to $1 (default
# bench-finetune.json): per round each run's median step time (the first WARMUP steps
# left out), and per setting the median over rounds and its ratio to the full run's
# (under 1: faster). Speed is reported, never asserted.
#
# Environment: DTRAIN (binary; default build/src/cli/dtrain), JOB (default
# configs/vit-b16-synthetic.yaml, whose names the default patterns use), HALF and PROBE
# (optimizer.freeze values), ROUNDS (2), STEPS (6), WARMUP (2), BATCH (global batch, 8).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-bench-finetune.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
JOB="${JOB:-$ROOT/configs/vit-b16-synthetic.yaml}"
HALF_DEFAULT="[conv_proj, encoder.embed"
for l in 0 1 2 3 4 5; do HALF_DEFAULT+=", encoder.layers.encoder_layer_$l"; done
HALF="${HALF:-$HALF_DEFAULT]}"
PROBE="${PROBE:-[conv_proj, encoder]}"
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
for round in $(seq 1 "$ROUNDS"); do
  for name in full half probe; do
    echo "bench-finetune: round $round, $name" >&2
    "$DTRAIN" train "$JOB" --set "run.output_dir=$WORK/$name-$round" --set "train.steps=$STEPS" \
      --set train.log_every=1 --set "data.global_batch=$BATCH" --set "data.micro_batch=$BATCH" \
      --set train.eval_every=null --set train.checkpoint.every=1000000 \
      --set logging.console=false --set "optimizer.freeze=${FREEZE[$name]}" >"$WORK/$name-$round.log" 2>&1 ||
      { cat "$WORK/$name-$round.log" >&2; die "the $name run failed"; }
  done
done

python3 - "$WORK" "$OUT" "$ROUNDS" "$WARMUP" "$JOB" "$HALF" "$PROBE" "$("$DTRAIN" --version)" <<'PY'
import json, os, statistics, sys
work, out, rounds, warmup, job, half, probe, version = sys.argv[1:]
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
result = {
    "job": job, "dtrain": version, "freeze": {"full": [], "half": half, "probe": probe},
    "rounds": rounds, "warmup_steps_left_out": warmup,
    "step_s_per_round": per_round, "median_step_s": median,
    "ratio_to_full": {k: median[k] / median["full"] for k in median},
}
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump(result, f, indent=2)
os.replace(tmp, out)
for k in ("full", "half", "probe"):
    print(f"{k:6s} median step {median[k]:.3f} s, {median[k] / median['full']:.2f} of full")
PY
