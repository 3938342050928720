#!/usr/bin/env bash
# CPU peer benchmark: median fp32 training-step time of dtrain against eager
# PyTorch on the same model, data shape, optimizer and threads, interleaved
# dtrain, torch, dtrain, torch, ... so that load from other jobs on a shared
# machine hits both alike. MODEL picks the pair:
#   resnet50   configs/resnet50-synthetic.yaml  vs bench/peers/torch_resnet50_step.py,
#              twice per round: NCHW and channels_last (PyTorch's faster setting for
#              convolutional nets; the ratio is against the faster of the two)
#              (batch 32 x 3 x 224 x 224, SGD momentum 0.9; goal ratio 0.5)
#   vit-b16    configs/vit-b16-synthetic.yaml   vs torch_resnet50_step.py --arch vit_b_16
#              (batch 16 x 3 x 224 x 224, AdamW; goal ratio 0.6)
#   bert-base  configs/bert-base-synthetic.yaml vs bench/peers/torch_transformer_step.py
#              (masked LM, batch 8 x 128 tokens, AdamW; goal ratio 0.6)
#   gpt2       configs/gpt2-124m-synthetic.yaml vs bench/peers/torch_transformer_step.py
#              (batch 4 x 64 tokens, AdamW; goal ratio 0.6)
#   gpt2-long  the same job at batch 8 x 256 tokens (--set overrides), the same peer
# Each round also measures this machine's fp32 FMA peak (`dtrain bench`, the machine
# line; the highest round's is the machine's, a lower one was disturbed) so that
# dtrain's share of it (the step's FLOPs from `dtrain estimate` / median step time /
# peak) comes from the same run; issue 19's goal is a share of 0.85.
# Writes JSON to $1 (default bench-cpu-peers-$MODEL.json): per-round medians,
# per-round ratio dtrain/torch, and their medians. Speed is reported, never asserted.
#
# PyTorch is a benchmark peer, not a dtrain dependency: when /usr/bin/python3 cannot
# import torch, this script installs Debian's python3-torch and python3-torchvision
# with apt-get (root needed). scripts/install-deps.sh does not install them.
#
# Environment: MODEL (resnet50), DTRAIN (binary; default build/src/cli/dtrain), ROUNDS (2),
# STEPS (steps per run, 2 of them warm-up; default 7), THREADS (2), KEEP_RUNS=1
# keeps the dtrain run directories.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${MODEL:-resnet50}"
OUT="${1:-bench-cpu-peers-$MODEL.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
ROUNDS="${ROUNDS:-2}"
STEPS="${STEPS:-7}"
THREADS="${THREADS:-2}"
WARMUP=2
PY=/usr/bin/python3
die() { echo "bench-cpu-peers: $*" >&2; exit 1; }

SETS=()  # --set overrides of the config
PEERS=("$ROOT/bench/peers/torch_resnet50_step.py")
case "$MODEL" in
  resnet50)
    CONFIG="$ROOT/configs/resnet50-synthetic.yaml" GOAL=0.5
    VARIANTS=(nchw channels_last)
    TORCH_nchw=() TORCH_channels_last=(--channels-last)
    WHAT="resnet50 fp32 train step, batch 32x3x224x224, SGD momentum 0.9" ;;
  vit-b16)
    CONFIG="$ROOT/configs/vit-b16-synthetic.yaml" GOAL=0.6
    VARIANTS=(eager) TORCH_eager=(--arch vit_b_16 --batch 16)
    WHAT="vit-b16 fp32 train step, batch 16x3x224x224, AdamW" ;;
  bert-base)
    CONFIG="$ROOT/configs/bert-base-synthetic.yaml" GOAL=0.6
    PEERS=("$ROOT/bench/peers/torch_transformer_step.py")
    VARIANTS=(eager) TORCH_eager=(--model bert-base)
    WHAT="bert-base masked-LM fp32 train step, batch 8 x 128 tokens, AdamW" ;;
  gpt2)
    CONFIG="$ROOT/configs/gpt2-124m-synthetic.yaml" GOAL=0.6
    PEERS=("$ROOT/bench/peers/torch_transformer_step.py")
    VARIANTS=(eager) TORCH_eager=(--model gpt2)
    WHAT="gpt2 124M fp32 train step, batch 4 x 64 tokens, AdamW" ;;
  gpt2-long)
    CONFIG="$ROOT/configs/gpt2-124m-synthetic.yaml" GOAL=0.6
    SETS=(--set model.seq_len=256 --set data.global_batch=8 --set data.micro_batch=8
          --set data.limit.test=8)
    PEERS=("$ROOT/bench/peers/torch_transformer_step.py")
    VARIANTS=(eager) TORCH_eager=(--model gpt2 --batch 8 --seq 256)
    WHAT="gpt2 124M fp32 train step, batch 8 x 256 tokens, AdamW" ;;
  *) die "MODEL=$MODEL: expected resnet50, vit-b16, bert-base, gpt2 or gpt2-long" ;;
esac

