#!/usr/bin/env bash
# README's first command. Installs what is missing, builds dtrain (Release),
# prints what the machine offers and validates the quick-start job.
# Until the trainer lands (next milestone) it stops there: it trains nothing yet.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$(nproc)" --target dtrain
"$BUILD_DIR/src/cli/dtrain" info
"$BUILD_DIR/src/cli/dtrain" validate configs/example-resnet.yaml
echo "quickstart: dtrain builds and the job validates; 'dtrain train' arrives with the next milestone."
