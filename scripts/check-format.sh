#!/usr/bin/env bash
# Fails when a C++ source differs from what clang-format (.clang-format, 100 columns) would write.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files --cached --others --exclude-standard -- '*.h' '*.cpp' '*.cu' '*.cuh')
bad=0
for f in $files; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "check-format: $f is not clang-formatted (run: clang-format -i $f)"
    bad=1
  fi
done
# A ';' in a doctest case's name splits it in two when ctest discovers the cases (a
# CMake list), and each half then matches no case and passes without running.
if grep -n 'TEST_CASE("[^"]*;' $files; then
  echo "check-format: a TEST_CASE name above holds ';': ctest would split it and never run it"
  bad=1
fi
[ "$bad" -eq 0 ] && echo "check-format: $(wc -w <<<"$files") files formatted"
exit "$bad"
