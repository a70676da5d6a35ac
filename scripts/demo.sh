#!/usr/bin/env bash
# Install nbddp with what the lessons need, then run the quickstart notebook headless (papermill,
# a real kernel) and print what each rank wrote. The executed notebook is kept in artifacts/.
# About 70 s on 2 cores once .venv exists; the first run also installs it (a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh lessons
mkdir -p artifacts
# The kernelspec lives inside .venv (--sys-prefix): another clone cannot overwrite it, deleting
# this clone deletes it, and running the demo again replaces it in place. `.venv/bin/jupyter`
# (lab, papermill) finds it; a Jupyter outside .venv does not see it.
.venv/bin/python -m ipykernel install --sys-prefix --name nbddp-venv --display-name "nbddp (.venv)" >/dev/null
# An earlier demo put a user-wide spec of this name here; remove it only if it is this clone's.
old=~/.local/share/jupyter/kernels/nbddp-venv
if [ -f "$old/kernel.json" ] && grep -qF "\"$PWD/.venv/bin/python" "$old/kernel.json"; then rm -r "$old"; fi
.venv/bin/python -m papermill --log-output -k nbddp-venv notebooks/00_quickstart.ipynb artifacts/00_quickstart.ipynb -p world_size "${WORLD_SIZE:-4}" >/dev/null 2>artifacts/demo.log || { cat artifacts/demo.log; exit 1; }
allow_root=""
if [ "$(id -u)" = 0 ]; then allow_root=" --allow-root"; fi  # Jupyter refuses to start as root without it
ALLOW_ROOT="$allow_root" .venv/bin/python - <<'PY'
import os
import nbformat
nb = nbformat.read("artifacts/00_quickstart.ipynb", as_version=4)
for cell in nb.cells:
    if cell.cell_type == "code" and cell.source.startswith("%%ddp"):
        print(">>> " + cell.source.splitlines()[0])
        for out in cell.outputs:
            if out.get("output_type") == "stream":
                print(out["text"], end="")  # the lines as the ranks wrote them
            elif out.get("metadata", {}).get("nbddp", {}).get("transcript"):
                # the saved transcript repeats every rank's lines, grouped by rank: its summary only
                summary = out["data"]["text/plain"].split("\n--- rank ")[0]
                print(summary + "\n(the notebook keeps each rank's lines again, grouped by rank)")
            elif "text/plain" in out.get("data", {}):
                print(out["data"]["text/plain"])
print(">>> demo finished: artifacts/00_quickstart.ipynb")
print(f">>> next, the lessons: .venv/bin/jupyter lab{os.environ['ALLOW_ROOT']} notebooks/  (kernel: \"nbddp (.venv)\")")
PY
