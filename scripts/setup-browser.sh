#!/usr/bin/env bash
# What tests/browser/test_browser.py needs: Debian's chromium (never a downloaded browser) and, in .venv,
# JupyterLab, Notebook 7 (the browser test reopens a notebook there too) and playwright (with torch
# pinned so nothing can replace it). Idempotent and quiet.
# Changes only what it must: the apt packages above, and .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/chromium ]; then
  sudo=""
  if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then sudo="sudo"; fi
  $sudo apt-get update -qq >/dev/null
  # chromium and the fonts pages are laid out with, nothing it only recommends (26 packages here, not
  # 131: no udev, upower, avahi, cups helpers, notification daemon); the tests run it headless,
  # without sandbox or GPU
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
fi
py=.venv/bin/python
if [ ! -x "$py" ]; then bash scripts/setup-venv.sh test; fi
if ! "$py" -c "import jupyterlab, notebook, playwright.sync_api" >/dev/null 2>&1; then
  "$py" -m pip install -q -c <(echo "torch==2.13.0") "jupyterlab>=4" "notebook>=7" "playwright>=1.40" \
    2> >(grep -v -e "^WARNING: Location" -e "BuildBackendWarning" >&2)
fi
