"""Choosing how a launch is shown: widgets where a widget front end is connected, else text.

``--output widgets``: the live ipywidgets view (nbddp/views/widgetview.py), whose displayed bundle
also carries the static transcript. ``--output text``: ``[rankN]:`` prefixed lines as they
arrive, and, in a Jupyter kernel, a text/plain + text/html status at the end (each rank's state
and cause; the lines are above, so a papermill-run notebook keeps each line once). ``--output auto`` decides per cell
from what the kernel has seen of the front end (nbddp/core/frontends.py): widgets where it renders them, else text with
one line saying why (once per kernel).
"""
from __future__ import annotations

from dataclasses import replace

from nbddp.core import frontends, settings
from nbddp.core.sink import Sink
from nbddp.kernel import frontend_probe
from nbddp.views import transcript
from nbddp.views.textview import KERNEL_WINDOW, TextView

_said: set[str] = set()  # why-lines already shown in this kernel (each once; --output widgets's every time)


def choice(spec, shell=None) -> frontends.Choice:
    """The view for this cell (nbddp/core/frontends.py), from what the kernel has seen of the
    front end that sent it (nbddp/kernel/frontend_probe.py)."""
    made = frontends.choose(frontend_probe.evidence(shell), spec.output)
    frontend_probe.probe(shell)  # the next cell's evidence, for a front end not asked yet
    return made


class TranscriptView(Sink):
    """Text mode's companion in a Jupyter kernel: rich output from the ranks as it arrives, and
    the static status (text/plain + text/html) once the launch has ended."""

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
        # the lines were streamed above as they came: the status alone here, each line once
        self._publish(transcript.bundle(self.c, streamed=True), raw=True,
                      metadata={"nbddp": {"transcript": True}})


def same_lines(spec) -> str:
    """``--same-lines``, or where the line did not say: ``NBDDP_SAME_LINES`` in the kernel's
    environment (merge|apart), else merge (a line every rank printed, said once)."""
    if spec.same_lines:
        return spec.same_lines
    return str(settings.read(settings.SAME_LINES))


def make_sinks(spec, shell=None) -> list:
    spec = replace(spec, same_lines=same_lines(spec))
    made = choice(spec, shell)
    mode = made.view
    in_kernel = shell is not None and getattr(shell, "kernel", None) is not None
    if made.why and (spec.output == "widgets" or made.why not in _said):
        _said.add(made.why)
        print(made.why, flush=True)
    if mode == "widgets":
        from nbddp.views.widgetview import WidgetView

        return [WidgetView(spec)]
    if in_kernel:
        # the transcript's display flushes the kernel's streams first (ipykernel does, to keep
        # them in order), so the text view's own flush, a wait on the IO thread, is not needed
        return [TextView(spec, flush=False, window=KERNEL_WINDOW if made.paced else None), TranscriptView(spec)]
    return [TextView(spec)]
