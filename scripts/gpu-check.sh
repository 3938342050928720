#!/usr/bin/env bash
# The one-call GPU check (issue 5), in two halves:
#   scripts/gpu-check.sh pack   here (Debian, no GPU): builds the CUDA parts for sm_90 into
#                               build-gpu/ (MPI off, no -march=native) and gathers the binaries
#                               and the Debian libraries they link (yaml-cpp, fmt, oneDNN, ...)
#                               into .gpu-carry/ (git-ignored, ~15 MB compressed)
#   scripts/gpu-check.sh run    on the lent GPU machine, from the repository root, with
#                               .gpu-carry carried (device tool: carry [".gpu-carry"]):
#                               the `gpu` tests (kernel table on CUDA, CUDA runtime, optimizers
#                               on CUDA, `dtrain train` with device: cuda against the CPU), then
#                               GEMM 8192^3 bf16 and 4096^3 f32 through dtrain (cuBLASLt) and
#                               through torch.matmul, and fp32 training steps of ResNet-50
#                               (b128, 224 px, SGD), BERT-base (b32 x 128, AdamW) and GPT-2 124M
#                               (b16 x 1024, AdamW) with dtrain (bench_model) and PyTorch eager
#                               (bench/peers/*.py, TF32 off) on the same GPU, and the same three
#                               in bf16 (dtrain's policy with fp32 masters against PyTorch AMP,
#                               torch.autocast bf16); prints one table
#                               and writes $OUT/gpu-check.json (and the logs) under $OUT.
# Why carry a build: the GPU image has nvcc, cmake and ninja but not Debian's yaml-cpp,
# fmt, CLI11, oneDNN or doctest, and nothing can be installed there. Its cuBLAS, cuDNN
# and NCCL come from the image (pip nvidia-* packages or /usr/local/cuda).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
CARRY="$ROOT/.gpu-carry"
BINS=(src/cli/dtrain tests/kernels/test_kernels tests/kernels/test_cuda_runtime bench/bench_gemm
      bench/bench_model tests/optim/test_optim_cuda tests/train/test_train_cuda
      tests/dist/test_dist_nccl tests/compress/test_compress_cuda)
FAMILIES=(gemm activation elementwise cast reduce layout layernorm softmax embedding dropout
          conv batchnorm pooling attention optimizer compress)
die() { echo "gpu-check: $*" >&2; exit 1; }

