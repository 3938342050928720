#!/usr/bin/env bash
# Test helper set-up (ctest fixture): a virtual environment at $1 with the
# `tensorboard` package from PyPI, whose reader the observability test uses to read
# dtrain's event files back. The product itself needs no Python. Done once per
# build directory; a no-op when the environment already imports tensorboard.
set -euo pipefail
VENV="$1"
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import tensorboard" 2>/dev/null; then
  exit 0
fi
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check tensorboard
"$VENV/bin/python" -c "import tensorboard; print('tensorboard', tensorboard.__version__)"
