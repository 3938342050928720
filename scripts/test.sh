#!/usr/bin/env bash
# The test command (README, CI): installs what is missing, checks the include
# direction and formatting, configures (Release; CUDA on when nvcc is found),
# builds everything including the CUDA parts, runs ctest, then fuzzes the
# config parser for FUZZ_SECONDS (default 60).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/check-includes.sh
scripts/check-format.sh

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_CUDA=AUTO -DDTRAIN_MPI=AUTO
cmake --build "$BUILD_DIR" -j "$JOBS"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" | tee "$BUILD_DIR/ctest.log"

scripts/fuzz-config.sh "${FUZZ_SECONDS:-60}"
echo "fuzz-config: no crash in ${FUZZ_SECONDS:-60} s"
# The ctest verdict again, last, so it closes the log.
grep -E "tests passed|tests failed" "$BUILD_DIR/ctest.log" | tail -n 1