pack() {
  set -e
  local build="$ROOT/build-gpu"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DDTRAIN_MPI=OFF -DDTRAIN_NATIVE=OFF >/dev/null
  cmake --build "$build" -j "${JOBS:-$(nproc)}" --target dtrain test_kernels test_cuda_runtime \
    bench_gemm bench_model test_optim_cuda test_train_cuda test_dist_nccl test_compress_cuda
  rm -rf "$CARRY" && mkdir -p "$CARRY/stage/bin" "$CARRY/stage/lib"
  local b lib
  for b in "${BINS[@]}"; do cp "$build/$b" "$CARRY/stage/bin/"; done
  # Every shared library the binaries load from Debian, except the C library's own
  # (libc, libm, ld-linux, ...), which the GPU image has, and CUDA's, which it brings.
  for lib in $(ldd "$CARRY"/stage/bin/* | awk '/=> \//{print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libgcc_s.so*) ;;
      libcuda* | libcublas* | libcudnn* | libnccl* | libnvrtc* | libnvJitLink*) ;;
      *) cp -L "$lib" "$CARRY/stage/lib/" ;;
    esac
  done
  tar -C "$CARRY/stage" -cJf "$CARRY/bundle.tar.xz" bin lib
  rm -rf "$CARRY/stage"
  echo "gpu-check: packed $(du -h "$CARRY/bundle.tar.xz" | cut -f1) into .gpu-carry/bundle.tar.xz"
  echo "gpu-check: now call the device tool: command 'scripts/gpu-check.sh run', carry ['.gpu-carry']"
}

# The library folders of the image's CUDA stack: pip's nvidia-* packages and the toolkit.
cuda_lib_path() {
  python3 - <<'EOF' 2>/dev/null
import glob, os
dirs = []
try:
    import nvidia
    for root in nvidia.__path__:
        dirs += sorted({os.path.dirname(p) for p in glob.glob(os.path.join(root, "**", "lib*.so*"), recursive=True)})
except ImportError:
    pass
print(":".join(dirs))
EOF
}

run() {
  [[ -f "$CARRY/bundle.tar.xz" ]] || die "no .gpu-carry/bundle.tar.xz: run 'scripts/gpu-check.sh pack' here first and carry .gpu-carry"
  local out="${OUT:-/tmp/gpu-check-out}" work=/tmp/gpu-check
  mkdir -p "$out" "$work"
  tar -C "$work" -xJf "$CARRY/bundle.tar.xz"
  export LD_LIBRARY_PATH="$work/lib:$(cuda_lib_path):/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  local bin="$work/bin" start=$SECONDS
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader \
    | tee "$out/nvidia-smi.txt"
  timeout 60 "$bin/dtrain" info 2>&1 | tee "$out/dtrain-info.txt"

  # 1. The gpu tests, as ctest registers them (kernels.cuda.<mode>.<family>, kernels.cuda.runtime).
  : >"$out/tests.jsonl"
  local f mode rc line
  for f in "${FAMILIES[@]}"; do
    for mode in check grad; do
      [[ ($f == optimizer || $f == compress) && $mode == grad ]] && continue  # check-only (as in ctest)
      timeout 120 "$bin/test_kernels" --device cuda --mode "$mode" --family "$f" >"$out/kernels-$mode-$f.log" 2>&1
      rc=$?
      line=$(grep -E "passed, [0-9]+ failed|no CUDA implementation yet|skipped: no GPU" "$out/kernels-$mode-$f.log" | tail -n 1)
      printf '{"test": "kernels.cuda.%s.%s", "rc": %d, "summary": "%s"}\n' "$mode" "$f" "$rc" "${line//\"/\'}" >>"$out/tests.jsonl"
    done
  done
  local name exe limit
  export DTRAIN_EXE="$bin/dtrain"  # the train.cuda test spawns the carried binary
  local arg
  for name in kernels.cuda.runtime:test_cuda_runtime:120 optim.cuda:test_optim_cuda:120 \
              dist.nccl:test_dist_nccl+--gpu:120 dist.cuda_failures:test_dist_nccl:60 \
              compress.cuda:test_compress_cuda:120 train.cuda:test_train_cuda:300; do
    IFS=: read -r name exe limit <<<"$name"
    arg=""
    [[ $exe == *+* ]] && arg=${exe#*+} && exe=${exe%%+*}
    timeout "$limit" "$bin/$exe" $arg >"$out/$name.log" 2>&1
    rc=$?
    printf '{"test": "%s", "rc": %d, "summary": "%s"}\n' "$name" "$rc" \
      "$(grep -E 'test cases|skipped: no GPU' "$out/$name.log" | tail -n 1 | tr -s ' ' | tr -d '"')" \
      >>"$out/tests.jsonl"
  done

  # 2. GEMM: dtrain (cuBLASLt) against torch.matmul, same shapes, dtypes and GPU.
  timeout 120 "$bin/bench_gemm" --device cuda --dtype bf16 --m 8192 --n 8192 --k 8192 --reps 20 --warmup 5 \
    >"$out/gemm-bf16-dtrain.json" 2>"$out/gemm-bf16-dtrain.err"
  timeout 120 "$bin/bench_gemm" --device cuda --dtype f32 --m 4096 --n 4096 --k 4096 --reps 20 --warmup 5 \
    >"$out/gemm-f32-dtrain.json" 2>"$out/gemm-f32-dtrain.err"
  timeout 180 python3 - "$out" <<'EOF' >"$out/gemm-torch.json" 2>"$out/gemm-torch.err"
import json, sys, torch
torch.backends.cuda.matmul.allow_tf32 = False  # dtrain's f32 GEMM is plain FP32 by default
res = {}
for name, dt, n in (("bf16", torch.bfloat16, 8192), ("f32", torch.float32, 4096)):
    a = torch.rand(n, n, device="cuda", dtype=dt) * 2 - 1
    b = torch.rand(n, n, device="cuda", dtype=dt) * 2 - 1
    for _ in range(5):
        torch.matmul(a, b)
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); torch.matmul(a, b); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    ms = times[len(times) // 2]
    res[name] = {"n": n, "median_ms": ms, "tflops_median": 2 * n**3 / (ms * 1e-3) / 1e12}
res["torch"] = torch.__version__
print(json.dumps(res))
EOF

  # 3. Training steps, dtrain then PyTorch, each model alone on the GPU (fp32, 2 warm-up
  #    steps, median of 5). A failure or timeout leaves its JSON empty: the row says so.
  local peers="$ROOT/bench/peers"
  timeout 150 "$bin/bench_model" --device cuda --arch resnet50 --batch 128 --image 224 \
    --optimizer sgd --steps 5 --warmup 2 >"$out/step-resnet50-dtrain.json" 2>"$out/step-resnet50-dtrain.err"
  timeout 150 python3 "$peers/torch_resnet50_step.py" --device cuda --model by-hand --batch 128 \
    --steps 7 --warmup 2 >"$out/step-resnet50-torch.json" 2>"$out/step-resnet50-torch.err"
  timeout 120 "$bin/bench_model" --device cuda --arch bert-base --batch 32 --seq 128 \
    --optimizer adamw --steps 5 --warmup 2 >"$out/step-bert-dtrain.json" 2>"$out/step-bert-dtrain.err"
  timeout 120 python3 "$peers/torch_transformer_step.py" --device cuda --model bert-base \
    --batch 32 --seq 128 --steps 7 --warmup 2 >"$out/step-bert-torch.json" 2>"$out/step-bert-torch.err"
  timeout 150 "$bin/bench_model" --device cuda --arch gpt2 --batch 16 --seq 1024 \
    --optimizer adamw --steps 5 --warmup 2 >"$out/step-gpt2-dtrain.json" 2>"$out/step-gpt2-dtrain.err"
  timeout 150 python3 "$peers/torch_transformer_step.py" --device cuda --model gpt2 \
    --batch 16 --seq 1024 --steps 7 --warmup 2 >"$out/step-gpt2-torch.json" 2>"$out/step-gpt2-torch.err"

  # 3b. The same steps in bf16: dtrain's policy (bf16 weights and activations, fp32 master
  #     weights, one fused optimizer pass) against PyTorch AMP (torch.autocast bf16 around
  #     forward and loss, fp32 weights and optimizer).
  for spec in "resnet50 sgd --batch 128 --image 224" "bert-base adamw --batch 32 --seq 128" \
              "gpt2 adamw --batch 16 --seq 1024"; do
    read -r arch optim rest <<<"$spec"
    local key=${arch%-base}
    # shellcheck disable=SC2086  # $rest is a list of flags
    timeout 120 "$bin/bench_model" --device cuda --arch "$arch" --optimizer "$optim" --dtype bf16 \
      $rest --steps 5 --warmup 2 >"$out/step-$key-bf16-dtrain.json" 2>"$out/step-$key-bf16-dtrain.err"
  done
  timeout 120 python3 "$peers/torch_resnet50_step.py" --device cuda --model by-hand --batch 128 \
    --steps 7 --warmup 2 --amp bf16 >"$out/step-resnet50-bf16-torch.json" 2>"$out/step-resnet50-bf16-torch.err"
  timeout 100 python3 "$peers/torch_transformer_step.py" --device cuda --model bert-base \
    --batch 32 --seq 128 --steps 7 --warmup 2 --amp bf16 >"$out/step-bert-bf16-torch.json" 2>"$out/step-bert-bf16-torch.err"
  timeout 120 python3 "$peers/torch_transformer_step.py" --device cuda --model gpt2 \
    --batch 16 --seq 1024 --steps 7 --warmup 2 --amp bf16 >"$out/step-gpt2-bf16-torch.json" 2>"$out/step-gpt2-bf16-torch.err"

  # 4. One table and one JSON.
  python3 - "$out" "$((SECONDS - start))" <<'EOF'
import json, os, sys
out, seconds = sys.argv[1], int(sys.argv[2])
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError):
        return None
tests = [json.loads(l) for l in open(os.path.join(out, "tests.jsonl"))]
d_bf16, d_f32, t = load("gemm-bf16-dtrain.json"), load("gemm-f32-dtrain.json"), load("gemm-torch.json") or {}
rows = []
def gemm_row(label, d, tt):
    dv = d["tflops_median"] if d else None
    tv = tt["tflops_median"] if tt else None
    ok = "" if not d else ("" if d.get("spot_check_ok") else " (SPOT CHECK FAILED)")
    ratio = "%.2f" % (tv / dv) if dv and tv else "-"
    rows.append((label, "%.1f TFLOP/s%s" % (dv, ok) if dv else "failed", "%.1f TFLOP/s" % tv if tv else "failed",
                 ratio + " (torch time / dtrain time)" if ratio != "-" else "-"))
gemm_row("GEMM 8192^3 bf16 -> f32", d_bf16, t.get("bf16"))
gemm_row("GEMM 4096^3 f32 (no TF32)", d_f32, t.get("f32"))
steps = {}
for key, label, unit, per in (("resnet50", "ResNet-50 b128 224px", "samples/s", 128),
                              ("bert", "BERT-base b32 T128", "tokens/s", 32 * 128),
                              ("gpt2", "GPT-2 124M b16 T1024", "tokens/s", 16 * 1024),
                              ("resnet50-bf16", "ResNet-50 bf16 vs AMP", "samples/s", 128),
                              ("bert-bf16", "BERT-base bf16 vs AMP", "tokens/s", 32 * 128),
                              ("gpt2-bf16", "GPT-2 124M bf16 vs AMP", "tokens/s", 16 * 1024)):
    d, tt = load("step-%s-dtrain.json" % key), load("step-%s-torch.json" % key)
    ds = d["median_step_s"] if d else None
    ts = tt["median_step_s"] if tt else None
    steps[key] = {"dtrain": d, "torch": tt}
    cell = lambda s: "%.1f ms, %.0f %s" % (1e3 * s, per / s, unit) if s else "failed (see logs)"
    rows.append((label + " step", cell(ds), "%.1f ms" % (1e3 * ts) if ts else "failed",
                 "%.2f (dtrain time / torch time)" % (ds / ts) if ds and ts else "-"))
print("\n%-34s %-44s %-16s %s" % ("benchmark", "dtrain", "PyTorch", "ratio"))
for r in rows:
    print("%-34s %-44s %-16s %s" % r)
passed = [x for x in tests if x["rc"] == 0]
skipped = [x for x in tests if x["rc"] == 77]  # ctest's SKIP_RETURN_CODE: no usable GPU
print("\ngpu tests: %d passed, %d skipped (no GPU), %d failed, of %d"
      % (len(passed), len(skipped), len(tests) - len(passed) - len(skipped), len(tests)))
for x in tests:
    if x["rc"] not in (0, 77):
        print("  FAIL %s (rc %d): %s" % (x["test"], x["rc"], x["summary"]))
json.dump({"tests": tests, "gemm": {"dtrain_bf16": d_bf16, "dtrain_f32": d_f32, "torch": t},
           "train_steps": steps, "seconds": seconds}, open(os.path.join(out, "gpu-check.json"), "w"), indent=2)
print("gpu-check: %d s; JSON in %s/gpu-check.json" % (seconds, out))
EOF
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) die "usage: scripts/gpu-check.sh pack|run (pack here, run on the GPU machine)" ;;
esac
