"""Executed copies of the lessons, to read without running them: docs/lessons/NN_name.ipynb.

    python notebooks/executed.py                          # runs every lesson under papermill (about 5 min on 2 cores)
    python notebooks/executed.py 03_p2p_and_collectives   # ... or only these
    # reuse the copies tests/kernel/test_notebooks.py just executed:
    python notebooks/executed.py --from artifacts/notebooks
    # on a machine with CUDA: the lessons' GPU cells run, into docs/lessons/gpu/NN_name.ipynb
    python notebooks/executed.py --gpu                            # every lesson in GPU_LESSONS
    python notebooks/executed.py --gpu 04_single_device_to_ddp    # ... or only these

GitHub and nbviewer show a notebook's outputs: the plots, the ranks' transcripts, the results. A
copy is scrubbed of what belongs to the machine that ran it (its folders, home, interpreter, host
name, process ids) and of papermill's timings, so it reads the same wherever it was made.
tests/unit/test_lesson_sources.py checks that every lesson has a copy of its current cells, with no machine
path in it.

The copies in docs/lessons/ ran on CPU, where a lesson's GPU cells print why they were skipped. The
lessons in GPU_LESSONS have such cells (tests/unit/test_lesson_gpu_paths.py finds them); ``--gpu``
runs those lessons on a machine with CUDA into docs/lessons/gpu/, scrubbed the same way, with the
GPUs that ran them in the copy's metadata (``gpu_run``), and writes none whose one-GPU cells were
skipped. The docs page "GPU runs" (docs/tutorials/gpu.md) lists the copies that exist.
"""
from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import socket
import sys
import tempfile

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DOCS = os.path.join(ROOT, "docs", "lessons")
GPU_DOCS = os.path.join(DOCS, "gpu")
# The lessons with cells that run only with CUDA (what each shows: docs/tutorials/gpu.md).
GPU_LESSONS = ("04_single_device_to_ddp", "08_no_sync_and_mixed_precision", "09_backends", "12_ddp_under_the_hood")
# What a lesson's one-rank GPU cell prints without CUDA (a cell needing a GPU per rank may skip on one GPU).
NO_CUDA = "skipped: no CUDA GPU here"
KERNEL = "nbddp-lessons"

# A lesson runs in a scratch folder (papermill's cwd): the paths under it are the lesson's own.
SCRATCH = re.compile(r"(?:/private)?(?:/tmp|/var/tmp|/var/folders/[^\s'\"]+?/T)/"
                     r"(?:pytest-of-[^/\s]+/pytest-\d+/[^/\s'\"]+|"
                     r"nbddp-lessons-[^/\s'\"]+/lesson-\d\d)(?=[/\s'\")\],:]|$)")
TEMP = re.compile(r"(?:/private)?(?:/tmp|/var/tmp|/var/folders/[^\s'\"]+?/T)(?=/)")
PIDS = [(re.compile(r"\.nbddp-\d+"), ".nbddp-PID"), (re.compile(r"\b(pid|kernel|PID)[ =](\d{2,})\b"), r"\1 PID"),
        (re.compile(r"\bkernel-\d+\b"), "kernel-PID"), (re.compile(r"<tmp>/nbddp-\w+"), "<tmp>/nbddp-XXXX")]
MACHINE = re.compile(r"/tmp/|/var/tmp/|/var/folders/|/home/|/root/|/Users/|pytest-of-|\.nbddp-\d")


@contextlib.contextmanager
def interpreter_kernel(folder: str):
    """A kernelspec that starts this very interpreter (so a fresh .venv needs no ``ipykernel
    install``), found through JUPYTER_PATH while the block runs."""
    spec_dir = os.path.join(folder, "kernels", KERNEL)
    os.makedirs(spec_dir, exist_ok=True)
    with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
        json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                   "display_name": "nbddp lessons", "language": "python"}, f)
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = folder + (os.pathsep + old if old else "")
    try:
        yield KERNEL
    finally:
        if old is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = old


