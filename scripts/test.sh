#!/usr/bin/env bash
# Install everything the tests need into .venv, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh test
if [ -x scripts/setup-browser.sh ]; then bash scripts/setup-browser.sh; fi
mkdir -p artifacts
exec .venv/bin/python -m pytest "$@"
