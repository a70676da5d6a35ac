"""nbddp as a user installs it from a package: ``python -m build`` makes an sdist and, from that
sdist, a wheel; both pass ``twine check``; the wheel (not editable) goes into a fresh venv with
the same CPU torch, and a real kernel started from that venv, outside the source tree and with no
PYTHONPATH, runs fresh ``%%ddp`` cells (forkserver, then spares), the torchrun launcher and a
lesson under papermill, every rank loading nbddp from the venv's site-packages.

The venv is made without pip (the test's pip installs into it with ``--python``) and without
byte-compiling all of torch (only what an import touches): a fresh venv with torch takes ~1
minute instead of ~3 on 2 cores.
"""
from __future__ import annotations

import email
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import nbddp
import support
from support.helpers import alive, wait_gone
from support.kernel import Kernel

ROOT = str(support.ROOT)
LESSON = "05_sharding_and_metrics.ipynb"  # a short lesson with every kind of cell (params, %%ddp, check, solution)

pytestmark = pytest.mark.timeout(600)


def run(cmd, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def clean_env(**extra) -> dict:
    """The environment of a user who never saw the checkout: no PYTHONPATH, no outer venv, and
    Python's default of writing bytecode (the venv installs without it, so the first process
    compiles what it imports of torch once; with PYTHONDONTWRITEBYTECODE every process would)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """sdist and wheel from ``python -m build`` on a copy of the tracked tree (no build/ or
    egg-info left in the checkout)."""
    out = tmp_path_factory.mktemp("dist")
    src = tmp_path_factory.mktemp("src") / "nbddp"
    files = run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT).stdout.split("\0")
    for name in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, name)):
            os.makedirs(src / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), src / name)
    run([sys.executable, "-m", "build", "--outdir", str(out), str(src)], cwd=str(src))
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory):
    """A fresh venv with the CPU torch this suite runs on and the wheel (base install)."""
    path = tmp_path_factory.mktemp("venv") / "v"
    run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    python = str(path / "bin" / "python")
    pins = path.parent / "constraints.txt"
    import torch

    pins.write_text(f"torch=={torch.__version__}\n")  # never a different (CUDA) build
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile", "-c", str(pins),
         f"torch=={torch.__version__}", str(dist[1])], env=clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"))
    # the first import writes the bytecode a user's first import would (the forkserver runs with
    # -B, and CI may set PYTHONDONTWRITEBYTECODE: without this every process compiles torch again)
    warm = ("import torch.distributed, torch.nn, torch.distributed.run, nbddp.magic, nbddp.rank.worker, "
            "ipykernel.kernelapp, papermill")
    run([python, "-c", warm], env=clean_env())
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    return python, site


def test_sdist_and_wheel_pass_twine_check_and_carry_what_a_user_needs(dist):
    sdist, wheel = dist
    run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)])
    import tarfile

    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("README.md", "LICENSE", "CHANGELOG.md", "pyproject.toml", "nbddp/__init__.py",
                   "nbddp/rank/torchrun_rank.py", "notebooks/00_quickstart.ipynb"):
        assert needed in names, (needed, sorted(names))
    assert not any(n.startswith("tests/") for n in names), "the tests need the checkout, not the sdist"
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        meta = email.message_from_string(whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
    assert {n.split("/")[0] for n in names} == {"nbddp", f"nbddp-{nbddp.__version__}.dist-info"}, names
    assert "nbddp/datasets/digits.csv.gz" in names, "the lessons' data set is package data"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert meta["Version"] == nbddp.__version__ and meta["License-Expression"] == "MIT"
    assert "lessons" in meta.get_all("Provides-Extra")
    assert any(r.startswith("matplotlib") and 'extra == "lessons"' in r for r in meta.get_all("Requires-Dist"))


def test_version_comes_from_one_place():
    """nbddp.__version__ (nbddp/__init__.py) is the only version; the metadata pip installed agrees."""
    assert importlib.metadata.version("nbddp") == nbddp.__version__
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert 'dynamic = ["version"]' in text and 'version = {attr = "nbddp.__version__"}' in text
    changelog = open(os.path.join(ROOT, "CHANGELOG.md")).read()
    assert f"## [{nbddp.__version__}]" in changelog or "## [Unreleased]" in changelog


RANK = """
import json, os, sys, nbddp, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1); dist.all_reduce(t)
runner = sys._getframe().f_back.f_code.co_filename  # what ran this cell: nbddp's worker or torchrun_rank
print("WHERE " + json.dumps({"rank": dist.get_rank(), "sum": t.item(), "nbddp": nbddp.__file__,
                             "runner": runner, "path": sys.path, "cwd": os.getcwd()}))