def _sibling(name: str):
    """notebooks/NAME.py as a module, however this file was loaded (script, test, import)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("lessons_" + name, os.path.join(HERE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ExerciseCheckError(AssertionError):
    """A lesson's check passed (or said the wrong thing) on the exercise as given or on a typical mistake."""


@contextlib.contextmanager
def ipc_kernel():
    """Config for jupyter_client that starts a kernel on unix sockets in a folder of its own (yields
    it; the folder goes after). With TCP, jupyter_client picks five free ports and the kernel binds
    them a moment later; on a busy machine another process takes one in between and the kernel dies
    ("Address already in use") while its client waits 60 s: a CI run's three kernels started at
    once met exactly that. Sockets named by path cannot be taken."""
    from traitlets.config import Config
    folder = tempfile.mkdtemp(prefix="nbk-", dir="/tmp")  # short: a socket's path has at most 107 bytes
    try:
        yield Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(folder, "k")}})
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def execute(src: str, dst: str, kernel_name: str, cwd: str, source: str | None = None) -> None:
    """Run one lesson headless, as tests/kernel/test_notebooks.py and this script do: under papermill, with
    its exercise check tried on the exercise as given and on each of its source's mistakes
    (notebooks/lessonrun.py); a check that does not fail on those raises ExerciseCheckError.
    ``source``: the lesson's source, when not notebooks/src/NAME.py."""
    import papermill
    lessonrun, build = _sibling("lessonrun"), _sibling("build")
    source = source or os.path.join(build.SOURCES, os.path.basename(src)[:-6] + ".py")
    mistakes = build.mistakes(source) if os.path.exists(source) else []
    with ipc_kernel() as config:
        nb = papermill.execute_notebook(src, dst, kernel_name=kernel_name, cwd=cwd, progress_bar=False,
                                        request_save_on_cell_execute=False, execution_timeout=180, config=config,
                                        engine_name=lessonrun.ENGINE, mistakes=[list(m) for m in mistakes])
    wrong = lessonrun.failures(nb)
    if wrong:
        raise ExerciseCheckError(f"{os.path.basename(src)}: " + "; ".join(wrong))


def scrub_text(text: str) -> str:
    """Machine paths and process ids out of one output text."""
    text = SCRATCH.sub(".", text)
    for path, placeholder in sorted(((ROOT, "<repo>"), (sys.prefix, "<venv>"), (os.path.expanduser("~"), "~")),
                                    key=lambda pair: -len(pair[0])):
        if len(path) > 1:
            text = text.replace(path, placeholder)
    text = TEMP.sub("<tmp>", text)
    host = socket.gethostname()
    if len(host) > 3:
        text = re.sub(rf"\b{re.escape(host)}\b", "<host>", text)
    for pattern, replacement in PIDS:
        text = pattern.sub(replacement, text)
    return text


PLACEHOLDERS = ("<repo>", "<venv>", "<tmp>", "<host>")  # what scrub_text puts for a machine's paths and name


def scrub_html(text: str) -> str:
    """scrub_text for HTML: its placeholders escaped, or browsers and GitHub drop ``<tmp>`` as an
    unknown tag and a path loses its start."""
    text = scrub_text(text)
    for placeholder in PLACEHOLDERS:
        text = text.replace(placeholder, html.escape(placeholder))
    return text


def _scrub_value(value, scrub=scrub_text):
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [_scrub_value(v, scrub) for v in value]
    if isinstance(value, dict):
        return {k: (v if k.startswith("image/") else _scrub_value(v, scrub_html if k == "text/html" else scrub))
                for k, v in value.items()}
    return value


