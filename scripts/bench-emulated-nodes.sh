#!/usr/bin/env bash
# Emulated two-node all-reduce benchmark: native (MPI_Allreduce), ring and
# hierarchical all-reduce of one ResNet-50-sized f32 gradient (BYTES, default
# 102,000,000 = 25.5M floats, 97.3 MiB) on 4 ranks, 2 per emulated node, with
# the nodes joined by a rate-limited link, at each of RATES. Follows the recipe
# in PLATFORM.md ("Network emulation"): two network namespaces joined by one
# veth pair, `tc qdisc ... tbf` on both ends, mpirun started inside namespace A
# under its own hostname (unshare --uts), a plm_rsh_agent script that starts
# nodeB's orted inside namespace B under its own hostname, --host
# nodeA:2,nodeB:2 --map-by slot (consecutive ranks per node), btl
# self,vader,tcp with vader's single-copy mechanism off, tcp/oob restricted to
# the veth subnet, the two names in /etc/hosts while the script runs.
#
# Each run is `dtrain bench --suite comm --only all_reduce --ranks-per-node 2` at
# the one size BYTES; rounds
# interleave the rates (and MCA variants) so that machine noise hits all alike.
# Per rate, algorithm and variant it reports the best (least) and the median time
# over every timed run of every round, the bandwidth bound of the algorithm on
# that link (see docs/benchmarks.md for the derivation), measured / bound and
# hierarchical's gain over ring. Speed is reported, never asserted.
#
# Variants (VARIANTS, space-separated): `default` is Open MPI's TCP settings;
# `eager` raises btl_tcp_eager_limit to 2 MiB so that the ring's 1 MiB pieces go
# without a rendezvous round trip (shows how much of the gap is latency).
#
# Needs root (namespaces, tc, /etc/hosts). Cleans up namespaces, veths, the
# /etc/hosts lines, leftover processes in the namespaces and their
# /dev/shm segments on exit, failure or interrupt.
#
# Usage: scripts/bench-emulated-nodes.sh [out.json]   (default bench-emulated-nodes.json)
# Environment: DTRAIN (default build/src/cli/dtrain), RATES ("1gbit 4gbit"),
# BYTES (102000000), MAX_TIME (seconds of timed runs per algorithm per round, after
# one warm-up run: runs go on until this much is spent, at most 50; 4), ROUNDS (2), VARIANTS ("default eager"), ALGORITHMS
# (native,ring,hierarchical), TBF_BURST (256kb), TBF_LATENCY (400ms),
# SUBNET_PREFIX (10.231.77), RUN_TIMEOUT (seconds per mpirun, 900), KEEP_RUNS=1
# keeps the per-run JSON.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-bench-emulated-nodes.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
RATES="${RATES:-1gbit 4gbit}"
BYTES="${BYTES:-102000000}"
MAX_TIME="${MAX_TIME:-4}"
ROUNDS="${ROUNDS:-2}"
VARIANTS="${VARIANTS:-default eager}"
ALGORITHMS="${ALGORITHMS:-native,ring,hierarchical}"
TBF_BURST="${TBF_BURST:-256kb}"
TBF_LATENCY="${TBF_LATENCY:-400ms}"
SUBNET_PREFIX="${SUBNET_PREFIX:-10.231.77}"
RUN_TIMEOUT="${RUN_TIMEOUT:-900}"
die() { echo "bench-emulated-nodes: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "needs root (ip netns, tc, /etc/hosts)"
[[ -x "$DTRAIN" ]] || die "no dtrain at $DTRAIN (build it, or set DTRAIN=path)"
DTRAIN="$(readlink -f "$DTRAIN")"
for tool in ip tc unshare mpirun python3; do
  command -v "$tool" >/dev/null || die "$tool not found"
done

TAG="dtb$$"                       # namespaces, veths, /etc/hosts marker
NS_A="${TAG}-A" NS_B="${TAG}-B"
VETH_A="${TAG}a" VETH_B="${TAG}b" # at most 15 characters
IP_A="$SUBNET_PREFIX.1" IP_B="$SUBNET_PREFIX.2" SUBNET="$SUBNET_PREFIX.0/24"
HOST_A=nodeA HOST_B=nodeB
MARK="# bench-emulated-nodes $TAG"
ip route | grep -q "^$SUBNET " && die "subnet $SUBNET is in use here; set SUBNET_PREFIX"
grep -qE "[[:space:]]($HOST_A|$HOST_B)([[:space:]]|\$)" /etc/hosts &&
  die "/etc/hosts already names $HOST_A or $HOST_B; remove those lines first"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-emulated-nodes.XXXXXX")"
CHILD='' SHM=''
cleanup() {
  local rc=$?
  set +e
  [[ -n "$CHILD" ]] && kill -TERM "$CHILD" 2>/dev/null  # the timeout wrapper, outside the namespaces
  for ns in "$NS_A" "$NS_B"; do     # only our namespaces' processes
    if ip netns list | grep -q "^$ns\b"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null; done
    fi
  done
  sleep 0.5
  for ns in "$NS_A" "$NS_B"; do
    if ip netns list | grep -q "^$ns\b"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
      ip netns del "$ns"           # takes its end of the veth pair (and so the pair) along
    fi
  done
  ip link del "$VETH_A" 2>/dev/null
  if grep -qF "$MARK" /etc/hosts; then   # rewrite in place: /etc/hosts may be a bind mount
    grep -vF "$MARK" /etc/hosts >"$WORK/hosts" && cat "$WORK/hosts" >/etc/hosts
  fi
  rm -rf "$SHM"
  rm -f /dev/shm/vader_segment."$HOST_A".* /dev/shm/vader_segment."$HOST_B".*
  rm -rf /tmp/ompi."$HOST_A".* /tmp/ompi."$HOST_B".*
  if [[ "${KEEP_RUNS:-0}" == 1 ]]; then echo "bench-emulated-nodes: runs kept in $WORK" >&2; else rm -rf "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Two namespaces, one veth pair, a token bucket on both ends.
ip netns add "$NS_A"
ip netns add "$NS_B"
ip link add "$VETH_A" type veth peer name "$VETH_B"
ip link set "$VETH_A" netns "$NS_A"
ip link set "$VETH_B" netns "$NS_B"
ip -n "$NS_A" addr add "$IP_A/24" dev "$VETH_A"
ip -n "$NS_B" addr add "$IP_B/24" dev "$VETH_B"
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set "$VETH_A" up
ip -n "$NS_B" link set "$VETH_B" up
shape() { # rate: replace the root tbf on both ends
  tc -n "$NS_A" qdisc replace dev "$VETH_A" root tbf rate "$1" burst "$TBF_BURST" latency "$TBF_LATENCY"
  tc -n "$NS_B" qdisc replace dev "$VETH_B" root tbf rate "$1" burst "$TBF_BURST" latency "$TBF_LATENCY"
}
printf '%s %s %s\n%s %s %s\n' "$IP_A" "$HOST_A" "$MARK" "$IP_B" "$HOST_B" "$MARK" >>/etc/hosts

# Open MPI's rsh agent: called as `agent HOST orted ARGS...`; runs the command
# in HOST's namespace under HOST's name (own UTS namespace, so vader's
# shared-memory segments, named after the host, do not collide).
cat >"$WORK/agent.sh" <<EOF
#!/usr/bin/env bash
host=\$1; shift
case "\$host" in
  $HOST_A) exec ip netns exec $NS_A unshare --uts bash -c "hostname $HOST_A; \$*" ;;
  $HOST_B) exec ip netns exec $NS_B unshare --uts bash -c "hostname $HOST_B; \$*" ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
