#!/usr/bin/env bash
# `dtrain plan`'s ranking against measured runs: the layouts of a small GPT-2 over 4
# oversubscribed ranks of this machine (pipeline x data x tensor, both grid orders),
# each trained for STEPS steps; the median step time of the steps after the first two
# against the planner's modelled step time for the same layout and micro-batch, and
# the Spearman rank correlation of the two orders. Writes JSON (default
# plan-vs-measured.json). Speed is reported, never asserted.
#
# Usage: scripts/plan-vs-measured.sh [out.json]   (DTRAIN=build/src/cli/dtrain STEPS=12)
set -euo pipefail
cd "$(dirname "$0")/.."
DTRAIN=${DTRAIN:-build/src/cli/dtrain}
STEPS=${STEPS:-12}
OUT=${1:-plan-vs-measured.json}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
CLUSTER=bench/clusters/this-machine-4ranks.yaml
cat > "$WORK/job.yaml" <<JOB
run: {seed: 1}
model: {arch: gpt2-tiny, layers: 4, hidden: 128, heads: 4, ffn: 512, seq_len: 64,
        max_positions: 64, vocab_size: 2048, dropout: 0.0}
data: {dataset: synthetic, global_batch: 16, micro_batch: 4, limit: {test: 16}}
optimizer: {name: adamw, lr: 1.0e-3}
train: {steps: $STEPS, log_every: 1}
logging: {console: false}
JOB
export OMP_NUM_THREADS=1
"$DTRAIN" plan "$WORK/job.yaml" --cluster "$CLUSTER" --json > "$WORK/plan.json"
# layout: pipeline data tensor order micro_batch
LAYOUTS=("1 4 1 pp_dp_tp 4" "1 2 2 pp_dp_tp 4" "1 1 4 pp_dp_tp 4" "2 2 1 pp_dp_tp 2"
         "2 2 1 dp_pp_tp 2" "2 1 2 pp_dp_tp 4" "4 1 1 pp_dp_tp 4" "1 4 1 pp_dp_tp 2"
         "1 1 4 pp_dp_tp 8")
for l in "${LAYOUTS[@]}"; do
  read -r p d t o mb <<<"$l"
  name="pp$p-dp$d-tp$t-$o-mb$mb"
  "$DTRAIN" train "$WORK/job.yaml" --nproc 4 --set run.output_dir="$WORK/$name" \
    --set parallel.pipeline="$p" --set parallel.data="$d" --set parallel.tensor="$t" \
    --set parallel.order="$o" --set data.micro_batch="$mb" > "$WORK/$name.log" 2>&1
  echo "$name done" >&2
done
python3 - "$WORK" "$OUT" "${LAYOUTS[@]}" <<'PY'
import json, statistics, sys, platform
work, out, layouts = sys.argv[1], sys.argv[2], sys.argv[3:]
plan = json.load(open(f"{work}/plan.json"))
rows = []
for l in layouts:
    p, d, t, o, mb = l.split()
    p, d, t, mb = int(p), int(d), int(t), int(mb)
    name = f"pp{p}-dp{d}-tp{t}-{o}-mb{mb}"
    lines = [json.loads(x) for x in open(f"{work}/{name}/metrics.jsonl")]
    times = [x["step_time_s"] for x in lines if "step_time_s" in x and x.get("step", 0) > 2]
    model = [x for x in plan["layouts"] if x["pipeline"] == p and x["data"] == d and
             x["tensor"] == t and x["micro_batch"] == mb and x["zero_stage"] == 0 and
             not x["checkpointing"] and ("parallel.order=" + o in x["sets"] or
                                         not any(s.startswith("parallel.order=") for s in x["sets"]))]
    rows.append({"layout": name, "measured_step_s": statistics.median(times),
                 "modelled_step_s": model[0]["step_seconds"], "modelled_why": model[0]["why"]})
def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0] * len(v)
    for k, i in enumerate(order): r[i] = k
    return r
a = ranks([r["measured_step_s"] for r in rows]); b = ranks([r["modelled_step_s"] for r in rows])
n = len(rows)
rho = 1 - 6 * sum((x - y) ** 2 for x, y in zip(a, b)) / (n * (n * n - 1))
best_measured = rows[a.index(0)]["layout"]; best_modelled = rows[b.index(0)]["layout"]
json.dump({"what": "dtrain plan's modelled step time against measured runs of the same layouts",
           "machine": platform.processor() or platform.machine(), "ranks": 4,
           "cluster": "bench/clusters/this-machine-4ranks.yaml", "layouts": rows,
           "spearman_rank_correlation": rho, "best_measured": best_measured,
           "best_modelled": best_modelled}, open(out, "w"), indent=2)
print(f"spearman {rho:.2f}; best measured {best_measured}, best modelled {best_modelled}")
for r in rows: print(f"  {r['layout']:<26} measured {r['measured_step_s']*1e3:8.1f} ms  modelled {r['modelled_step_s']*1e3:8.1f} ms")
PY
