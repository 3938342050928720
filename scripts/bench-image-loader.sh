#!/usr/bin/env bash
# Image-folder loader benchmark: samples per second of `dtrain data bench` (decode,
# random resized crop, flip, normalise; data.dataset: image-folder) against
# torchvision's PIL path on Pillow and NumPy (bench/peers/pil_image_loader.py), on one
# generated folder of JPEG photos (ImageNet-like sizes, quality 90), at 224 x 224,
# batches of 32, for each loader worker count in WORKERS, interleaved round by round
# (dtrain, peer, dtrain, peer, ...) so that load from other jobs hits both alike.
# Writes JSON to $1 (default bench-image-loader.json): per-round figures, and per worker
# count the median samples/s of each and their ratio dtrain / peer (over 1: dtrain is
# faster). Speed is reported, never asserted.
#
# Pillow and NumPy are a benchmark peer, not dtrain dependencies: when /usr/bin/python3
# cannot import them, this script installs Debian's python3-pil and python3-numpy with
# apt-get (root needed). scripts/install-deps.sh does not install them.
#
# Environment: DTRAIN (binary; default build/src/cli/dtrain), ROUNDS (3), WORKERS ("0 2"),
# BATCHES (batches per run, 20), SPLIT (train or test), IMAGES (training images per class
# of 4 classes, 100), KEEP_RUNS=1 keeps the folder.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-bench-image-loader.json}"
DTRAIN="${DTRAIN:-$ROOT/build/src/cli/dtrain}"
ROUNDS="${ROUNDS:-3}"
WORKERS="${WORKERS:-0 2}"
BATCHES="${BATCHES:-20}"
SPLIT="${SPLIT:-train}"
IMAGES="${IMAGES:-100}"
PY=/usr/bin/python3
PEER="$ROOT/bench/peers/pil_image_loader.py"
die() { echo "bench-image-loader: $*" >&2; exit 1; }

[[ -x "$DTRAIN" ]] || die "no dtrain binary at $DTRAIN (build it, or set DTRAIN=path)"
((ROUNDS >= 2)) || die "ROUNDS=$ROUNDS: interleaving needs at least 2 rounds"
if ! "$PY" -c 'import PIL, numpy' 2>/dev/null; then
  echo "bench-image-loader: installing python3-pil python3-numpy (apt-get)" >&2
  [[ $(id -u) == 0 ]] || die "Pillow or NumPy is missing and installing needs root: apt-get install python3-pil python3-numpy"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    python3-pil python3-numpy >/dev/null
fi
# One thread per process on both sides: the loaders' parallelism is their workers.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-image-loader.XXXXXX")"
cleanup() { [[ "${KEEP_RUNS:-0}" == 1 ]] || rm -rf "$WORK"; }
trap cleanup EXIT

"$PY" "$PEER" make "$WORK/images" --classes 4 --per-class "$IMAGES" --val-per-class 25
cat >"$WORK/job.yaml" <<EOF
run: {output_dir: $WORK/run, seed: 0}
model: {arch: resnet50, image_size: 224, num_classes: 4}
data: {dataset: image-folder, path: $WORK/images, global_batch: 32, micro_batch: 32}
train: {steps: 1}
EOF

ROWS="$WORK/rows.jsonl"
: >"$ROWS"
for ((r = 0; r < ROUNDS; r++)); do
  for w in $WORKERS; do
    "$DTRAIN" data bench "$WORK/job.yaml" --workers "$w" --batches "$BATCHES" --split "$SPLIT" \
      --json >"$WORK/dtrain.json" 2>"$WORK/dtrain.log" ||
      die "dtrain data bench failed: $(tail -3 "$WORK/dtrain.log")"
    "$PY" -c 'import json, sys
j = json.load(open(sys.argv[1]))
row = j["results"][0]
print(json.dumps({"round": int(sys.argv[2]), "who": "dtrain", "workers": row["workers"],
                  "samples_per_s": row["samples_per_s"], "seconds": row["seconds"]}))' \
      "$WORK/dtrain.json" "$r" >>"$ROWS"
    "$PY" "$PEER" time "$WORK/images" --workers "$w" --batches "$BATCHES" --split "$SPLIT" \
      --seed "$r" 2>"$WORK/peer.log" | "$PY" -c 'import json, sys
j = json.loads(sys.stdin.read())
j.update({"round": int(sys.argv[1]), "who": "peer"})
print(json.dumps(j))' "$r" >>"$ROWS" || die "the peer failed: $(tail -3 "$WORK/peer.log")"
  done
done

"$PY" - "$ROWS" "$OUT" "$SPLIT" "$BATCHES" "$("$DTRAIN" --version)" <<'EOF'
import json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
peer = next(r["peer"] for r in rows if r["who"] == "peer")
out = {"what": f"image-folder loader, {sys.argv[3]} split, batches of 32 at 224 x 224, "
               f"{sys.argv[4]} batches a run, timed from opening the loader",
       "dtrain": sys.argv[5], "peer": peer, "cpu": open("/proc/cpuinfo").read()
           .split("model name")[1].split("\n")[0].split(":", 1)[1].strip(),
       "cores": os.cpu_count(),
       "rounds": rows, "by_workers": []}
for w in sorted({r["workers"] for r in rows}):
    med = {who: statistics.median(r["samples_per_s"] for r in rows
                                  if r["who"] == who and r["workers"] == w)
           for who in ("dtrain", "peer")}
    out["by_workers"].append({"workers": w, "dtrain_samples_per_s": med["dtrain"],
                              "peer_samples_per_s": med["peer"],
                              "ratio_dtrain_over_peer": med["dtrain"] / med["peer"]})
tmp = sys.argv[2] + ".tmp"
with open(tmp, "w") as f:
    json.dump(out, f, indent=2)
    f.write("\n")
os.replace(tmp, sys.argv[2])
for b in out["by_workers"]:
    print(f"workers {b['workers']}: dtrain {b['dtrain_samples_per_s']:.1f} samples/s, "
          f"peer {b['peer_samples_per_s']:.1f}, ratio {b['ratio_dtrain_over_peer']:.2f}")
EOF
