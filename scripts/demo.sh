#!/usr/bin/env bash
# Install nbddp with what the lessons need, then run the quickstart notebook headless (papermill,
# a real kernel) and print what each rank wrote. The executed notebook is kept in artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh lessons
mkdir -p artifacts
.venv/bin/python -m ipykernel install --user --name nbddp-venv --display-name "nbddp (.venv)" >/dev/null
.venv/bin/python -m papermill --log-output -k nbddp-venv notebooks/00_quickstart.ipynb artifacts/00_quickstart.ipynb -p world_size "${WORLD_SIZE:-4}" >/dev/null 2>artifacts/demo.log || { cat artifacts/demo.log; exit 1; }
.venv/bin/python - <<'PY'
import nbformat
nb = nbformat.read("artifacts/00_quickstart.ipynb", as_version=4)
for cell in nb.cells:
    if cell.cell_type == "code" and cell.source.startswith("%%ddp"):
        print(">>> " + cell.source.splitlines()[0])
        for out in cell.outputs:
            if out.get("output_type") == "stream":
                print(out["text"], end="")
            elif "text/plain" in out.get("data", {}):
                print(out["data"]["text/plain"])
print(">>> demo finished: artifacts/00_quickstart.ipynb")
print(">>> next, the lessons: .venv/bin/jupyter lab notebooks/  (kernel: \"nbddp (.venv)\")")
PY
