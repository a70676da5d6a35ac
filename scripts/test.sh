#!/usr/bin/env bash
# Install everything the tests need, then run the whole suite (9-17 minutes on 2 cores by the machine, three files at a time;
# `pytest -m "not kernel"`, or `pytest tests/unit`, alone runs the pure tests in seconds).
# What it changes on the machine: .venv (torch, nbddp, the test extras, JupyterLab, playwright);
# as root, Debian's chromium without its recommended packages (scripts/setup-browser.sh) and
# Debian's slurm-wlm + munge (scripts/setup-slurm.sh). The Slurm daemons it starts (on this
# host's name's address only) are stopped when the suite ends; a Slurm already running is used
# and left running. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh test
if [ -x scripts/setup-browser.sh ]; then bash scripts/setup-browser.sh; fi
slurm_was_up=""
if [ -f /run/slurmctld.pid ] && kill -0 "$(cat /run/slurmctld.pid)" 2>/dev/null; then slurm_was_up=1; fi
# a real Slurm on this machine for tests/kernel/test_slurm.py (returns at once when it already runs);
# if it cannot start, the Slurm tests fail and say why, the others still run
if [ -z "$slurm_was_up" ] && [ "$(id -u)" = 0 ]; then  # stop what this run started, not a job of another
  trap 'bash scripts/setup-slurm.sh stop >/dev/null || echo "Slurm left running: bash scripts/setup-slurm.sh stop" >&2' EXIT
fi
bash scripts/setup-slurm.sh || echo "scripts/setup-slurm.sh failed: tests/kernel/test_slurm.py will fail" >&2
mkdir -p artifacts
status=0
# Three test files at a time (pytest-xdist, a file stays on one worker, its kernel fixture shared
# as before): a kernel test alone spends much of its time waiting for ranks, timeouts, pip and
# kernels, so three at once keep both cores busy (86-99% in a sampled run): on 2 cores they take
# 505-988 s of pytest by the machine, where two took 1,093 s and four were no faster. tests/conftest.py sends
# the longest files first; the 25 slowest tests are listed at the end. `-n 0` (after these) runs
# them one at a time.
.venv/bin/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder --durations=25 "$@" || status=$?
exit "$status"
