#!/usr/bin/env bash
# What a pipeline stage holds: a GPT-2 of 8 layers (bf16 with fp32 masters, AdamW) on
# one rank, in 2 and 4 stages, and in 2 stages x 2 data ranks with ZeRO-1 (4
# oversubscribed ranks of one thread). Each stage steps its own span of the parameters,
# so its masters and optimizer state are its own, and its executor holds the parameters
# its nodes use and their gradients alone. Per rank: the measured peak (summary.json) against
# `dtrain estimate`'s peak for that stage, and the estimate's state table. Writes JSON
# (default pipeline-stage-memory.json). Memory is reported, never asserted.
#
# Usage: scripts/pipeline-stage-memory.sh [out.json]   (DTRAIN=build/src/cli/dtrain)
set -euo pipefail
cd "$(dirname "$0")/.."
DTRAIN=${DTRAIN:-build/src/cli/dtrain}
OUT=${1:-pipeline-stage-memory.json}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/job.yaml" <<JOB
run: {seed: 1}
model: {arch: gpt2-tiny, layers: 8, hidden: 256, heads: 4, ffn: 1024, seq_len: 64,
        max_positions: 64, vocab_size: 4096, dropout: 0.0}
data: {dataset: synthetic, global_batch: 8, micro_batch: 2, limit: {test: 8}}
optimizer: {name: adamw, lr: 1.0e-3}
precision: {dtype: bf16}
train: {steps: 4, log_every: 1}
logging: {console: false}
JOB
export OMP_NUM_THREADS=1
# name ranks sets...
run() {
  local name=$1 ranks=$2
  shift 2
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  "$DTRAIN" train "$WORK/job.yaml" --nproc "$ranks" --set run.output_dir="$WORK/$name" \
    "${sets[@]}" > "$WORK/$name.log" 2>&1
  "$DTRAIN" estimate "$WORK/job.yaml" --world "$ranks" --json "${sets[@]}" \
    > "$WORK/$name.estimate.json" 2> "$WORK/$name.estimate.log"
  echo "$name done" >&2
}
run one 1
run pp2 2 parallel.pipeline=2
run pp4 4 parallel.pipeline=4
run pp2-dp2-zero1 4 parallel.pipeline=2 parallel.data=2 parallel.zero_stage=1
python3 - "$WORK" "$OUT" <<'PY'
import json, sys, pathlib
work, out = pathlib.Path(sys.argv[1]), sys.argv[2]
runs = []
for name in ["one", "pp2", "pp4", "pp2-dp2-zero1"]:
    summary = json.loads((work / name / "summary.json").read_text())
    text = (work / f"{name}.estimate.json").read_text()
    est = json.loads(text[text.index("{"):])
    state = {i["kind"]: i["bytes"] for i in est["state"]}
    stages = est.get("pipeline_stages", [])
    if "pipeline" in summary:
        ranks = [{"rank": r["rank"], "stage": r["stage"], "measured_peak": r["peak_host_bytes"],
                  "estimated_peak": stages[r["stage"]]["peak_bytes"]}
                 for r in summary["pipeline"]["per_rank"]]
    else:
        ranks = [{"rank": 0, "stage": 0, "measured_peak": summary["peak_host_bytes"],
                  "estimated_peak": est["peak_bytes"]}]
    runs.append({"layout": name, "ranks": ranks, "estimate_state_largest_stage": state,
                 "test_loss": summary.get("test_loss")})
one = runs[0]["ranks"][0]["measured_peak"]
for r in runs:
    worst = max(x["measured_peak"] for x in r["ranks"])
    r["highest_rank_peak_vs_one_rank"] = worst / one
    for x in r["ranks"]:
        x["estimate_error"] = x["estimated_peak"] / x["measured_peak"] - 1
result = {"what": "per-rank peak host memory of a pipelined GPT-2 (8 layers, 256 wide, "
                  "bf16 + fp32 masters, AdamW), measured against dtrain estimate",
          "peer": "the same job on one rank", "runs": runs}
pathlib.Path(out).write_text(json.dumps(result, indent=2) + "\n")
for r in runs:
    print(r["layout"], " ".join(f"s{x['stage']}:{x['measured_peak']/1e6:.1f}MB"
                                 f"({x['estimate_error']*100:+.1f}%)" for x in r["ranks"]),
          f"highest/one {r['highest_rank_peak_vs_one_rank']:.2f}")
PY
