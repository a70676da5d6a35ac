#!/usr/bin/env bash
# Create (or reuse) .venv and install nbddp into it. torch is pinned first to the CPU build
# 2.13.0, so nothing below can pull a multi-GB CUDA build. Usage: setup-venv.sh [EXTRAS]
# (lessons: what the notebooks need; test: that plus the test tools).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
export PIP_DISABLE_PIP_VERSION_CHECK=1  # no "[notice] A new release of pip" in a newcomer's first output
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
py=.venv/bin/python
# This machine's pip config names a local index with gaps; pip warns once per missing package.
quiet() { "$@" 2> >(grep -v -e "^WARNING: Location '.*' is ignored" >&2); }
"$py" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
quiet "$py" -m pip install -q "torch==2.13.0"
quiet "$py" -m pip install -q -c <(echo "torch==2.13.0") -e ".${extras:+[$extras]}"
"$py" -c "import torch, nbddp; print('nbddp', nbddp.__version__, 'torch', torch.__version__)"