EOF
chmod +x "$WORK/agent.sh"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# vader's segments (named after each node) in a directory of our own
SHM="$(mktemp -d /dev/shm/bench-emulated-nodes.XXXXXX)"
export OMPI_MCA_btl_vader_backing_directory="$SHM"
MPI_OPTS=(-np 4 --oversubscribe --host "$HOST_A:2,$HOST_B:2" --map-by slot
  --mca plm_rsh_agent "$WORK/agent.sh"
  --mca btl "self,vader,tcp" --mca btl_vader_single_copy_mechanism none
  --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET"
  -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
variant_opts() {
  case "$1" in
    default) ;;
    eager) echo "--mca btl_tcp_eager_limit 2097152 --mca btl_tcp_max_send_size 2097152" ;;
    *) die "VARIANTS: unknown variant $1 (default, eager)" ;;
  esac
}
for v in $VARIANTS; do variant_opts "$v" >/dev/null; done

# One mpirun inside namespace A under nodeA's name.
run_bench() { # rate variant round
  local json="$WORK/run-$1-$2-r$3.json" log="$WORK/run-$1-$2-r$3.log"
  # shellcheck disable=SC2046,SC2016 # variant options are words; $0/$@ are the inner shell's
  # In the background and waited for, so that a signal reaches the trap at once.
  timeout "$RUN_TIMEOUT" ip netns exec "$NS_A" unshare --uts \
    bash -c 'hostname "$0"; exec "$@"' "$HOST_A" \
    mpirun "${MPI_OPTS[@]}" $(variant_opts "$2") "$DTRAIN" bench --suite comm --only all_reduce \
    --ranks-per-node 2 --min-bytes "$BYTES" --max-bytes "$BYTES" --min-time "$MAX_TIME" \
    --max-time "$MAX_TIME" --algorithms "$ALGORITHMS" --out "$json" >"$log" 2>&1 &
  CHILD=$!
  wait "$CHILD" || die "run rate=$1 variant=$2 round=$3 failed: $(tail -5 "$log")"
  CHILD=
  echo "{\"rate\": \"$1\", \"variant\": \"$2\", \"round\": $3, \"loadavg\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"bench\": $(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$json")}" >>"$WORK/runs.jsonl"
}

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
: >"$WORK/runs.jsonl"
for ((r = 1; r <= ROUNDS; r++)); do
  for rate in $RATES; do
    shape "$rate"
    for v in $VARIANTS; do
      echo "bench-emulated-nodes: round $r/$ROUNDS rate $rate variant $v (load $(cut -d' ' -f1 /proc/loadavg))" >&2
      run_bench "$rate" "$v" "$r"
    done
  done
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"
QDISC="$(tc -n "$NS_A" -s qdisc show dev "$VETH_A" | tr '\n' ' ')"

