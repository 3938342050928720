#!/usr/bin/env bash
# All-reduce benchmark on one machine: time and bus bandwidth of native
# (MPI_Allreduce), ring and hierarchical all-reduce of f32 buffers from MIN_BYTES
# (4 KiB) to MAX_BYTES (256 MiB) in steps of x4, on 2 local ranks (one node of
# two ranks: hierarchical reduces to ring-in-the-node) and on 4 local ranks with
# --ranks-per-node 2 (2 emulated nodes of 2 ranks). Runs `dtrain bench --suite
# comm --only all_reduce` under mpirun (shared memory, --oversubscribe, one OpenMP
# thread per rank) and combines its JSON into one file: per world size, per size
# and algorithm, the median and best time, algbw and busbw (busbw = algbw x
# 2(n-1)/n, as nccl-tests). ROUNDS > 1 repeats both world sizes alternately and
# keeps, per size and algorithm, the round with the least median. Speed is reported, never
# asserted. Timings of 4 ranks on fewer than 4 cores are oversubscribed.
#
# Usage: scripts/bench-allreduce.sh [out.json]   (default bench-allreduce.json)
# Environment: DTRAIN (default build/src/cli/dtrain), MIN_BYTES (4096),
# MAX_BYTES (268435456), MIN_TIME / MAX_TIME (seconds per figure: dtrain bench
# times at least 5 runs and MIN_TIME, until the spread is under 5%, or MAX_TIME or
# 50 runs; 0.3 and 3), ROUNDS (1),
# WORLDS ("2 4"), KEEP_RUNS=1 keeps the per-run JSON.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-bench-allreduce.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
MIN_BYTES="${MIN_BYTES:-4096}"
MAX_BYTES="${MAX_BYTES:-268435456}"
MIN_TIME="${MIN_TIME:-0.3}"
MAX_TIME="${MAX_TIME:-3}"
ROUNDS="${ROUNDS:-1}"
WORLDS="${WORLDS:-2 4}"
die() { echo "bench-allreduce: $*" >&2; exit 1; }

[[ -x "$DTRAIN" ]] || die "no dtrain at $DTRAIN (build it, or set DTRAIN=path)"
command -v mpirun >/dev/null || die "mpirun not found (Open MPI)"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-allreduce.XXXXXX")"
CHILD='' SHM=''
cleanup() {
  local rc=$?
  set +e
  if [[ -n "$CHILD" ]]; then  # mpirun ends its ranks on SIGTERM
    kill -TERM "$CHILD" 2>/dev/null
    sleep 1
    pkill -KILL -P "$CHILD" 2>/dev/null
    kill -KILL "$CHILD" 2>/dev/null
  fi
  rm -rf "$SHM"  # this script's shared-memory segments, whatever happened
  if [[ "${KEEP_RUNS:-0}" == 1 ]]; then echo "bench-allreduce: runs kept in $WORK" >&2; else rm -rf "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# Open MPI's vader segments in a directory of our own: nothing left in /dev/shm
# after a failure, and other jobs' segments are never touched.
SHM="$(mktemp -d /dev/shm/bench-allreduce.XXXXXX)"
export OMPI_MCA_btl_vader_backing_directory="$SHM"

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
: >"$WORK/runs.jsonl"
for ((r = 1; r <= ROUNDS; r++)); do
  for n in $WORLDS; do
    extra=()
    ((n >= 4 && n % 2 == 0)) && extra=(--ranks-per-node 2)
    echo "bench-allreduce: round $r/$ROUNDS, $n ranks ${extra[*]} (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    json="$WORK/n$n-r$r.json"
    mpirun -np "$n" --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OMP_WAIT_POLICY \
      "$DTRAIN" bench --suite comm --only all_reduce --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" \
      --min-time "$MIN_TIME" --max-time "$MAX_TIME" "${extra[@]}" --out "$json" >"$WORK/n$n-r$r.log" 2>&1 &
    CHILD=$!
    wait "$CHILD" || die "$n ranks, round $r failed: $(tail -5 "$WORK/n$n-r$r.log")"
    CHILD=
    echo "{\"round\": $r, \"loadavg\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"bench\": $(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$json")}" >>"$WORK/runs.jsonl"
  done
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$WORK/runs.jsonl" "$OUT" <<EOF
import json, os, platform, subprocess, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
worlds = {}
for run in runs:
    rows = [r for r in run["bench"]["results"] if r["op"] == "all_reduce"]
    first = rows[0]
    w = worlds.setdefault(str(first["ranks"]), {k: first[k] for k in ("ranks", "nodes",
                                                                      "ranks_per_node", "dtype")}
                          | {"results": {}, "loadavg_after_rounds": []})
    w["loadavg_after_rounds"].append(run["loadavg"])
    for r in rows:
        row = {"bytes": r["bytes"], "algorithm": r["algorithm"],
               "time_us": r["seconds_median"] * 1e6,
               "best_time_us": min(r["seconds_runs"]) * 1e6,
               "rep_times_us": [t * 1e6 for t in r["seconds_runs"]],
               "algbw_gbs": r["algbw_gbytes_per_s"], "busbw_gbs": r["busbw_gbytes_per_s"],
               "check_ok": r["check"]["ok"]}
        if "speed_vs_native" in r:
            row["speed_vs_native"] = r["speed_vs_native"]
        key = (row["bytes"], row["algorithm"])
        old = w["results"].get(key)
        if old is None or row["time_us"] < old["time_us"]:
            w["results"][key] = row | {"round": run["round"]}
for w in worlds.values():
    order = {"native": 0, "ring": 1, "hierarchical": 2}
    w["results"] = [w["results"][k] for k in sorted(w["results"],
                                                    key=lambda k: (k[0], order.get(k[1], 3)))]
def sh(cmd):
    return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
doc = {
    "benchmark": "f32 all-reduce on one machine over shared memory (Open MPI vader), "
                 "native / ring / hierarchical, dtrain bench --suite comm",
    "method": "per size and algorithm: each run after a barrier, its time the slowest "
              "rank's; time_us = median of the runs (best_time_us = least run); with several "
              "rounds the round with the least time_us is kept; busbw = algbw x 2(n-1)/n",
    "setup": {"rounds": int("$ROUNDS"), "min_time_s": float("$MIN_TIME"),
              "max_time_s": float("$MAX_TIME"),
              "mpirun": "-np N --oversubscribe --bind-to none, OMP_NUM_THREADS=1, "
                        "OMP_WAIT_POLICY=passive; 4 ranks: --ranks-per-node 2"},
    "machine": {"cpu": sh("lscpu | sed -n 's/^Model name: *//p'"), "cores": os.cpu_count(),
                "kernel": platform.release(), "open_mpi": sh("ompi_info --version | head -1"),
                "loadavg_before": "$LOAD_BEFORE", "loadavg_after": "$LOAD_AFTER",
                "date": sh("date -u +%Y-%m-%dT%H:%M:%SZ")},
    "worlds": worlds,
}
json.dump(doc, open(sys.argv[2], "w"), indent=2)
for n, w in worlds.items():
    print("%s ranks (%s node(s)):" % (n, w["nodes"]))
    print("  %10s  %-12s %12s %10s" % ("bytes", "algorithm", "time_us", "busbw_GB/s"))
    for row in w["results"]:
        print("  %10d  %-12s %12.1f %10.2f" % (row["bytes"], row["algorithm"], row["time_us"],
                                              row["busbw_gbs"]))
print("-> " + sys.argv[2])
EOF
