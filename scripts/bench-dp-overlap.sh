#!/usr/bin/env bash
# Data-parallel exposed-communication benchmark (CPU): median training-step time
# with 2 ranks divided by the median step time with 1 rank, the same per-rank
# batch and one OpenMP thread per rank, with comm.overlap true and false. A
# ratio of 1.0 means communication costs nothing; the issue's goal is <= 1.10
# with overlap on. Models (MODELS, space-separated):
#   resnet18  configs/resnet50-synthetic.yaml, arch resnet18, synthetic 64 x 64
#             images, per-rank batch 32, SGD momentum 0.9 (11.7M parameters,
#             46.8 MB of gradient in 2 buckets)
#   bert-mini configs/bert-base-synthetic.yaml, arch bert-mini, synthetic tokens,
#             per-rank batch 8 x 128 tokens, AdamW (11.2M parameters, 44.8 MB of
#             gradient: one 25 MB bucket closes only at the end of backward)
# Each round runs, per model, 1 rank, 2 ranks overlap on and 2 ranks overlap off
# (the order rotates from round to round) so that load from other jobs on a
# shared machine hits all alike. Per run: the median step_time_s of
# metrics.jsonl after WARMUP steps, and for 2 ranks the medians of comm_time_s
# and exposed_comm_s. Per round: the ratios, and the ratio without the exposed
# communication ((2-rank step - exposed_comm_s) / 1-rank step: the slowdown of
# compute alone, from sharing the machine); overall: medians over rounds, and
# the least ratio of any round (best_round_ratio) and the median over rounds of
# fastest 2-rank step / fastest 1-rank step (ratio_fastest_steps): on a shared
# 2-core machine one process of another job takes one rank's core and doubles
# the 2-rank step, while the 1-rank run, with a core to spare, hardly notices.
# Speed is reported, never asserted.
#
# Note: on a 2-core machine each of the 2 ranks has a core to itself while the
# 1-rank run leaves a core idle; the ratio includes that (memory bandwidth,
# turbo, the communication thread's share of the rank's core).
#
# Usage: scripts/bench-dp-overlap.sh [out.json]   (default bench-dp-overlap.json)
# Environment: DTRAIN (binary; default build/src/cli/dtrain), MODELS ("resnet18
# bert-mini"), ROUNDS (3), STEPS (steps per run, 14), WARMUP (steps dropped, 4),
# ALLREDUCE (comm.allreduce, ring), BUCKET_MB (comm.bucket_mb; default the
# job's, 25), EXTRA (more --set options for every run, e.g. "--set
# compress.method=powersgd --set compress.warmup_steps=0": the 2-rank runs then
# exchange compressed buckets), KEEP_RUNS=1 keeps the run directories.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-bench-dp-overlap.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
MODELS="${MODELS:-resnet18 bert-mini}"
ROUNDS="${ROUNDS:-3}"
STEPS="${STEPS:-14}"
WARMUP="${WARMUP:-4}"
ALLREDUCE="${ALLREDUCE:-ring}"
BUCKET_MB="${BUCKET_MB:-}"
EXTRA="${EXTRA:-}"
die() { echo "bench-dp-overlap: $*" >&2; exit 1; }

[[ -x "$DTRAIN" ]] || die "no dtrain binary at $DTRAIN (build it, or set DTRAIN=path)"
DTRAIN="$(readlink -f "$DTRAIN")"
((STEPS >= WARMUP + 5)) || die "STEPS=$STEPS must leave at least 5 timed steps after $WARMUP warm-up"
((ROUNDS >= 2)) || die "ROUNDS=$ROUNDS: interleaving needs at least 2 rounds"

