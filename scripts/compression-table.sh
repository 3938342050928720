#!/usr/bin/env bash
# The gradient-compression table (issue 16), on $RANKS CPU ranks (default 2, one OpenMP
# thread each; the global batch stays the job's, so more ranks split it finer):
# the quick-start ResNet-18 on Fashion-MNIST for $EPOCHS epochs (default 3) and the
# tiny GPT-2 on the fortunes corpus for $GPT_STEPS steps (default 300), each with
# compress.method none / topk 2% / topk 0.5% / onebit / powersgd rank 2 / rank 4
# (error feedback on, $WARMUP dense steps first, default 20); METHODS may also name
# topk-R-2p and onebit-2p, the same with compress.exchange: two_phase, and topk-R-g and
# onebit-g with gather (auto: two_phase where gathering moves over a quarter of a dense
# all-reduce's bytes, compress::gather_share). Per run: the final test
# accuracy (ResNet) or validation loss (GPT-2), the bytes each rank sent per step
# (comm_sent_bytes; for none the all-reduced gradient), the compression ratio, and the
# median step time. Speed is reported, never asserted.
# Writes JSON to $1 (default compression-table.json) and prints the table.
# Environment: DTRAIN (default build/src/cli/dtrain), RANKS, EPOCHS, GPT_STEPS, WARMUP,
# MODELS (default "resnet gpt2"), METHODS (names below), KEEP_RUNS=1 keeps the runs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-compression-table.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
EPOCHS="${EPOCHS:-3}"
GPT_STEPS="${GPT_STEPS:-300}"
WARMUP="${WARMUP:-20}"
RANKS="${RANKS:-2}"
MODELS="${MODELS:-resnet gpt2}"
METHODS="${METHODS:-none topk-2 topk-0.5 onebit powersgd-2 powersgd-4}"
die() { echo "compression-table: $*" >&2; exit 1; }
[[ -x "$DTRAIN" ]] || die "no dtrain binary at $DTRAIN (build it, or set DTRAIN=path)"
DTRAIN="$(readlink -f "$DTRAIN")"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
WORK="$(mktemp -d "${TMPDIR:-/tmp}/compression-table.XXXXXX")"
[[ "${KEEP_RUNS:-0}" == 1 ]] || trap 'rm -rf "$WORK"' EXIT

method_args() {
  case "$1" in
    none) echo "" ;;
    topk-*-2p) local r="${1#topk-}"; r="${r%-2p}"
      echo "--set compress.method=topk --set compress.ratio=$(python3 -c "print($r / 100)") --set compress.exchange=two_phase" ;;
    topk-*-g) local r="${1#topk-}"; r="${r%-g}"
      echo "--set compress.method=topk --set compress.ratio=$(python3 -c "print($r / 100)") --set compress.exchange=gather" ;;
    topk-*) echo "--set compress.method=topk --set compress.ratio=$(python3 -c "print(${1#topk-} / 100)")" ;;
    onebit) echo "--set compress.method=onebit" ;;
    onebit-2p) echo "--set compress.method=onebit --set compress.exchange=two_phase" ;;
    onebit-g) echo "--set compress.method=onebit --set compress.exchange=gather" ;;
    powersgd-*) echo "--set compress.method=powersgd --set compress.rank=${1#powersgd-}" ;;
    *) die "METHODS: unknown method $1" ;;
  esac
}
model_args() {
  case "$1" in
    resnet) echo "$ROOT/configs/quickstart.yaml --set train.epochs=$EPOCHS --set train.log_every=20" ;;
    gpt2)
      if [[ ! -d "$WORK/fortunes-8k" ]]; then
        "$DTRAIN" data tokenize --input /usr/share/games/fortunes --vocab-size 8192 \
          --out "$WORK/fortunes-8k" >/dev/null
      fi
      echo "$ROOT/configs/gpt2-tiny-fortunes.yaml --set data.path=$WORK/fortunes-8k" \
        "--set train.steps=$GPT_STEPS --set train.eval_every=$GPT_STEPS --set train.log_every=25" ;;
    *) die "MODELS: unknown model $1 (resnet, gpt2)" ;;
  esac
}

rows="[]"
for model in $MODELS; do
  for method in $METHODS; do
    out="$WORK/$model-$method"
    echo "compression-table: $model, $method" >&2
    # shellcheck disable=SC2046  # word splitting of the --set lists is wanted
    "$DTRAIN" train $(model_args "$model") --nproc "$RANKS" --set parallel.data="$RANKS" \
      --set comm.allreduce=ring --set compress.warmup_steps="$WARMUP" \
      --set train.checkpoint.every=1000000 --set logging.console=false \
      --set run.output_dir="$out" $(method_args "$method") >"$out.log" 2>&1 ||
      die "$model $method failed: $(tail -5 "$out.log")"
    rows=$(python3 - "$out" "$model" "$method" "$WARMUP" "$rows" <<'PY'
import json, statistics, sys
out, model, method, warmup, rows = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[5])
summary = json.load(open(f"{out}/summary.json"))
lines = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
logged = [l for l in lines if "step_time_s" in l]
# comm_bytes and comm_sent_bytes are sums over a logging window: whole windows after the
# dense warm-up only, divided by the window's steps
window = logged[1]["step"] - logged[0]["step"] if len(logged) > 1 else 1
steps = [l for l in logged if l["step"] - window >= warmup]
sent = [l["comm_sent_bytes"] / 1 for l in steps if "comm_sent_bytes" in l]
ratio = [l["compression_ratio"] for l in steps if "compression_ratio" in l]
dense = statistics.median(l["comm_bytes"] for l in steps) if steps else 0
per = summary.get("steps", 1)
row = {"model": model, "method": method,
       "test_accuracy": summary["test_accuracy"], "test_loss": summary["test_loss"],
       "bytes_per_step": (statistics.median(sent) if sent else dense) / window,
       "dense_bytes_per_step": dense / window,
       "compression_ratio": statistics.median(ratio) if ratio else 1.0,
       "step_time_s": statistics.median(l["step_time_s"] for l in steps),
       "steps": per}
rows.append(row)
print(json.dumps(rows))
PY
)
  done
done

python3 - "$OUT" "$rows" "$RANKS" <<'PY'
import json, sys
out, rows, ranks = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
print(f"{'model':7} {'method':11} {'accuracy':>9} {'test loss':>9} {'bytes/step':>11} {'ratio':>6} {'step s':>7}")
base = {r["model"]: r for r in rows if r["method"] == "none"}
for r in rows:
    b = base.get(r["model"])
    r["accuracy_delta"] = r["test_accuracy"] - b["test_accuracy"] if b else None
    r["step_time_vs_none"] = r["step_time_s"] / b["step_time_s"] if b else None
    print(f"{r['model']:7} {r['method']:11} {100 * r['test_accuracy']:8.2f}% {r['test_loss']:9.4f} "
          f"{r['bytes_per_step']:11.0f} {r['compression_ratio']:6.1f} {r['step_time_s']:7.4f}")
json.dump({"ranks": ranks, "rows": rows}, open(out, "w"), indent=2)
print(f"wrote {out}")
PY
