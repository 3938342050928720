#!/usr/bin/env bash
# What padding GPT-2's vocabulary buys on this CPU: configs/gpt2-124m-synthetic.yaml
# (batch 4 x 64, fp32, AdamW) with model.vocab_size 50257 (GPT-2's) and 50304 (rounded
# up to a multiple of 64: the LM head's GEMM and the embedding rows aligned),
# interleaved round by round, median step time after 2 warm-up steps. The padded
# rows are never a label, so the loss and the model are GPT-2's (the 47 extra logits
# only take softmax mass before training pushes them down). Writes JSON (default
# gpt2-vocab-padding.json). Speed is reported, never asserted.
#
# Usage: scripts/gpt2-vocab-padding.sh [out.json]  (DTRAIN, ROUNDS=2, STEPS=7)
set -euo pipefail
cd "$(dirname "$0")/.."
DTRAIN=${DTRAIN:-build/src/cli/dtrain}
OUT=${1:-gpt2-vocab-padding.json}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-7}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
for ((r = 1; r <= ROUNDS; r++)); do
  for v in 50257 50304; do
    "$DTRAIN" train configs/gpt2-124m-synthetic.yaml --set model.vocab_size=$v \
      --set train.steps="$STEPS" --set train.log_every=1 --set run.output_dir="$WORK/$v-$r" \
      > "$WORK/$v-$r.log" 2>&1 || { echo "vocab $v round $r failed: see $WORK/$v-$r.log" >&2; exit 1; }
    echo "round $r vocab $v done" >&2
  done
done
python3 - "$WORK" "$OUT" "$ROUNDS" <<'PY'
import json, pathlib, statistics, sys
work, out, rounds = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
res = {}
for v in (50257, 50304):
    meds = []
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open(work / f"{v}-{r}" / "metrics.jsonl")]
        t = [x["step_time_s"] for x in rows if "step_time_s" in x][2:]
        meds.append(statistics.median(t))
    res[str(v)] = {"round_medians_s": meds, "median_s": statistics.median(meds)}
ratio = res["50304"]["median_s"] / res["50257"]["median_s"]
pathlib.Path(out).write_text(json.dumps(
    {"what": "GPT-2 124M fp32 step, batch 4 x 64, AdamW: vocabulary 50257 vs padded 50304",
     "peer": "vocab_size 50257", "results": res,
     "padded_over_unpadded": ratio}, indent=2) + "\n")
print(f"50257: {res['50257']['median_s']:.3f} s  50304: {res['50304']['median_s']:.3f} s  "
      f"ratio {ratio:.3f}")
PY
