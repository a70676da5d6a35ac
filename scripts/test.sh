#!/usr/bin/env bash
# Install everything the tests need into .venv, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh test
if [ -x scripts/setup-browser.sh ]; then bash scripts/setup-browser.sh; fi
# a real Slurm on this machine for tests/test_slurm.py (returns at once when it already runs);
# if it cannot start, the Slurm tests fail and say why, the others still run
bash scripts/setup-slurm.sh || echo "scripts/setup-slurm.sh failed: tests/test_slurm.py will fail" >&2
mkdir -p artifacts
exec .venv/bin/python -m pytest "$@"
