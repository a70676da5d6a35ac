"""The lessons' sources and what is committed from them, without running one: every notebook is
built from its source in notebooks/src/ (in jupytext's own form, cells named by their ids),
every launch has a timeout, an exercise has a place to try, a folded solution and a check that
says what is wrong, the executed copies in docs/lessons/ are current and scrubbed of the machine,
and Binder gets the pinned CPU torch. (Each lesson run under papermill: tests/kernel/test_notebooks.py.)
"""
from __future__ import annotations

import os
import re
import sys

import nbformat
import pytest

from support import ROOT
from support.lessons import LESSONS, NOTEBOOK_FILES, NOTEBOOKS, build, executed


def test_every_lesson_is_built_from_its_source_in_order():
    """One way to author: every notebook in notebooks/ has a source in notebooks/src/, 00 and 11 included."""
    assert LESSONS == NOTEBOOK_FILES, (LESSONS, NOTEBOOK_FILES)
    # numbered from 00, none skipped
    assert [name[:2] for name in LESSONS] == [f"{i:02d}" for i in range(len(LESSONS))], LESSONS


RANK_STARTERS = re.compile(r"^%%ddp\s.*$|run_cell_magic\(\s*\"ddp\".*$|nbddp\.run\(.*$", re.M)


@pytest.mark.parametrize("name", NOTEBOOK_FILES)
def test_every_launch_in_a_lesson_has_a_timeout(name):
    """A hang fails the lesson within a minute instead of after CI's 90: every ``%%ddp`` cell,
    ``run_cell_magic("ddp", ...)`` and ``nbddp.run(...)`` in a notebook names a timeout on its line."""
    nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    launches = [m.group(0) for c in nb.cells if c.cell_type == "code" for m in RANK_STARTERS.finditer(c.source)]
    assert launches, "a lesson launches ranks"
    untimed = [line for line in launches if "timeout" not in line]
    assert not untimed, untimed


@pytest.mark.parametrize("name", LESSONS[1:])
def test_an_exercise_has_a_place_to_try_a_folded_solution_and_a_check_that_says_what_is_wrong(name):
    """After the task: a cell the learner fills in (tag ``exercise``), the solution with its source
    hidden until opened (tag ``solution``; papermill runs it, so the lesson stays checked), then a
    check (tag ``check``) whose every assertion says in one line what is still wrong."""
    cells = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4).cells

    def tagged(tag):
        return [i for i, c in enumerate(cells) if tag in c.metadata.get("tags", [])]

    task = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## Exercise")]
    (tried,), solution, (check,) = tagged("exercise"), tagged("solution"), tagged("check")
    assert task and task[0] < tried < min(solution) and max(solution) < check, (task, tried, solution, check)
    assert all(cells[i].metadata.get("jupyter", {}).get("source_hidden") for i in solution), "solutions are folded"
    assert cells[tried].cell_type == "code" and not cells[tried].metadata.get("jupyter"), "the place to try is open"
    asserts = [line for line in cells[check].source.splitlines() if line.lstrip().startswith("assert ")]
    assert asserts and all(re.search(r', f?"✗ ', line) for line in asserts), asserts
    mistakes = build.mistakes(os.path.join(NOTEBOOKS, "src", name[:-6] + ".py"))
    assert mistakes, "a mistake cell in the source: the typical wrong answer, on which the check must fail"
    untimed = [m for _, source, _ in mistakes for m in RANK_STARTERS.findall(source) if "timeout" not in m]
    assert not untimed, untimed


@pytest.mark.parametrize("name", [n for n in LESSONS[1:] if n[:2] != "11"])  # 11: the pool's history is always there
def test_a_check_run_before_any_attempt_says_so_in_one_line(name):
    """Run straight after the lesson's parameters, the check names what to do, not a NameError."""
    cells = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4).cells
    (params,) = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    (check,) = [c for c in cells if "check" in c.metadata.get("tags", [])]
    namespace = {}
    exec(params.source, namespace)
    with pytest.raises(AssertionError, match=r"^✗ nothing to check yet: [^\n]+$"):
        exec(check.source, namespace)


def test_committed_notebooks_are_what_their_sources_build():
    """The sources are the truth: each committed .ipynb is exactly what notebooks/build.py makes of
    its source (no kernel: this is a text comparison)."""
    assert build.stale_notebooks() == [], "run python notebooks/build.py"


@pytest.mark.parametrize("source", build.sources(), ids=os.path.basename)
def test_a_source_is_in_jupytexts_own_form_so_saving_it_from_jupyterlab_changes_nothing(source):
    """Opened in JupyterLab through jupytext and saved, a source comes back byte for byte (no header,
    same blank lines, magics commented as before): edits there make diffs of what changed only."""
    import jupytext
    text = open(source, encoding="utf-8").read()
    assert jupytext.writes(jupytext.reads(text, fmt="py:percent"), fmt="py:percent") == text


def test_cell_ids_are_the_cells_names_so_inserting_a_cell_renumbers_nothing(tmp_path):
    """A cell's id is the name in its source's ``# %% NAME`` line, not its position."""
    source = build.sources()[1]
    before = build.read_lesson(source)
    text = open(source, encoding="utf-8").read()
    first = text.index("# %%", 1)  # insert a cell after the first one
    (tmp_path / "01.py").write_text(text[:first] + "# %% inserted [markdown]\n# A new cell.\n\n" + text[first:])
    after = build.read_lesson(str(tmp_path / "01.py"))
    assert [c.id for c in after.cells] == [before.cells[0].id, "inserted"] + [c.id for c in before.cells[1:]]
    (tmp_path / "02.py").write_text(text[:first] + "# %%\nx = 1\n\n" + text[first:])
    with pytest.raises(ValueError, match="name the cell"):
        build.read_lesson(str(tmp_path / "02.py"))