def scrub(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The executed notebook without machine paths, process ids or timings."""
    nb.metadata.pop("papermill", None)
    nb.metadata.pop("nbddp", None)  # the exercise probes' outcome (notebooks/lessonrun.py): a test's, not a reader's
    # not the runner's
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        for output in cell.get("outputs", []):
            for key in ("text", "data", "traceback", "evalue"):
                if key in output:
                    output[key] = _scrub_value(output[key])
    return nbformat.from_dict(nb)


def machine_paths(nb: nbformat.NotebookNode) -> list[str]:
    """What in a notebook's outputs still looks like a machine's path (empty for a scrubbed copy)."""
    found = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            text = json.dumps({k: v for k, v in output.items() if k != "data"} |
                              {"data": {k: v for k, v in output.get("data", {}).items() if not k.startswith("image/")}})
            found += [text[max(0, m.start() - 60):m.end() + 40] for m in MACHINE.finditer(text)]
            found += [here for here in (ROOT, sys.prefix, socket.gethostname()) if len(here) > 3 and here in text]
    return found


class NotAGpuRun(ValueError):
    """An executed lesson that is no GPU run of it (``gpu_run_problems``), so no GPU copy is written."""


def gpu_run_problems(nb: nbformat.NotebookNode) -> list[str]:
    """What makes an executed notebook no GPU run of its lesson: no ``gpu_run`` metadata (the GPUs it
    ran on), an error, or a GPU cell that said it found no CUDA (empty for a good copy)."""
    problems = []
    run = nb.metadata.get("gpu_run", {})
    if not (isinstance(run.get("gpus"), int) and run["gpus"] >= 1 and run.get("names")):
        problems.append(f"no GPUs recorded in its metadata (gpu_run: {run!r})")
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                problems.append(f"cell {cell.get('id')}: {output.get('ename')}: {str(output.get('evalue'))[:200]}")
            elif NO_CUDA in json.dumps(output):
                problems.append(f"cell {cell.get('id')}: {NO_CUDA!r}: it ran without CUDA")
    return problems


def _cuda_here() -> dict:
    """The GPUs this machine's torch sees, for a GPU copy's ``gpu_run`` metadata."""
    import torch
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"gpus": count, "names": sorted({torch.cuda.get_device_name(i) for i in range(count)}),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def write_copy(executed: str, name: str, docs: str = DOCS, gpu_run: dict | None = None) -> str:
    nb = scrub(nbformat.read(executed, as_version=4))
    if gpu_run is not None:
        nb.metadata["gpu_run"] = gpu_run
        problems = gpu_run_problems(nb)
        if problems:
            raise NotAGpuRun(f"{name}: not written to {os.path.relpath(docs)}: " + "; ".join(problems))
    os.makedirs(docs, exist_ok=True)
    path = os.path.join(docs, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(nbformat.writes(nb) + "\n")
    return path


def main(argv: list[str]) -> int:
    names = sorted(n for n in os.listdir(HERE) if re.fullmatch(r"\d\d_.*\.ipynb", n))
    source, gpu_run, docs = None, None, DOCS
    if "--gpu" in argv:
        argv = [a for a in argv if a != "--gpu"]
        gpu_run, docs = _cuda_here(), GPU_DOCS
        if not gpu_run["gpus"]:
            print("--gpu: this torch sees no CUDA GPU (the GPU copies are made on a machine with one)")
            return 1
        names = [n for n in names if n[:-6] in GPU_LESSONS]
    if argv[:1] == ["--from"]:
        source, argv = argv[1], argv[2:]
    if gpu_run is not None and [a for a in argv if a.removesuffix(".ipynb") not in GPU_LESSONS]:
        print(f"--gpu: only these lessons have GPU cells: {', '.join(GPU_LESSONS)}")
        return 1
    if argv:
        names = [n for n in names if n[:-6] in argv or n in argv]
    refused = []
    with (tempfile.TemporaryDirectory(prefix="nbddp-lessons-") as tmp,
          interpreter_kernel(os.path.join(tmp, "jupyter")) as kernel):
        for name in names:
            executed = os.path.join(source, name) if source else os.path.join(tmp, name)
            if not source:
                scratch = os.path.join(tmp, "lesson-" + name[:2])   # the lesson's files stay out of the repository
                os.makedirs(scratch)
                execute(os.path.join(HERE, name), executed, kernel, scratch)
            try:
                print("wrote", os.path.relpath(write_copy(executed, name, docs, gpu_run)))
            except NotAGpuRun as exc:
                print(exc)
                refused.append(name)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
