"""Every lesson notebook runs headless under papermill in a real kernel, without an error, and its
own check cells pass. The executed notebooks are kept in artifacts/notebooks/ (CI artifacts).
(The lessons' sources and committed copies, checked without a kernel: tests/unit/test_lesson_sources.py.)

The kernel is this interpreter (a kernelspec written to a temporary JUPYTER_PATH entry), so it
works in a fresh .venv without ``ipykernel install``. Each notebook runs in a scratch folder, so
the checkpoints and logs the lessons write stay out of the repository.
"""
from __future__ import annotations

import os
import re
import sys
import time

import nbformat
import pytest

from support import ROOT
from support.lessons import ARTIFACTS, LESSONS, NOTEBOOK_FILES, NOTEBOOKS, build, executed


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory):
    """A kernelspec that starts this very interpreter, found through JUPYTER_PATH."""
    with executed.interpreter_kernel(str(tmp_path_factory.mktemp("jupyter"))) as name:
        yield name


# The lessons whose figures are timings: each runs with a busy loop pinned to one core beside it (the
# suite's other test files load the machine too), so a figure that only agrees with its text on an
# idle machine fails here, where its lesson asserts the claim, instead of being committed.
BUSY_BESIDE = ("09", "10", "12", "15")
BUSY_LOOP = "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"


def _execute(name: str, kernel_name: str, cwd: str) -> float:
    """Run one lesson under papermill into artifacts/ (with a busy core beside it for the timed
    lessons); its seconds."""
    import subprocess
    busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if name[:2] in BUSY_BESIDE else None
    started = time.monotonic()
    try:
        executed.execute(os.path.join(NOTEBOOKS, name), os.path.join(ARTIFACTS, name), kernel_name, cwd=cwd)
    finally:
        elapsed = time.monotonic() - started
        if busy:
            busy.kill()
            busy.wait(10)
        print(f"{name}: {elapsed:.1f} s under papermill" + (" beside a busy core" if busy else ""))
    return elapsed


@pytest.mark.parametrize("name", NOTEBOOK_FILES)
def test_lesson_runs_clean_and_checks_pass(name, kernel_name, tmp_path):
    """Every notebook in notebooks/ (the quickstart, the built lessons, the pool one), with only what
    the README's install gives: this interpreter has the ``lessons`` extra (the test extra
    includes it) and nothing the notebooks import beyond that."""
    src = os.path.join(NOTEBOOKS, name)
    nb = nbformat.read(src, as_version=4)
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    tags = [t for c in nb.cells for t in c.metadata.get("tags", [])]
    assert tags.count("parameters") == 1, "one papermill parameters cell"
    assert any(c.source.startswith("%%ddp") for c in code_cells)
    assert all(not c.get("outputs") for c in code_cells), "committed unexecuted"
    assert not any("%matplotlib" in c.source for c in code_cells), "ipykernel renders plots inline by itself"
    if name != LESSONS[0]:  # the lesson shape every lesson after the quickstart promises
        assert "solution" in tags and "check" in tags, "an exercise, its folded solution and a check"
        assert any(c.cell_type == "markdown" and c.source.startswith("## Check") for c in nb.cells)

    os.makedirs(ARTIFACTS, exist_ok=True)
    elapsed = _execute(name, kernel_name, str(tmp_path))  # in a kernel and folder of its own, as on a student's machine
    out = nbformat.read(os.path.join(ARTIFACTS, name), as_version=4)
    errors = [o for c in out.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    ran = [c for c in out.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in ran), "every code cell ran"
    if any("import matplotlib" in c.source for c in ran):  # a plot shows without %matplotlib inline
        assert any("image/png" in o.get("data", {}) for c in ran for o in c.outputs), "no plot was shown"
    assert elapsed < 120, f"{name} took {elapsed:.0f} s; lessons must stay quick on 2 CPU cores (beside another)"


def test_binder_postbuild_smoke_check_runs_here():
    """The check postBuild runs at the end of the image build passes on this machine."""
    text = open(os.path.join(ROOT, "binder", "postBuild")).read()
    snippet = text.split("<<'PY'\n", 1)[1].split("\nPY", 1)[0]
    import subprocess
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "all 2 ranks finished ok" in done.stdout, done.stdout


TOY_LESSON = '''# %% title [markdown]
# # A toy lesson

# %% parameters tags=["parameters"]
n = 3

# %% earlier
answer = None  # an earlier cell of the lesson
{earlier}

# %% exercise [markdown]
# ## Exercise

# %% try-it tags=["exercise"]
# your answer: answer = ...

# %% solution tags=["solution"]
answer = n * 2

# %% check [markdown]
# ## Check

# %% check-answer tags=["check"]
assert answer is not None, "✗ nothing to check yet: set answer"
assert answer == n * 2, f"✗ answer {{answer}}: twice n is {{n * 2}}"
print("✓")

# %% after
assert answer == n * 2 and "wrong" not in globals()  # the probes left the namespace as the solution found it

# %% mistake tags=["mistake"]
answer = n + 2
wrong = True
# expect: ✗ answer 5
'''


@pytest.mark.parametrize("earlier, problem", [
    ("", None),
    ("answer = 6  # a check that an earlier cell already satisfies", "the exercise as given: the check passed"),
    ("n = 2  # n + 2 == n * 2: the mistake passes the check", "mistake: the check passed"),
], ids=["fails-on-both", "passes-as-given", "passes-on-the-mistake"])
def test_the_lesson_runner_proves_the_check_fails_on_the_exercise_as_given_and_on_each_mistake(
        earlier, problem, kernel_name, tmp_path):
    """notebooks/lessonrun.py: a check that passes on the exercise left as given, or on a source's
    typical mistake, fails the lesson (ExerciseCheckError naming the probe); a right one runs the
    lesson as before, its namespace untouched by the probes, its notebook without the mistake cell."""
    source = tmp_path / "src.py"
    source.write_text(TOY_LESSON.format(earlier=earlier))
    nb_path = tmp_path / "lesson.ipynb"
    nb_path.write_text(build.render(build.read_lesson(str(source))))
    assert "wrong = True" not in nb_path.read_text() and len(build.mistakes(str(source))) == 1
    out = tmp_path / "out.ipynb"
    if problem is None:
        executed.execute(str(nb_path), str(out), kernel_name, str(tmp_path), source=str(source))
        ran = nbformat.read(str(out), as_version=4)
        counts = [c.execution_count for c in ran.cells if c.cell_type == "code"]
        assert counts == list(range(1, len(counts) + 1)), counts  # the probes are not in the history
        probes = ran.metadata["nbddp"]["exercise_probes"]
        assert [p["probe"] for p in probes] == ["the exercise as given", "mistake"], probes
        assert probes[1]["check_said"] == "AssertionError: ✗ answer 5: twice n is 6", probes
        assert "nbddp" not in executed.scrub(ran).metadata
    else:
        with pytest.raises(executed.ExerciseCheckError, match=re.escape(problem)):
            executed.execute(str(nb_path), str(out), kernel_name, str(tmp_path), source=str(source))
