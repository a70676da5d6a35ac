"""Run a lesson under papermill and prove its exercise check can fail.

A check that passes whatever the learner typed teaches nothing. So right after the lesson's
``exercise`` cell has run, before its folded solution, this runner tries the ``check`` cell twice
over, in the lesson's own kernel and namespace:

- on the exercise as given (the learner has not tried yet): the check must fail with a ``✗`` line;
- after each of the lesson's ``mistake`` cells (notebooks/build.py: the typical wrong answer, with
  ``# expect: REGEX`` as its last line): the check must fail with a ``✗`` line matching REGEX.

Each try runs on a copy of the namespace (saved before, put back after, so the real lesson goes on
as if nothing ran), is left out of the kernel's history, and writes nothing into the notebook. The
outcome is in the executed notebook's metadata (``nbddp.exercise_probes``); ``failures`` names each
try whose check did not fail as it must. The lesson itself still runs under papermill, as a reader's.
"""
from __future__ import annotations

import re

import nbformat
from nbclient.exceptions import CellExecutionError
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, papermill_engines
from traitlets import List

ENGINE = "nbddp-lesson"
IOPUB_TIMEOUT_S = 30
SAVE = "__nbddp_probe_saved__ = dict(get_ipython().user_ns)"
# The arguments are read before the call, so the saved dict survives its own name's removal.
RESTORE = ("(lambda ns, saved: ([ns.pop(k) for k in list(ns) if k not in saved], ns.update(saved)))"
           "(get_ipython().user_ns, __nbddp_probe_saved__)")


def _tagged(nb: nbformat.NotebookNode, tag: str) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if tag in c.metadata.get("tags", [])]


def _error(cell: nbformat.NotebookNode) -> str | None:
    """'Name: message' of the error a probe cell raised, or None when it ran clean."""
    for output in cell.get("outputs", []):
        if output.output_type == "error":
            return f"{output.ename}: {output.evalue}"
    return None


class LessonClient(PapermillNotebookClient):
    """papermill's client, with the exercise probes run after the ``exercise`` cell."""

    mistakes = List(help="(name, source, expect) of the lesson's typical wrong answers").tag(config=True)

    def papermill_execute_cells(self):
        exercise, check = _tagged(self.nb, "exercise"), _tagged(self.nb, "check")
        self._exercise = self.nb.cells[exercise[0]] if len(exercise) == 1 and len(check) == 1 else None
        if self._exercise is not None:  # (the quickstart has nothing to probe)
            self._check_source = self.nb.cells[check[0]].source
            self.probes: list[dict] = []
            self.nb.metadata.setdefault("nbddp", {})["exercise_probes"] = self.probes
        super().papermill_execute_cells()

    def execute_cell(self, cell, cell_index, *args, **kwargs):
        done = super().execute_cell(cell, cell_index, *args, **kwargs)
        if cell is getattr(self, "_exercise", None):  # it ran: the probes, before the solution
            self._probe("the exercise as given", None, r"")
            for name, source, expect in self.mistakes:
                self._probe(name, source, expect)
        return done

    def _run_aside(self, source: str) -> nbformat.NotebookNode:
        """One cell run in the kernel, outside the notebook and its history (its displays land in a
        scratch notebook, so an update to one of them cannot reach a real cell's outputs)."""
        cell = nbformat.v4.new_code_cell(source)
        real, real_ids = self.nb, self._display_id_map
        self.nb, self._display_id_map = nbformat.v4.new_notebook(cells=[cell]), {}
        try:
            self.execute_cell(cell, 0, store_history=False)
        except CellExecutionError:
            pass  # the error is in the cell's outputs
        finally:
            self.nb, self._display_id_map = real, real_ids
        return cell

    def _probe(self, name: str, source: str | None, expect: str) -> None:
        self._run_aside(SAVE)
        try:
            attempt = _error(self._run_aside(source)) if source is not None else None
            said = _error(self._run_aside(self._check_source))
        finally:
            restored = self._run_aside(RESTORE)
        if _error(restored):
            raise RuntimeError(f"could not restore the lesson's namespace after {name!r}: {_error(restored)}")
        self.probes.append({"probe": name, "expect": expect, "attempt_error": attempt, "check_said": said})


def failures(nb: nbformat.NotebookNode) -> list[str]:
    """Each probe whose check did not fail with a ``✗`` line matching its expectation."""
    wrong = []
    for p in nb.metadata.get("nbddp", {}).get("exercise_probes", []):
        said = p["check_said"] or ""
        message = said.split(": ", 1)[1] if said.startswith("AssertionError: ") else None
        if message is None or not message.startswith("✗") or not re.search(p["expect"], message):
            wrong.append(f"{p['probe']}: the check {'passed' if not said else 'said ' + repr(said[:300])}"
                         f", where it must fail with a ✗ line matching {p['expect']!r}"
                         + (f" (the attempt itself raised {p['attempt_error'][:200]!r})" if p["attempt_error"] else ""))
    return wrong


class LessonEngine(NBClientEngine):
    """papermill's nbclient engine, running the lesson with :class:`LessonClient`."""

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None,
                                 stderr_file=None, start_timeout=60, execution_timeout=None, **kwargs):
        kwargs.pop("input_path", None)
        # nbclient waits IOPUB_TIMEOUT_S for a cell's output after its reply (4 s by default, and
        # papermill makes a miss an error): on a loaded 2-core CI machine a probe cell's idle came later
        kwargs.setdefault("iopub_timeout", IOPUB_TIMEOUT_S)
        return LessonClient(nb_man, timeout=execution_timeout, startup_timeout=start_timeout,
                            kernel_name=kernel_name, log_output=log_output, stdout_file=stdout_file,
                            stderr_file=stderr_file, **kwargs).execute()


papermill_engines.register(ENGINE, LessonEngine)