model_args() { # model ranks: the job file and its --set options
  local m=$1 n=$2
  case "$m" in
    resnet18)
      echo "$ROOT/configs/resnet50-synthetic.yaml --set model.arch=resnet18 --set model.image_size=64" \
        "--set data.micro_batch=32 --set data.global_batch=$((32 * n))" ;;
    bert-mini)
      echo "$ROOT/configs/bert-base-synthetic.yaml --set model.arch=bert-mini" \
        "--set data.micro_batch=8 --set data.global_batch=$((8 * n))" ;;
    *) die "MODELS: unknown model $m (resnet18, bert-mini)" ;;
  esac
}
for m in $MODELS; do model_args "$m" 1 >/dev/null; done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-dp-overlap.XXXXXX")"
CHILD='' SHM=''
cleanup() {
  local rc=$?
  set +e
  if [[ -n "$CHILD" ]]; then  # dtrain --nproc: its mpirun ends the ranks when it dies
    kill -TERM "$CHILD" 2>/dev/null  # the ranks stop at a step; a second TERM stops at once
    sleep 1
    kill -TERM "$CHILD" 2>/dev/null
    sleep 1
    kill -KILL "$CHILD" 2>/dev/null  # and its mpirun gets SIGTERM (PR_SET_PDEATHSIG)
    sleep 1
  fi
  rm -rf "$SHM"  # this script's Open MPI shared-memory segments, whatever happened
  if [[ "${KEEP_RUNS:-0}" == 1 ]]; then echo "bench-dp-overlap: runs kept in $WORK" >&2; else rm -rf "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# Open MPI's shared-memory (vader) segments go to a directory of our own, so
# that a run that dies leaves nothing in /dev/shm and other jobs' segments are
# never touched.
SHM="$(mktemp -d /dev/shm/bench-dp-overlap.XXXXXX)"
export OMPI_MCA_btl_vader_backing_directory="$SHM"

# One run, in this shell (not a $(...) subshell, so that a signal reaches the
# trap at once and the trap knows CHILD); writes a JSON object with the per-step
# lists of metrics.jsonl to $dir.json.
run_one() { # model ranks overlap round
  local m=$1 n=$2 ov=$3 r=$4 dir="$WORK/$1-n$2-ov$3-r$4"
  local -a args nproc=()
  read -r -a args <<<"$(model_args "$m" "$n")"
  ((n > 1)) && nproc=(--nproc "$n")
  [[ -n "$BUCKET_MB" ]] && args+=(--set "comm.bucket_mb=$BUCKET_MB")
  if ((n > 1)) && [[ -n "$EXTRA" ]]; then  # compression needs 2 ranks: the 1-rank run goes without
    local -a extra
    read -r -a extra <<<"$EXTRA"
    args+=("${extra[@]}")
  fi
  "$DTRAIN" train "${args[@]}" "${nproc[@]}" --set "train.steps=$STEPS" --set train.log_every=1 \
    --set "comm.overlap=$ov" --set "comm.allreduce=$ALLREDUCE" --set "run.output_dir=$dir" \
    >"$dir.log" 2>&1 &
  CHILD=$!
  wait "$CHILD" || die "$m with $n rank(s), overlap $ov, round $r failed; see $dir.log (KEEP_RUNS=1 keeps it)"
  CHILD=
  python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "step_time_s" in r]
print(json.dumps({k: [r.get(k) for r in steps] for k in
                  ("step_time_s", "comm_time_s", "exposed_comm_s", "data_wait_s")}
                 | {"allreduce": steps[-1].get("allreduce"), "comm_bytes": steps[-1].get("comm_bytes")}))' \
    "$dir/metrics.jsonl" >"$dir.json"
}

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
: >"$WORK/runs.jsonl"
configs=("1 false" "2 true" "2 false")
for ((r = 1; r <= ROUNDS; r++)); do
  for m in $MODELS; do
    for ((i = 0; i < 3; i++)); do  # rotate the order each round
      read -r n ov <<<"${configs[$(((i + r - 1) % 3))]}"
      [[ $n == 1 ]] && ov=true     # no communication with 1 rank
      echo "bench-dp-overlap: round $r/$ROUNDS $m ranks $n overlap $ov (load $(cut -d' ' -f1 /proc/loadavg))" >&2
      run_one "$m" "$n" "$ov" "$r"
      res="$(cat "$WORK/$m-n$n-ov$ov-r$r.json")"
      echo "{\"round\": $r, \"model\": \"$m\", \"ranks\": $n, \"overlap\": $ov, \"loadavg\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"run\": $res}" >>"$WORK/runs.jsonl"
    done
  done
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$WORK/runs.jsonl" "$OUT" "$WARMUP" <<EOF
import json, os, platform, statistics, subprocess, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
out, warmup = sys.argv[2], int(sys.argv[3])
med = statistics.median
def m(xs):
    xs = [x for x in xs[warmup:] if x is not None]
    return med(xs) if xs else None
def least(xs):
    return min(xs[warmup:])