dist.destroy_process_group()
"""


def where(reply) -> dict:
    found = [json.loads(line.split("WHERE ", 1)[1]) for line in reply.stdout.splitlines() if "WHERE " in line]
    return {d["rank"]: d for d in found}


def inside_checkout(paths, cwd) -> list[str]:
    """The sys.path entries (``""``: the process's cwd) that would let the source tree be
    imported instead of the wheel."""
    root = os.path.realpath(ROOT)
    full = [os.path.realpath(os.path.join(cwd, p)) for p in paths]
    return [p for p in full if p == root or p.startswith(root + os.sep)]


def test_installed_wheel_runs_ddp_cells_spares_and_torchrun(venv, tmp_path):
    python, site = venv
    work = tmp_path / "work"
    work.mkdir()
    k = Kernel(cwd=str(work), env=clean_env(), python=python)
    ranks = []
    try:
        k.ok("%load_ext nbddp")
        kernel_side = json.loads(k.ok("import json, sys, nbddp; print(json.dumps([nbddp.__file__, sys.path]))").stdout)
        assert kernel_side[0] == os.path.join(site, "nbddp", "__init__.py"), kernel_side
        assert not inside_checkout(kernel_side[1], str(work)), kernel_side[1]

        for launch in ("forkserver", "spares", "torchrun"):
            if launch == "spares":
                k.settle()
                pids = k.ok("import json, nbddp.forkserver.spares as s; print(json.dumps(s.pids()))").stdout
                waiting = json.loads(pids)
                assert len(waiting) == 2, f"no spares were forked for the next cell: {waiting}"
            line = "%%ddp -n 2 --output text" + (" --launcher torchrun" if launch == "torchrun" else "")
            reply = k.ok(line + "\n" + RANK, timeout=180)
            seen = where(reply)
            assert sorted(seen) == [0, 1], (launch, reply.text[-3000:])
            for d in seen.values():
                assert d["sum"] == 2.0 and d["cwd"] == str(work), (launch, d)
                assert d["nbddp"] == os.path.join(site, "nbddp", "__init__.py"), (launch, d)
                runner = "torchrun_rank.py" if launch == "torchrun" else "worker.py"
                assert d["runner"] == os.path.join(site, "nbddp", "rank", runner), (launch, d)
                assert not inside_checkout(d["path"], d["cwd"]), (launch, d["path"])
            pids = json.loads(k.ok("import json; print(json.dumps([r.pid for r in _ddp.ranks]))").stdout)
            if launch == "spares":
                assert sorted(pids) == sorted(waiting), "the second cell did not run on the spares"
            ranks += pids
    finally:
        k.shutdown()
    assert not wait_gone(ranks, 10), f"ranks outlived the kernel: {alive(ranks)}"


def test_installed_wheel_runs_a_lesson_under_papermill(venv, tmp_path):
    python, site = venv
    shutil.copy(os.path.join(ROOT, "notebooks", LESSON), tmp_path / LESSON)
    spec = tmp_path / "jupyter" / "kernels" / "wheel-venv"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "nbddp wheel venv", "language": "python"}))
    run([python, "-m", "papermill", "-k", "wheel-venv", "--cwd", str(tmp_path), "--no-progress-bar",
         LESSON, "out.ipynb"], cwd=str(tmp_path), env=clean_env(JUPYTER_PATH=str(tmp_path / "jupyter")), timeout=300)
    import nbformat

    out = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4)
    code = [c for c in out.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "every cell ran"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert out.metadata.papermill.get("exception") is not True
