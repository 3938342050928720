#!/usr/bin/env bash
# Renders a run report in headless Chromium (Debian's `chromium`) and checks the
# picture: REPORT.html -> OUT.png, then tests/scripts/check_png.py on it. Exit 0 when
# the page drew its charts (see check_png.py), non-zero otherwise.
#   report-screenshot.sh REPORT.html OUT.png
set -euo pipefail
HTML="$(readlink -f "$1")"
OUT="$2"
command -v chromium >/dev/null || { echo "chromium is missing (scripts/install-deps.sh installs it)"; exit 1; }
PROFILE="$(mktemp -d)"
trap 'rm -rf "$PROFILE"' EXIT
# --no-sandbox: CI runs as root; a fresh profile directory: nothing shared between runs.
timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --user-data-dir="$PROFILE" --window-size=1200,1600 --screenshot="$OUT" "file://$HTML" \
  >/dev/null 2>&1 || true
[[ -s "$OUT" ]] || { echo "chromium wrote no screenshot"; exit 1; }
exec python3 "$(dirname "$0")/check_png.py" "$OUT"
