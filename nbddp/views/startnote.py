"""The notebook's side of the forkserver's start: a line in the running cell while a new forkserver
imports torch (the first cell only), emptied once it has forked the ranks or the cell ends, and
the IPython hooks that hold the first cell after ``%load_ext`` until the warm-up
(nbddp/forkserver/storehost.py's ``warm_up``) holds the store host's lock, so the cell waits for
that host rather than starting its own. The extension (nbddp/__init__.py) gives one to the starter
(``show``/``clear``) and to IPython (``wait_for_torch`` before each cell, ``clear`` after): the
starter itself knows nothing of notebooks."""
from __future__ import annotations

import threading

FIRST_CELL_STATUS = "nbddp: starting ranks: importing torch, first cell only"
OTHER_CELL_STATUS = "nbddp: waiting for torch to finish importing (first cell after %load_ext only)"


class StartNote:
    """The status line of one kernel; ``torch_ready`` is set once the warm-up has asked for the
    forkserver and holds the store host's lock (nbddp/forkserver/storehost.py: warm_up)."""

    def __init__(self, torch_ready: threading.Event):
        self.torch_ready = torch_ready
        self._status = None  # the display saying so, until the forkserver has forked (or the cell ends)

    def wait_for_torch(self, info=None, *_args) -> None:
        """(pre_run_cell) Block until the warm-up has asked for the forkserver (a moment; the
        launch then waits for the store host, showing this line too); at once after. While it
        waits, the cell says why. The stop button while it waits ends the wait only (the cell
        then runs as it would have)."""
        if self.torch_ready.is_set():
            return
        cell = getattr(info, "raw_cell", "") or ""
        self.show(FIRST_CELL_STATUS if cell.lstrip().startswith("%%ddp") else OTHER_CELL_STATUS)
        try:
            self.torch_ready.wait()
        except KeyboardInterrupt:
            pass

    def show(self, text: str = FIRST_CELL_STATUS) -> None:
        """Show ``text`` in the running cell until ``clear`` (only in a Jupyter kernel, from its
        main thread: a background start of spares shows nothing)."""
        if self._status is not None or threading.current_thread() is not threading.main_thread():
            return
        try:
            from IPython import get_ipython
            from IPython.display import display

            if getattr(get_ipython(), "kernel", None) is not None:
                self._status = display({"text/plain": text}, raw=True, display_id=True)
        except Exception:
            self._status = None

    def clear(self, *_args) -> None:
        """Empty the status line (a post_run_cell hook too, for a cell that ended first)."""
        status, self._status = self._status, None
        if status is not None:
            try:
                status.update({"text/plain": ""}, raw=True)
            except Exception:
                pass