def test_every_lesson_has_an_executed_copy_of_its_current_cells_without_machine_paths():
    """docs/lessons/ holds each lesson run (outputs GitHub shows), of the cells its source builds today,
    scrubbed of the machine that ran it, and small enough to browse."""
    sizes = 0
    for source in build.sources():
        name = build.notebook_name(source)
        path = os.path.join(executed.DOCS, name)
        assert os.path.exists(path), f"no executed copy of {name}: python notebooks/executed.py {name[:-6]}"
        copy = nbformat.read(path, as_version=4)
        assert [(c.id, c.source) for c in copy.cells] == [(c.id, c.source) for c in build.read_lesson(source).cells], \
            f"docs/lessons/{name} was run from an older source: python notebooks/executed.py {name[:-6]}"
        code = [c for c in copy.cells if c.cell_type == "code"]
        assert all(c.execution_count for c in code) and any(c.outputs for c in code), f"{name}: not executed"
        assert not [o for c in code for o in c.outputs if o.output_type == "error"], f"{name}: an error"
        assert executed.machine_paths(copy) == [], f"{name}: {executed.machine_paths(copy)[:3]}"
        pages = [o.data["text/html"] for c in code for o in c.outputs if "text/html" in o.get("data", {})]
        raw = [m.group(0) for page in pages for m in re.finditer(r"<(?:repo|venv|tmp|host)>[^<\s]*", page)]
        assert not raw, f"{name}: a placeholder a browser drops as a tag: {raw[:3]}"
        sizes += os.path.getsize(path)
    assert sizes < 4 * 2**20, f"the executed lessons take {sizes / 2**20:.1f} MiB"


def test_scrubbing_removes_what_belongs_to_the_machine():
    """A run's folders, the repository's and the interpreter's paths, home, the host name and pids go."""
    import socket
    text = (f"log folder /tmp/pytest-of-ann/pytest-7/test_lesson_runs_clean_and_che3/runs/13 and "
            f"/tmp/nbddp-lessons-x1y2/lesson-04/ckpt.pt; {ROOT}/nbddp/api.py; {sys.prefix}/lib/python3/site-packages/"
            f"torch/x.py; {os.path.expanduser('~')}/.cache; /tmp/nbddp-0/kernel-4242/cell-3; File .nbddp-31337.py; "
            f"on {socket.gethostname()} pid 31337")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "x", outputs=[nbformat.v4.new_output("stream", name="stdout", text=text)])])
    assert len(executed.machine_paths(nb)) >= 5
    clean = executed.scrub(nb).cells[0].outputs[0].text
    assert executed.machine_paths(executed.scrub(nb)) == [], clean
    assert "./runs/13" in clean and "./ckpt.pt" in clean and "<repo>/nbddp/api.py" in clean, clean
    assert "31337" not in clean and "4242" not in clean, clean
    assert len(socket.gethostname()) <= 3 or socket.gethostname() not in clean, clean  # a name as short as "vm" stays
    page = f'<code>{sys.prefix}/lib/x.py</code> and <code>/tmp/nbddp-ab12/launch-1</code>'
    nb.cells[0].outputs = [nbformat.v4.new_output("display_data", data={"text/html": page, "text/plain": page})]
    shown = executed.scrub(nb).cells[0].outputs[0].data
    # in HTML the placeholders are text, not tags a browser drops with the path's start
    assert shown["text/html"] == ("<code>&lt;venv&gt;/lib/x.py</code> and "
                                  "<code>&lt;tmp&gt;/nbddp-XXXX/launch-1</code>"), shown
    assert shown["text/plain"] == "<code><venv>/lib/x.py</code> and <code><tmp>/nbddp-XXXX/launch-1</code>", shown


def _pin(text):
    match = re.search(r"torch==([\d.]+)", text) or re.search(r"^torch_version=([\d.]+)$", text, re.M)
    return match and match.group(1)


# Lessons that need 4 ranks to show what they teach, light enough for Binder's 1-2 cores (so is
# the quickstart, like the demo): a ring of 2 has the same rank on both sides (03), and 2
# simulated nodes of 1 rank each have no local group to tell from the job (07), and a 2-D device
# mesh needs 2 × 2 ranks to have both a row and a column (16).
FOUR_RANKS = ("03", "07", "16")


def test_binder_gets_cpu_torch_of_the_pinned_version_and_two_rank_lessons():
    """binder/ installs the same torch as scripts/setup-venv.sh, from the CPU index, then nbddp
    with the lessons extra; every lesson defaults to 2 ranks (Binder gives 1-2 cores), but the
    few that need 4 to show their point."""
    req = open(os.path.join(ROOT, "binder", "requirements.txt")).read()
    post = os.path.join(ROOT, "binder", "postBuild")
    setup = open(os.path.join(ROOT, "scripts", "setup-venv.sh")).read()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in req
    assert re.search(r"^torch==[\d.]+\+cpu$", req, re.M) and _pin(req) == _pin(setup), (_pin(req), _pin(setup))
    assert os.access(post, os.X_OK) and '-e ".[lessons]"' in open(post).read(), "nbddp with the lessons extra"
    assert [line for line in req.splitlines() if line and not line.startswith(("#", "--"))] == [
        "torch==" + _pin(req) + "+cpu"], "the rest comes from the lessons extra, as on a laptop"
    for name in LESSONS[1:]:  # the quickstart, like the demo, uses 4
        nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
        (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        values = {}
        exec(cell.source, {}, values)
        ranks = values.get("world_size", values.get("nnodes", 1) * values.get("nproc_per_node", 1))
        assert ranks == (4 if name[:2] in FOUR_RANKS else 2), (name, values)
