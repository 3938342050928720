#!/usr/bin/env bash
# The include-direction check must reject an upward include and accept a downward one.
set -euo pipefail
script=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/core" "$tmp/src/graph"
printf '#include "core/tensor.h"\n#include <vector>\n' >"$tmp/src/graph/ok.cpp"
CHECK_INCLUDES_ROOT=$tmp "$script" >/dev/null || { echo "FAIL: a downward include was rejected"; exit 1; }
printf '#include "graph/op.h"\n' >"$tmp/src/core/bad.cpp"
if out=$(CHECK_INCLUDES_ROOT=$tmp "$script" 2>&1); then
  echo "FAIL: core including graph was accepted"; exit 1
fi
grep -q "src/core/bad.cpp:1: module 'core' must not include \"graph/op.h\"" <<<"$out" || {
  echo "FAIL: unexpected message: $out"; exit 1; }
echo "check-includes rejects upward includes: ok"
