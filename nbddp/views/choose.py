"""Choosing how a launch is shown: widgets where a widget front end is connected, else text.

``--output widgets``: the live ipywidgets view (nbddp/views/widgetview.py), whose displayed bundle
also carries the static transcript. ``--output text``: ``[rankN]:`` prefixed lines as they
arrive, and, in a Jupyter kernel, a text/plain + text/html transcript at the end (so a
papermill-run notebook keeps a per-rank transcript). ``--output auto`` decides per cell with
``widget_frontend``.
"""
from __future__ import annotations

import os
from dataclasses import replace

from nbddp.core.sink import Sink
from nbddp.views import transcript
from nbddp.views.textview import KERNEL_WINDOW, TextView

# execute_request metadata that JupyterLab (and Notebook 7, built on it) send with every cell;
# plain jupyter_client, nbclient and papermill send only "cellId" or nothing.
_JUPYTERLAB_KEYS = ("deletedCells", "recordTiming")


def _parent_metadata(shell) -> dict:
    kernel = getattr(shell, "kernel", None)
    parent = None
    if kernel is not None and hasattr(kernel, "get_parent"):
        try:
            parent = kernel.get_parent("shell")
        except Exception:
            parent = None
    if not parent:
        parent = getattr(shell, "parent_header", None) or {}
    return parent.get("metadata") or {}


def widget_frontend(shell) -> bool:
    """Is a front end that renders ipywidgets attached to this cell's execution?

    Evidence, in order: ``NBDDP_OUTPUT`` in the kernel's environment (widgets/text); no Jupyter
    kernel (terminal IPython, plain Python) → no; ipywidgets missing → no; a front end opened
    ipywidgets' ``jupyter.widget.control`` comm in this kernel (ipywidgets 8 managers do) → yes;
    the cell came from JupyterLab / Notebook 7 (their execute_request metadata) → yes; else no
    (jupyter_client, nbclient, papermill: they would save widgets nobody saw live).
    """
    forced = os.environ.get("NBDDP_OUTPUT", "").strip().lower()
    if forced in ("widgets", "text"):
        return forced == "widgets"
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    try:
        from ipywidgets.widgets.widget import Widget
    except Exception:
        return False
    if getattr(Widget, "_control_comm", None) is not None:
        return True
    metadata = _parent_metadata(shell)
    return any(key in metadata for key in _JUPYTERLAB_KEYS)


def output_mode(spec, shell=None) -> str:
    if spec.output != "auto":
        return spec.output
    return "widgets" if widget_frontend(shell) else "text"


class TranscriptView(Sink):
    """Text mode's companion in a Jupyter kernel: rich output from the ranks as it arrives, and
    the static per-rank transcript (text/plain + text/html) once the launch has ended."""

    def __init__(self, spec, publish=None):
        from IPython.display import display

        self.spec = spec
        self.c = transcript.Collector(spec, tail_lines=transcript.TRANSCRIPT_LINES, all_lines=1)
        self._publish = publish or display

    def launch_started(self, result, spec, backend):
        self.c.launch_started(result, spec, backend)

    def output(self, rank, stream, data):
        self.c.output(rank, stream, data)

    def display(self, rank, bundle):
        if self.c.display(rank, bundle):
            self._publish(bundle, raw=True, metadata={"nbddp": {"rank": rank}})

    def note(self, text):
        self.c.note(text)

    def rank_exited(self, rank_result):
        self.c.rank_exited(rank_result)

    def launch_finished(self, result):
        self.c.launch_finished(result)
        # the lines were streamed above as they came: here each rank's section starts folded
        self._publish(transcript.bundle(self.c, streamed=True), raw=True,
                      metadata={"nbddp": {"transcript": True}})


def same_lines(spec) -> str:
    """``--same-lines``, or where the line did not say: ``NBDDP_SAME_LINES`` in the kernel's
    environment (merge|apart), else merge (a line every rank printed, said once)."""
    if spec.same_lines:
        return spec.same_lines
    forced = os.environ.get("NBDDP_SAME_LINES", "").strip().lower()
    return forced if forced in ("merge", "apart") else "merge"


def make_sinks(spec, shell=None) -> list:
    spec = replace(spec, same_lines=same_lines(spec))
    mode = output_mode(spec, shell)
    in_kernel = shell is not None and getattr(shell, "kernel", None) is not None
    if mode == "widgets":
        from nbddp.views.widgetview import WidgetView

        return [WidgetView(spec)]
    if in_kernel:
        # the transcript's display flushes the kernel's streams first (ipykernel does, to keep
        # them in order), so the text view's own flush, a wait on the IO thread, is not needed
        return [TextView(spec, flush=False, window=KERNEL_WINDOW), TranscriptView(spec)]
    return [TextView(spec)]
