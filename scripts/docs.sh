#!/usr/bin/env bash
# Build the documentation site: docs/ -> docs/_build/html/index.html (open it in a browser).
# Warnings are errors (a broken cross-reference, a missing page, a lesson that fails to render).
# Needs the docs extra in .venv (bash scripts/setup-venv.sh docs; the test extra includes it).
# Arguments go to sphinx-build (e.g. -E to rebuild everything).
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/_build/html
.venv/bin/python -m sphinx -W --keep-going -n -b html "$@" docs "$out"
echo "docs: $out/index.html"
