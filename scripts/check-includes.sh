#!/usr/bin/env bash
# Rejects an #include that points up the dependency direction of shared/DESIGN.md:
# core <- kernels <- graph <- models; core, kernels <- dist (device buffers: the
# kernels' streams and allocators, and the elementwise adds of DDP); optim, precision, compress
# use core + kernels + dist; data uses core + kernels; runtime composes them;
# config (YAML -> typed job) sits on runtime; cli sits on top. Tests are exempt.
set -euo pipefail
cd "${CHECK_INCLUDES_ROOT:-$(dirname "$0")/..}"

allowed() {  # module -> the modules it may include
  case "$1" in
    core) echo "core" ;;
    kernels) echo "core kernels" ;;
    graph) echo "core kernels graph" ;;
    models) echo "core kernels graph models" ;;
    dist) echo "core kernels dist" ;;
    optim | precision | compress) echo "core kernels dist $1" ;;
    data) echo "core kernels data" ;;
    runtime) echo "core kernels graph models dist optim precision compress data runtime" ;;
    config) echo "core kernels graph models dist optim precision compress data runtime config" ;;
    cli) echo "core kernels graph models dist optim precision compress data runtime config cli" ;;
    *) echo "" ;;
  esac
}

module_of() {  # file path -> module
  case "$1" in
    src/*) cut -d/ -f2 <<<"$1" ;;
    kernels/*) echo kernels ;;
    models/*) echo models ;;
    *) echo "" ;;
  esac
}

status=0
checked=0
while IFS= read -r file; do
  mod=$(module_of "$file")
  [ -n "$mod" ] || continue
  ok=" $(allowed "$mod") "
  while IFS=: read -r line inc; do
    target=${inc%%/*}
    case " core kernels graph models dist optim precision compress data runtime config cli " in
      *" $target "*) ;;
      *) continue ;;  # a system or third-party header
    esac
    checked=$((checked + 1))
    if [[ "$ok" != *" $target "* ]]; then
      echo "$file:$line: module '$mod' must not include \"$inc\" ($target is above it; see shared/DESIGN.md)"
      status=1
    fi
  done < <(grep -nE '^\s*#\s*include\s*"' "$file" | sed -E 's/^([0-9]+):\s*#\s*include\s*"([^"]+)".*/\1:\2/')
done < <(if git rev-parse --git-dir >/dev/null 2>&1; then
           git ls-files --cached --others --exclude-standard -- 'src/*' 'kernels/*' 'models/*'
         else
           find src kernels models -type f 2>/dev/null
         fi | grep -E '\.(h|hpp|cpp|cu|cuh)$')

if [ "$status" -eq 0 ]; then echo "check-includes: $checked project includes follow the dependency direction"; fi
exit "$status"
