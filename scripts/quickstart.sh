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
# A fresh run refuses a directory that holds an earlier run's checkpoints: this script's
# own runs/quickstart/ is replaced (unless --set run.output_dir=... sends the run elsewhere).
if [[ -d runs/quickstart/checkpoints && "$*" != *run.output_dir* ]]; then
  echo "quickstart: replacing the earlier run in runs/quickstart/"
  rm -rf runs/quickstart
fi
exec "$BUILD_DIR/src/cli/dtrain" train configs/quickstart.yaml "$@"
