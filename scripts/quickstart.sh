#!/usr/bin/env bash
# README's first command: installs what is missing (Debian packages only),
# builds dtrain (Release) and trains configs/quickstart.yaml — a small ResNet-18
# on Fashion-MNIST — printing progress, test accuracy and where the run went.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$(nproc)" --target dtrain
"$BUILD_DIR/src/cli/dtrain" info
exec "$BUILD_DIR/src/cli/dtrain" train configs/quickstart.yaml "$@"