results = {}
for model in dict.fromkeys(r["model"] for r in runs):
    rounds = []
    for rnd in sorted({r["round"] for r in runs if r["model"] == model}):
        sel = {(r["ranks"], r["overlap"]): r["run"] for r in runs
               if r["model"] == model and r["round"] == rnd}
        one = m(sel[(1, True)]["step_time_s"])
        row = {"round": rnd, "one_rank_median_s": one}
        for ov, key in ((True, "overlap_on"), (False, "overlap_off")):
            run = sel[(2, ov)]
            two = m(run["step_time_s"])
            exposed = m(run["exposed_comm_s"])
            row[key] = {"two_rank_median_s": two, "ratio": two / one,
                        # fastest timed step over fastest timed step: the steps
                        # that no other job slowed down
                        "ratio_fastest_steps": least(run["step_time_s"])
                                               / least(sel[(1, True)]["step_time_s"]),
                        "comm_time_s": m(run["comm_time_s"]),
                        "exposed_comm_s": exposed,
                        # what is left of the 2-rank step without its exposed
                        # communication, over the 1-rank step: the compute slowdown
                        "ratio_without_exposed_comm": (two - exposed) / one,
                        "allreduce": run["allreduce"], "comm_bytes": run["comm_bytes"],
                        "step_times_s": run["step_time_s"]}
        row["one_rank_step_times_s"] = sel[(1, True)]["step_time_s"]
        rounds.append(row)
    res = {"one_rank_median_s": med([r["one_rank_median_s"] for r in rounds])}
    for key in ("overlap_on", "overlap_off"):
        res[key] = {"ratio": med([r[key]["ratio"] for r in rounds]),
                    # the least-disturbed round: on a shared 2-core machine another
                    # job's process takes one rank's core and doubles the step
                    "best_round_ratio": min(r[key]["ratio"] for r in rounds),
                    "ratio_fastest_steps": med([r[key]["ratio_fastest_steps"] for r in rounds]),
                    "two_rank_median_s": med([r[key]["two_rank_median_s"] for r in rounds]),
                    "comm_time_s": med([r[key]["comm_time_s"] for r in rounds]),
                    "exposed_comm_s": med([r[key]["exposed_comm_s"] for r in rounds]),
                    "ratio_without_exposed_comm":
                        med([r[key]["ratio_without_exposed_comm"] for r in rounds])}
    res["goal_ratio_overlap_on"] = 1.10
    res["goal_met"] = res["overlap_on"]["ratio"] <= 1.10
    res["rounds"] = rounds
    results[model] = res
def sh(cmd):
    return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
doc = {
    "benchmark": "data-parallel step time, 2 ranks / 1 rank, same per-rank batch, 1 thread per rank",
    "method": "per run: median step_time_s after %d warm-up steps (comm_time_s and exposed_comm_s "
              "likewise, 2-rank runs); ratio = 2-rank median / 1-rank median of the same round; "
              "overall = medians over rounds; runs interleaved, order rotated per round" % warmup,
    "setup": {"steps": int("$STEPS"), "warmup": warmup, "rounds": int("$ROUNDS"),
              "comm.allreduce": "$ALLREDUCE", "comm.bucket_mb": "${BUCKET_MB:-job default (25)}",
              "extra_2_rank_options": "$EXTRA",
              "omp_num_threads": 1, "omp_wait_policy": "passive",
              "launch": "1 rank: dtrain train; 2 ranks: dtrain train --nproc 2 (mpirun)",
              "note": "2 cores: each of the 2 ranks has a core; the 1-rank run leaves one idle"},
    "machine": {"cpu": sh("lscpu | sed -n 's/^Model name: *//p'"), "cores": os.cpu_count(),
                "kernel": platform.release(), "dtrain": sh("'$DTRAIN' --version"),
                "loadavg_before": "$LOAD_BEFORE", "loadavg_after": "$LOAD_AFTER",
                "date": sh("date -u +%Y-%m-%dT%H:%M:%SZ")},
    "results": results,
    "runs": runs,
}
json.dump(doc, open(out, "w"), indent=2)
for model, res in results.items():
    for key in ("overlap_on", "overlap_off"):
        o = res[key]
        print("%-9s %-11s 1 rank %.3f s, 2 ranks %.3f s: ratio %.2f (best round %.2f, fastest "
              "steps %.2f), comm %.3f s, exposed %.3f s" % (
                  model, key, res["one_rank_median_s"], o["two_rank_median_s"], o["ratio"],
                  o["best_round_ratio"], o["ratio_fastest_steps"], o["comm_time_s"] or 0,
                  o["exposed_comm_s"] or 0))
print("-> " + out)
EOF
