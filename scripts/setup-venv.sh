#!/usr/bin/env bash
# Create (or reuse) .venv and install nbddp into it. torch is pinned first to the CPU build
# 2.13.0, so nothing below can pull a multi-GB CUDA build. Usage: setup-venv.sh [EXTRAS]
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
py=.venv/bin/python
quiet() { "$@" 2> >(grep -v -e "^WARNING: Location" -e "BuildBackendWarning" >&2); }
"$py" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
quiet "$py" -m pip install -q "torch==2.13.0"
if [ -n "$extras" ]; then
  quiet "$py" -m pip install -q -c <(echo "torch==2.13.0") -e ".[$extras]"
else
  quiet "$py" -m pip install -q -c <(echo "torch==2.13.0") -e .
fi
"$py" -c "import torch, nbddp; print('nbddp', nbddp.__version__, 'torch', torch.__version__)"
