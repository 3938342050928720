#!/usr/bin/env bash
# Fuzzes the job-file loader: builds tests/fuzz/fuzz_config with clang (libFuzzer +
# ASan + UBSan) in its own build directory, then runs it for SECONDS (default 60)
# seeded from configs/ and tests/config/bad/. Exits non-zero when it finds a crash;
# the input that crashed is left in $BUILD/fuzz-artifacts/.
# Usage: scripts/fuzz-config.sh [SECONDS]   (env: BUILD=dir, JOBS=n)
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD:-$root/build-fuzz}"

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_FUZZ=ON -DDTRAIN_TESTS=OFF \
  -DDTRAIN_CUDA=OFF -DDTRAIN_MPI=OFF >/dev/null
ninja -C "$build" -j"${JOBS:-2}" fuzz_config

corpus="$build/fuzz-corpus"     # new interesting inputs go here; the seed folders stay untouched
artifacts="$build/fuzz-artifacts"
mkdir -p "$corpus" "$artifacts"
exec "$build/tests/fuzz/fuzz_config" \
  -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -dict="$root/tests/fuzz/config.dict" -artifact_prefix="$artifacts/" -print_final_stats=1 \
  "$corpus" "$root/configs" "$root/tests/config/bad"
