#!/usr/bin/env bash
# Create (or reuse) .venv and install nbddp into it. torch 2.13.0 goes in first and stays pinned,
# so nothing below can swap in another build. Usage: setup-venv.sh [EXTRAS]
# (lessons: what the notebooks need; test: that plus the test tools).
#
# Which torch build: NBDDP_TORCH=cpu|cuda|auto (default auto: cpu when `nvidia-smi -L` finds no
# GPU). cpu asks PyTorch's CPU wheel index (no multi-GB CUDA libraries); where that index cannot be
# reached within a few seconds it falls back to the package index as configured (PyPI's Linux
# wheel is the CUDA build; a local CPU wheel where pip's config names one). cuda takes the package
# index's build. The last line says which build was installed.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
torch_version=2.13.0
cpu_index="${NBDDP_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"  # NBDDP_CPU_INDEX: a mirror of it
export PIP_DISABLE_PIP_VERSION_CHECK=1  # no "[notice] A new release of pip" in a newcomer's first output
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
py=.venv/bin/python
# This machine's pip config names a local index with gaps; pip warns once per missing package.
quiet() { "$@" 2> >(grep -v -e "^WARNING: Location '.*' is ignored" >&2); }
"$py" -m pip install -q --upgrade pip >/dev/null 2>&1 || true

want="${NBDDP_TORCH:-auto}"
if [ "$want" = auto ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then want=cuda; else want=cpu; fi
fi
case "$want" in cpu|cuda) ;; *) echo "setup-venv.sh: NBDDP_TORCH must be cpu, cuda or auto, got '$want'" >&2; exit 2 ;; esac

source="already in .venv"
installed() { "$py" -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null; }
if [ "$(installed | cut -d+ -f1)" != "$torch_version" ]; then
  source="from the package index"
  if [ "$want" = cpu ]; then
    # One quick look at that index alone (5 s, no retries: pip's configured timeout may be minutes;
    # no config files, whose find-links or extra indexes would answer instead; their proxy kept).
    proxy=$("$py" -m pip config get global.proxy 2>/dev/null || true)
    if env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL PIP_CONFIG_FILE=/dev/null \
        "$py" -m pip index versions torch --index-url "$cpu_index" --timeout 5 --retries 0 ${proxy:+--proxy "$proxy"} \
        2>/dev/null | grep -q "$torch_version"; then
      quiet "$py" -m pip install -q --index-url "$cpu_index" --timeout 30 "torch==$torch_version"
      source="from PyTorch's CPU index"
    else
      echo "setup-venv.sh: $cpu_index not reachable; torch $torch_version from the package index instead" >&2
    fi
  fi
  if [ "$source" = "from the package index" ]; then
    quiet "$py" -m pip install -q "torch==$torch_version"
  fi
fi
# the installed torch exactly (2.13.0+cpu stays 2.13.0+cpu), so the install below keeps it
pin=$(installed)
quiet "$py" -m pip install -q -c <(echo "torch==$pin") -e ".${extras:+[$extras]}"
"$py" - "$source" <<'PY'
import sys
import nbddp, torch
build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
print(f"nbddp {nbddp.__version__}, torch {torch.__version__} ({build}, {sys.argv[1]})")
PY