[[ -x "$DTRAIN" ]] || die "no dtrain binary at $DTRAIN (build it, or set DTRAIN=path)"
((STEPS >= WARMUP + 5)) || die "STEPS=$STEPS must leave at least 5 timed steps after $WARMUP warm-up"
((ROUNDS >= 2)) || die "ROUNDS=$ROUNDS: interleaving needs at least 2 rounds"

ensure_torch() {
  "$PY" -c 'import torch, torchvision' 2>/dev/null && return
  echo "bench-cpu-peers: installing python3-torch python3-torchvision (apt-get)" >&2
  [[ $(id -u) == 0 ]] || die "PyTorch is missing and installing it needs root: apt-get install python3-torch python3-torchvision"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch python3-torchvision >/dev/null
}
ensure_torch

# Debian's torch is built with BLAS_INFO=generic: nn.Linear and matmul go to
# whatever libblas.so.3 resolves to. With only libblas3 installed that is the
# single-threaded reference (Netlib) BLAS, ~100x slower than a tuned GEMM, which
# would make any transformer comparison meaningless. The peer gets Debian's
# OpenMP build of OpenBLAS (it takes over the libblas.so.3 alternative and runs
# on the same OpenMP pool as torch, so no second thread pool spins).
blas_target() { readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true; }
ensure_blas() {
  [[ "$(blas_target)" == *openblas* ]] && return
  echo "bench-cpu-peers: libblas.so.3 is $(blas_target) (reference BLAS); installing libopenblas0-openmp for the PyTorch peer" >&2
  [[ $(id -u) == 0 ]] || die "PyTorch would run on the reference BLAS ($(blas_target)); install an optimised one: apt-get install libopenblas0-openmp"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas0-openmp >/dev/null
  [[ "$(blas_target)" == *openblas* ]] ||
    die "libblas.so.3 still resolves to $(blas_target) after installing OpenBLAS; select it: update-alternatives --config libblas.so.3-x86_64-linux-gnu"
}
ensure_blas

# One thread pool per process, THREADS wide (PLATFORM.md: a BLAS pool spinning
# beside the OpenMP pool made a PyTorch step 7x slower here). OpenBLAS and MKL
# get one thread each so that only OpenMP runs in parallel (the OpenMP build of
# OpenBLAS still runs its GEMM on OMP_NUM_THREADS threads: torch.matmul at 2048^3
# measured 191 GF/s on 2 threads with OPENBLAS_NUM_THREADS=1); OPENBLAS_CORETYPE
# is the caller's setting and stays as it is (the JSON records it): where a machine
# sets Haswell on an AVX-512 CPU, OPENBLAS_CORETYPE=SkylakeX gives PyTorch OpenBLAS's
# AVX-512 kernels, the fair peer (README, 2026-12-06).
export OMP_NUM_THREADS="$THREADS" OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-cpu-peers.XXXXXX")"
cleanup() { [[ "${KEEP_RUNS:-0}" == 1 ]] || rm -rf "$WORK"; }
trap cleanup EXIT

# dtrain: the per-step step_time_s lines of metrics.jsonl (log_every=1).
run_dtrain() {
  local dir="$WORK/dtrain-r$1"
  "$DTRAIN" train "$CONFIG" "${SETS[@]}" --set "train.steps=$STEPS" --set train.log_every=1 \
    --set "run.output_dir=$dir" >"$WORK/dtrain-r$1.log" 2>&1 ||
    die "dtrain run $1 failed; see $WORK/dtrain-r$1.log (KEEP_RUNS=1 keeps it)"
  "$PY" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "step_time_s" in r]
print(json.dumps({"step_times_s": [r["step_time_s"] for r in steps],
                  "data_wait_s": [r.get("data_wait_s") for r in steps],
                  "peak_host_bytes": steps[-1].get("peak_host_bytes")}))' "$dir/metrics.jsonl"
}

# run_torch ROUND VARIANT: the peer's JSON line.
run_torch() {
  local args="TORCH_$2[@]"
  "$PY" "${PEERS[@]}" "${!args}" --steps "$STEPS" --warmup "$WARMUP" --threads "$THREADS" \
    2>"$WORK/torch-r$1-$2.log" || die "PyTorch run $1 ($2) failed: $(tail -3 "$WORK/torch-r$1-$2.log")"
}

# This machine's fp32 FMA peak now (GFLOP/s; dtrain bench measures it for its machine line).
run_peak() {
  "$DTRAIN" bench --suite kernels --only no-figure --out "$WORK/peak-r$1.json" >/dev/null 2>&1 ||
    die "dtrain bench (peak) failed"
  "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["machine"]["fp32_peak_gflops"])' \
    "$WORK/peak-r$1.json"
}