python3 - "$WORK/runs.jsonl" "$OUT" <<EOF
import json, os, platform, re, statistics, subprocess, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
out = sys.argv[2]
def rate_bps(s):
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", s.lower())
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
n, per_node = 4, 2
nodes = n // per_node
# Bytes each direction of the one link carries per all-reduce of S bytes:
# ring (ranks 0-1 on A, 2-3 on B): each rank sends 2(n-1)/n S along the ring and
#   one ring edge crosses each way (1->2, 3->0): 2(n-1)/n S = 1.5 S.
# hierarchical: reduce-scatter and all-gather stay in the node; the S/per_node
#   shards are all-reduced across nodes by per_node rings of nodes ranks, each
#   rank sending 2(nodes-1)/nodes x S/per_node across: per_node x that = S.
link_factor = {"ring": 2 * (n - 1) / n,
               "hierarchical": 2 * (nodes - 1) / nodes,
               "native": None}
summary = []
for rate in dict.fromkeys(r["rate"] for r in runs):
    for variant in dict.fromkeys(r["variant"] for r in runs):
        sel = [r for r in runs if r["rate"] == rate and r["variant"] == variant]
        if not sel:
            continue
        S = sel[0]["bench"]["results"][0]["bytes"]
        row = {"rate": rate, "variant": variant, "bytes": S, "algorithms": {}}
        for algo in dict.fromkeys(x["algorithm"] for r in sel for x in r["bench"]["results"]):
            reps = [t for r in sel for x in r["bench"]["results"]
                    if x["algorithm"] == algo for t in x["seconds_runs"]]
            a = {"best_s": min(reps), "median_s": statistics.median(reps),
                 "runs_s": reps, "check_ok": all(x["check"]["ok"] for r in sel
                                                 for x in r["bench"]["results"] if x["algorithm"] == algo)}
            f = link_factor.get(algo)
            if f is not None:
                bound = f * S * 8 / rate_bps(rate)
                a.update({"link_bytes_each_way": f * S, "bound_s": bound,
                          "best_over_bound": a["best_s"] / bound,
                          "median_over_bound": a["median_s"] / bound})
            row["algorithms"][algo] = a
        A = row["algorithms"]
        if "ring" in A and "hierarchical" in A:
            row["hierarchical_gain_over_ring"] = {
                "best": A["ring"]["best_s"] / A["hierarchical"]["best_s"],
                "median": A["ring"]["median_s"] / A["hierarchical"]["median_s"],
                "bound": A["ring"]["bound_s"] / A["hierarchical"]["bound_s"]}
        summary.append(row)
def sh(cmd):
    return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
doc = {
    "benchmark": "f32 all-reduce of one ~100 MB gradient, 4 ranks on 2 emulated nodes "
                 "(network namespaces, veth, tbf), dtrain bench --suite comm --ranks-per-node 2",
    "method": "rounds interleave rates and variants; best_s = least, median_s = median over "
              "every timed run of every round (each run: max over ranks after a barrier); "
              "bound_s = bytes each way on the link / link rate",
    "setup": {"ranks": n, "ranks_per_node": per_node, "rounds": int("$ROUNDS"),
              "timed_seconds_per_round": float("$MAX_TIME"), "warmup": 1,
              "tbf": "rate RATE burst $TBF_BURST latency $TBF_LATENCY on both veth ends",
              "variants": {"default": "Open MPI TCP defaults (eager limit 64 KiB)",
                           "eager": "btl_tcp_eager_limit = btl_tcp_max_send_size = 2 MiB"},
              "mpirun": "$(printf '%s ' "${MPI_OPTS[@]}")",
              "qdisc_stats_A_at_end": "$QDISC"},
    "machine": {"cpu": sh("lscpu | sed -n 's/^Model name: *//p'"), "cores": os.cpu_count(),
                "kernel": platform.release(), "open_mpi": sh("ompi_info --version | head -1"),
                "loadavg_before": "$LOAD_BEFORE", "loadavg_after": "$LOAD_AFTER",
                "date": sh("date -u +%Y-%m-%dT%H:%M:%SZ")},
    "results": summary,
    "runs": runs,
}
json.dump(doc, open(out, "w"), indent=2)
for row in summary:
    parts = []
    for algo, a in row["algorithms"].items():
        b = " (bound %.3f, x%.2f)" % (a["bound_s"], a["best_over_bound"]) if "bound_s" in a else ""
        parts.append("%s %.3f s%s" % (algo, a["best_s"], b))
    g = row.get("hierarchical_gain_over_ring", {}).get("best")
    print("%s %-7s: %s%s" % (row["rate"], row["variant"], "; ".join(parts),
                             "; hier/ring gain %.2fx" % g if g else ""))
print("-> " + out)
EOF
