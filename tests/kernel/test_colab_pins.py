"""nbddp installs and runs with Google Colab's pinned IPython 7.34.0, ipykernel 6.17.1 and ipywidgets
7.7.1 (upgrading them puts Colab's runtime in a crash loop, googlecolab/colabtools#5580): a venv with exactly those
pins, nbddp installed into it from this checkout as a user would (`pip install nbddp` resolves against the pins, nothing
upgraded), then that venv's kernel runs a `%%ddp` cell (the text view, saying why: the live view needs ipywidgets 8),
`--output widgets` (says it cannot, shows text), the pool, and a lesson under papermill.

Kaggle's image is built on Colab's (Kaggle/docker-python's Dockerfile.tmpl: FROM the Colab base,
then `uv pip install` of kaggle_requirements.txt), which keeps IPython and ipykernel and pins
ipywidgets==8.1.5: so Kaggle's kernel is these pins with ipywidgets 8.1.5, checked here by laying
ipywidgets 8.1.5 (and its widgetsnbextension, jupyterlab_widgets and comm) over the same venv:
there the live view is drawn (ipywidgets 8's protocol over ipykernel 6.17's comms).

All three pins install on this machine's Python 3.11 as published: no nearer version was needed.
torch is the one this interpreter has (2.13.0, CPU build from this machine's wheel cache), pinned
by a constraints file as scripts/setup-venv.sh does, so pip never fetches another build. The venv
is kept in pytest's cache, keyed by the pins and nbddp's requirements: the first run builds it
(a minute or two; without byte-compiling torch, as tests/kernel/test_wheel.py: only what an import
touches is compiled), later runs reuse it.
"""
import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest
import torch

import support
from support.kernel import Kernel

pytestmark = pytest.mark.timeout(1800)  # the first run builds the venv

COLAB_PINS = {"ipython": "7.34.0", "ipykernel": "6.17.1", "ipywidgets": "7.7.1"}
KAGGLE_WIDGETS = ["ipywidgets==8.1.5", "widgetsnbextension~=4.0.12", "jupyterlab_widgets~=3.0.12", "comm>=0.1.3"]
ROOT = str(support.ROOT)
LESSON = "00_quickstart.ipynb"  # what a learner runs first; needs nothing beyond nbddp (no matplotlib)


def _constraints() -> str:
    return "".join(f"{name}=={version}\n" for name, version in
                   {"torch": torch.__version__, **COLAB_PINS}.items())


def _key() -> str:
    """The pins, nbddp's requirements and this Python: what the venv's contents depend on (the
    code is installed editable, so a change to it needs no new venv)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        requires = tomllib.load(f)["project"]["dependencies"]
    text = _constraints() + "\n".join(requires) + sys.version
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _colab_env(**extra) -> dict:
    """A Colab runtime's environment for the venv's processes: Python's default of writing
    bytecode (the venv installs without it, so the first kernel compiles what it imports of torch
    once; with this machine's PYTHONDONTWRITEBYTECODE every kernel and forkserver would again)."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, **extra}


def _pip(venv, *args, constraints=None):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    pins = ["-c", constraints] if constraints else []
    done = subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q", "--no-compile",
                           *pins, *args], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def colab_venv(request):
    """A venv with Colab's pins and nbddp (editable, this checkout), built once per key; a build
    cut short goes on from the last step that finished (torch alone is minutes to copy)."""
    venv = str(request.config.cache.mkdir(f"colab-pins-{_key()}"))
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, "built")
    if not os.path.exists(stamp):
        if not os.path.exists(python):
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
        constraints = os.path.join(venv, "constraints.txt")
        with open(constraints, "w") as f:
            f.write(_constraints())
        if _versions(venv, "torch").get("torch") != torch.__version__:
            _pip(venv, f"torch=={torch.__version__}", constraints=constraints)
        _pip(venv, "-e", ROOT, constraints=constraints)
        subprocess.run([python, "-m", "ipykernel", "install", "--prefix", venv, "--name", "colab-pins"],
                       check=True, capture_output=True, timeout=120)
        with open(stamp, "w") as f:
            f.write(_constraints())
    return venv