# The step's FLOPs as dtrain counts them (the graph's forward x 3).
STEP_FLOPS="$("$DTRAIN" estimate "$CONFIG" "${SETS[@]}" --json 2>/dev/null |
  "$PY" -c 'import json, sys; t = sys.stdin.read(); print(json.loads(t[t.index("{"):])["step_flops"])')" ||
  die "dtrain estimate $CONFIG failed"

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
: >"$WORK/rounds.jsonl"
for ((r = 1; r <= ROUNDS; r++)); do
  echo "bench-cpu-peers: round $r/$ROUNDS: dtrain" >&2
  d="$(run_dtrain "$r")"
  t="{"
  for v in "${VARIANTS[@]}"; do
    echo "bench-cpu-peers: round $r/$ROUNDS: torch ($v)" >&2
    t+="\"$v\": $(run_torch "$r" "$v"),"
  done
  t="${t%,}}"
  p="$(run_peak "$r")"
  echo "{\"round\": $r, \"loadavg\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"peak_gflops\": $p, \"dtrain\": $d, \"torch\": $t}" >>"$WORK/rounds.jsonl"
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

# Summary: each round's medians (warm-up skipped) and ratio; overall = medians of those.
"$PY" - "$WORK/rounds.jsonl" "$OUT" "$WARMUP" <<EOF
import json, os, platform, statistics, subprocess, sys
rounds_file, out, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
med = statistics.median
step_flops = float("$STEP_FLOPS")
rounds = []
for line in open(rounds_file):
    r = json.loads(line)
    d = med(r["dtrain"]["step_times_s"][warmup:])
    torch = {v: med(t["step_times_s"][warmup:]) for v, t in r["torch"].items()}
    best = min(torch, key=torch.get)  # PyTorch's faster setting in this round
    peak = r["peak_gflops"] * 1e9
    rounds.append({"round": r["round"], "loadavg_after": r["loadavg"],
                   "peak_gflops": r["peak_gflops"],
                   "dtrain_median_s": d, "torch_median_s": torch, "torch_best": best,
                   "ratio_dtrain_over_torch": d / torch[best],
                   "dtrain_share_of_peak": step_flops / d / peak,
                   "dtrain_step_times_s": r["dtrain"]["step_times_s"],
                   "dtrain_first_step_over_median": r["dtrain"]["step_times_s"][0] / d,
                   "dtrain_data_wait_s": r["dtrain"]["data_wait_s"],
                   "dtrain_peak_host_bytes": r["dtrain"]["peak_host_bytes"],
                   "torch_step_times_s": {v: t["step_times_s"] for v, t in r["torch"].items()}})
first = json.loads(open(rounds_file).readline())["torch"]
torch_info = next(iter(first.values()))
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
ratio = med([r["ratio_dtrain_over_torch"] for r in rounds])
peak = max(r["peak_gflops"] for r in rounds)  # the machine's; a lower round was disturbed
dtrain_s = med([r["dtrain_median_s"] for r in rounds])
torch_s = {v: med([r["torch_median_s"][v] for r in rounds]) for v in first}
summary = {
    "benchmark": "$WHAT",
    "dtrain_median_s": dtrain_s,
    "torch_median_s": torch_s,
    "torch_best": min(torch_s, key=torch_s.get),
    "ratio_dtrain_over_torch": ratio,
    "goal_ratio": $GOAL,
    "goal_met": ratio <= $GOAL,
    "step_flops": step_flops,
    "peak_gflops": peak,
    "floor_at_peak_s": step_flops / (peak * 1e9),
    "dtrain_share_of_peak": step_flops / dtrain_s / (peak * 1e9),
    "share_goal": 0.85,
    "dtrain_first_step_over_median": med([r["dtrain_first_step_over_median"] for r in rounds]),
    "method": "per round: median step time after %d warm-up steps; ratio from the same round, "
              "against PyTorch's faster setting in it; the fp32 FMA peak measured in each round "
              "(dtrain bench), the highest of them taken; other overall values are medians "
              "over rounds" % warmup,
    "machine": {"threads_available": os.cpu_count(), "threads_used": int("$THREADS"),
                "cpu": sh("lscpu | sed -n 's/^Model name: *//p'"),
                "kernel": platform.release(),
                "loadavg_before": "$LOAD_BEFORE", "loadavg_after": "$LOAD_AFTER"},
    "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                           "MKL_NUM_THREADS", "OPENBLAS_CORETYPE")},
    "versions": {"dtrain": sh("'$DTRAIN' --version"),
                 "onednn": sh("dpkg-query -W -f='\${Version}' libdnnl-dev 2>/dev/null"),
                 "torch_blas": "$(blas_target)",
                 "openblas": sh("dpkg-query -W -f='\${Version}' libopenblas0-openmp 2>/dev/null"),
                 "torch": torch_info["torch"], "torchvision": torch_info.get("torchvision"),
                 "torch_model": torch_info["model"], "torch_mkldnn": torch_info["mkldnn"],
                 "python": platform.python_version()},
    "rounds": rounds,
}
json.dump(summary, open(out, "w"), indent=2)
print("%s: dtrain %.3f s (%.1f%% of %.1f GFLOP/s, first step x%.2f)  torch %s  ratio %.2f "
      "(goal <= %s)  -> %s"
      % ("$MODEL", dtrain_s, 100 * summary["dtrain_share_of_peak"], peak,
         summary["dtrain_first_step_over_median"],
         " ".join("%s %.3f s" % (v, t) for v, t in torch_s.items()), ratio, "$GOAL", out))
EOF
