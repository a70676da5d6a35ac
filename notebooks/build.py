"""Build the lesson notebooks notebooks/NN_name.ipynb from their sources notebooks/src/NN_name.py.

    python notebooks/build.py            # writes every notebooks/NN_*.ipynb (unexecuted)
    python notebooks/build.py --check    # exits 1, naming them, when a committed notebook differs

A source is a jupytext "percent" script: a cell starts at ``# %% NAME`` (``# %% NAME [markdown]``
for prose, whose lines are ``# ``-commented), tags follow as ``tags=["parameters"]``, and magics
are commented (``# %%ddp -n 2``) so the file stays valid Python. Every cell has a NAME (letters,
digits, ``-``, ``_``; unique in the lesson): it becomes the cell's id, so inserting a cell changes
no other cell's id. The build hides the source of every ``solution`` cell (``jupyter.source_hidden``,
as JupyterLab and Notebook 7 show it: a bar to click open); papermill still runs it.

A cell tagged ``mistake`` is what a learner typically types wrong in the exercise cell, and its last
line, ``# expect: REGEX``, what the check must then say (its ``✗`` message matches REGEX). It stays out
of the notebook learners get; the lesson runner (notebooks/lessonrun.py) tries it, and the exercise left
as given, against the check, which must fail on both.

jupytext reads the sources (the ``test`` extra has it), so an author can also open a source in
JupyterLab as a notebook (right-click, Open With > Jupytext Notebook) and save edits into it.
"""
from __future__ import annotations

import glob
import os
import re
import sys

import jupytext
import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = os.path.join(HERE, "src")
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def sources(folder: str = SOURCES) -> list[str]:
    """The lesson sources, in lesson order."""
    return sorted(glob.glob(os.path.join(folder, "[0-9][0-9]_*.py")))


def notebook_name(source: str) -> str:
    return os.path.basename(source)[:-3] + ".ipynb"


def _named_cells(source: str) -> list[nbformat.NotebookNode]:
    """Every cell of a source, its name as its id; a cell without a valid, unique name is an error."""
    text = jupytext.reads(open(source, encoding="utf-8").read(), fmt="py:percent")
    seen, cells = set(), []
    for i, cell in enumerate(text.cells):
        name = cell.metadata.pop("title", "")
        where = f"{os.path.basename(source)}, cell {i + 1} ({cell.source.strip()[:40]!r})"
        if not NAME.fullmatch(name):
            raise ValueError(f"{where}: name the cell after '# %%' (letters, digits, - and _), got {name!r}")
        if name in seen:
            raise ValueError(f"{where}: the name {name!r} is already used in this lesson")
        seen.add(name)
        make = nbformat.v4.new_markdown_cell if cell.cell_type == "markdown" else nbformat.v4.new_code_cell
        built = make(cell.source, id=name)
        tags = cell.metadata.get("tags", [])
        if tags:
            built.metadata["tags"] = list(tags)
        if "solution" in tags:
            built.metadata["jupyter"] = {"source_hidden": True}
        cells.append(built)
    return cells


def read_lesson(source: str) -> nbformat.NotebookNode:
    """One source as the notebook it builds to (its ``mistake`` cells left out)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata.update(kernelspec=dict(KERNELSPEC), language_info={"name": "python"})
    nb.cells = [c for c in _named_cells(source) if "mistake" not in c.metadata.get("tags", [])]
    nbformat.validate(nb)
    return nb


EXPECT = re.compile(r"\n# expect: (.+)\Z")


def mistakes(source: str) -> list[tuple[str, str, str]]:
    """The lesson's typical wrong answers: (cell name, cell source, the regex its ✗ message must match)."""
    found = []
    for cell in _named_cells(source):
        if "mistake" in cell.metadata.get("tags", []):
            expect = EXPECT.search(cell.source.rstrip())
            if cell.cell_type != "code" or not expect:
                raise ValueError(f"{os.path.basename(source)}, cell {cell.id}: a mistake is a code cell whose "
                                 "last line is '# expect: REGEX' (what the check's ✗ message then says)")
            found.append((cell.id, cell.source, expect.group(1).strip()))
    return found


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def stale_notebooks(folder: str = HERE) -> list[str]:
    """The notebooks in ``folder`` that differ from what their source builds (or are missing)."""
    stale = []
    for source in sources(os.path.join(folder, "src")):
        path = os.path.join(folder, notebook_name(source))
        if not os.path.exists(path) or open(path, encoding="utf-8").read() != render(read_lesson(source)):
            stale.append(notebook_name(source))
    return stale


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = stale_notebooks()
        if stale:
            print("out of date (run python notebooks/build.py):", ", ".join(stale))
        return 1 if stale else 0
    for source in sources():
        path = os.path.join(HERE, notebook_name(source))
        with open(path, "w", encoding="utf-8") as f:
            f.write(render(read_lesson(source)))
        print("wrote", os.path.relpath(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