def _versions(venv, *names) -> dict:
    """The installed versions of ``names`` in the venv (those not installed left out)."""
    code = ("import json, sys, importlib.metadata as m\nfound = {}\nfor n in sys.argv[1:]:\n"
            "    try: found[n] = m.version(n)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(found))")
    out = subprocess.run([os.path.join(venv, "bin", "python"), "-c", code, *names], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return json.loads(out)


def test_the_pins_hold(colab_venv):
    versions = _versions(colab_venv, *COLAB_PINS, "torch", "nbddp")
    assert {name: versions[name] for name in COLAB_PINS} == COLAB_PINS  # installing nbddp upgraded none
    assert versions["torch"] == torch.__version__


def test_a_cell_and_the_pool_run_in_the_pinned_kernel(colab_venv, tmp_path):
    k = Kernel(cwd=str(tmp_path), env=_colab_env(), python=os.path.join(colab_venv, "bin", "python"))
    try:
        k.ok("%load_ext nbddp")
        reply = k.ok("%%ddp -n 2 --timeout 120\nimport os, torch, torch.distributed as dist\n"
                     "dist.init_process_group('gloo'); t = torch.ones(1); dist.all_reduce(t)\n"
                     "print('sum', int(t.item()), 'on', os.environ['RANK'])\ndist.destroy_process_group()",
                     timeout=300)
        assert "[rank0]:sum 2 on 0" in reply.stdout and "[rank1]:sum 2 on 1" in reply.stdout, reply.text
        assert "needs ipywidgets 8 and this kernel has 7.7.1" in reply.stdout  # why text, said once
        reply = k.ok("%%ddp -n 2 --output widgets\nprint('hello')")
        assert "--output widgets cannot show here" in reply.stdout and "[rank1]:hello" in reply.stdout
        assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in reply.outputs)
        reply = k.ok("%ddp_pool start -n 2")
        assert "2 ranks" in reply.stdout, reply.text
        k.ok("%%ddp\nimport os\nx = int(os.environ['RANK']) * 10")
        reply = k.ok("%%ddp\nprint('pool x', x)")
        assert "[rank1]:pool x 10" in reply.stdout, reply.text
        k.ok("%ddp_pool stop")
    finally:
        k.shutdown()


def test_a_lesson_runs_in_the_pinned_kernel(colab_venv, tmp_path):
    python = os.path.join(colab_venv, "bin", "python")
    out = tmp_path / LESSON
    done = subprocess.run([python, "-m", "papermill", os.path.join(ROOT, "notebooks", LESSON), str(out),
                           "-k", "colab-pins", "--cwd", str(tmp_path), "--no-progress-bar",
                           "--execution-timeout", "180"],
                          env=_colab_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    executed = json.loads(out.read_text())
    texts = [o.get("text", "") for c in executed["cells"] for o in c.get("outputs", [])]
    assert any(re.search(r"\[rank\d\]:", "".join(t)) for t in texts)


@pytest.fixture(scope="module")
def kaggle_overlay(colab_venv):
    """ipywidgets 8.1.5 and what it needs, in a folder put first on the Colab venv's path."""
    overlay = os.path.join(colab_venv, "kaggle-widgets")
    if not os.path.exists(os.path.join(overlay, "built")):
        _pip(colab_venv, "--no-deps", "--target", overlay, *KAGGLE_WIDGETS)   # not the pins: 7.7.1
        with open(os.path.join(overlay, "built"), "w") as f:
            f.write("\n".join(KAGGLE_WIDGETS))
    return overlay


def test_kaggles_pins_get_the_live_view(colab_venv, kaggle_overlay, tmp_path):
    env = _colab_env(PYTHONPATH=kaggle_overlay)
    k = Kernel(cwd=str(tmp_path), env=env, python=os.path.join(colab_venv, "bin", "python"))
    try:
        out = k.ok("import IPython, ipykernel, ipywidgets\n"
                   "print(IPython.__version__, ipykernel.__version__, ipywidgets.__version__)").stdout
        assert out.split() == ["7.34.0", "6.17.1", "8.1.5"], out
        k.ok("%load_ext nbddp")
        reply = k.ok("%%ddp -n 2 --output widgets --timeout 120\nimport os\n"
                     "print('hello from', os.environ['RANK'], flush=True)", timeout=300)
        models = {(state.get("_model_name"), state.get("_model_module_version")) for state in reply.states}
        assert ("HTMLModel", "2.0.0") in models, models   # ipywidgets 8's protocol: the live view's panes
        panes = "\n".join(v for state in reply.states if isinstance(v := state.get("value"), str))
        assert "hello from 0" in panes and "hello from 1" in panes, panes[-2000:]
        assert "cannot show here" not in reply.text, reply.text
    finally:
        k.shutdown()
