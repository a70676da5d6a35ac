"""Which view a front end can show, from what the kernel knows about it (pure: no kernel, no comms).

The protocol names neither the front end nor its ipywidgets version (7.7+ and 8 managers open the
same ``jupyter.widget.control`` comm), so the choice rests on what nbddp/kernel/frontend_probe.py
gathers per front-end session (``Evidence``): the kernel's own ipywidgets (the view needs 8); a
closed probe widget (no widget manager) or an opened control comm (one); the probe's two
``jslink``-ed widgets drawn, or not within ANSWER_WINDOW_S (an ipywidgets 7 manager); and the
execute_request's metadata (JupyterLab, Notebook 7, VS Code mark it; nbclient and papermill: text)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

JUPYTERLAB_KEYS = ("deletedCells", "recordTiming")
VSCODE_CELL_PREFIX = "vscode-notebook-cell:"
WIDGETS_MAJOR = 8  # nbddp/views/widgetview.py uses ipywidgets 8's models (HTMLStyle, Tab titles)
ANSWER_WINDOW_S = 5.0  # a manager that can draw the probe answers well within this (a page's
# first widget loads ipywidgets' controls bundle; a remote server adds its round trips)


@dataclass(frozen=True)
class Evidence:
    """What the kernel knows about the front end that sent this cell."""

    forced: str = ""  # NBDDP_OUTPUT=widgets|text in the kernel's environment
    in_kernel: bool = True  # a Jupyter kernel (not terminal IPython or plain Python)
    ipywidgets: str | None = None  # the kernel's ipywidgets version; None: not installed
    closed_probe: bool = False  # this session closed nbddp's widget: it has no widget manager
    opened_control: bool = False  # this session opened ipywidgets' control comm: it has one
    drew_probe: bool = False  # this session's manager drew nbddp's linked probe: it renders ipywidgets 8
    ignored_probe: bool = False  # it had ANSWER_WINDOW_S to draw the probe and did not
    metadata: dict[str, Any] | None = None  # the execute_request's metadata


@dataclass(frozen=True)
class Choice:
    view: str  # "widgets" or "text"
    why: str = ""  # one line for the user when a widget front end gets text; "" says nothing
    paced: bool = False  # output kept under a notebook server's rate limits (behind_a_server)


def front_end_name(metadata: dict[str, Any] | None) -> str:
    """JupyterLab (Notebook 7 is built on it), VS Code, or "" for a client that names nothing."""
    metadata = metadata or {}
    if str(metadata.get("cellId", "")).startswith(VSCODE_CELL_PREFIX):
        return "VS Code"
    if any(key in metadata for key in JUPYTERLAB_KEYS):
        return "JupyterLab"
    return ""


def major(version: str) -> int:
    """The major number of a version string (0 when it has none)."""
    try:
        return int(version.split(".", 1)[0])
    except ValueError:
        return 0


def renders_widgets_here(evidence: Evidence) -> str:
    """Why nbddp's live widget view cannot show for this cell; "" when nothing says it cannot."""
    if not evidence.in_kernel:
        return "not in a Jupyter kernel"
    if evidence.ipywidgets is None:
        return ("ipywidgets is not installed in this kernel; `pip install \"ipywidgets>=8\"` "
                "gives the live widget view")
    if major(evidence.ipywidgets) < WIDGETS_MAJOR:
        return (f"the live widget view needs ipywidgets {WIDGETS_MAJOR} and this kernel has "
                f"{evidence.ipywidgets} (Colab pins 7: keep its pin, upgrading it breaks "
                f"Colab's runtime)")
    if evidence.drew_probe:
        return ""
    if evidence.closed_probe and not evidence.opened_control:
        # JupyterLab closes a comm whose target has no handler, or whose handler failed: no
        # widgets front end, or ipywidgets 7's (JupyterLab 3.6 with jupyterlab_widgets 1.1.11,
        # tried in a browser), which cannot load ipywidgets 8's models
        return ("this front end cannot render ipywidgets 8 (it closed the widget nbddp opened): "
                "install `jupyterlab_widgets>=3` where JupyterLab or Notebook runs (`pip install "
                "\"jupyterlab_widgets>=3\"` on the server; JupyterLab 3's 1.x cannot draw ipywidgets 8) "
                "and reload the page")
    # judged where a manager is known to be there (it opened the control comm; JupyterLab and
    # Notebook 7 load one with every notebook): VS Code draws widgets only once one is displayed
    if evidence.ignored_probe and (evidence.opened_control or front_end_name(evidence.metadata) == "JupyterLab"):
        return ("this front end's widget manager did not draw ipywidgets 8's widgets (it is ipywidgets "
                "7's: JupyterLab 3, or Notebook 6 with widgetsnbextension 3): install ipywidgets 8's "
                "front end where the server runs (`pip install \"jupyterlab_widgets>=3\"` for JupyterLab, "
                "`pip install \"widgetsnbextension>=4\"` for Notebook) and reload the page")
    return ""


class SendClock:
    """When a front end sent a cell, in the kernel's clock (pure: times are passed in).

    A cell's header carries the front end's own clock, which may be off from the kernel's by any
    amount. A cell that was not queued starts a few milliseconds after it was sent, so the
    smallest (start - sent) seen from a front end is its offset plus a transit; a queued cell (Run
    All) shows a larger one, and its send time comes out as early as it was."""

    def __init__(self) -> None:
        self._offset: dict[str, float] = {}

    def sent_at(self, session: str, header_time: float | None, started: float) -> float | None:
        """The kernel time at which ``session`` sent the cell that started at ``started``;
        None where its header has no time."""
        if header_time is None:
            return None
        offset = min(self._offset.get(session, started - header_time), started - header_time)
        self._offset[session] = offset
        return header_time + offset


def ignored(probe_sent: float | None, cell_sent: float | None, window: float = ANSWER_WINDOW_S) -> bool:
    """Had a front end ``window`` seconds to answer the probe sent at ``probe_sent`` before it
    sent this cell (at ``cell_sent``, both kernel times)? Unknown times say no."""
    return probe_sent is not None and cell_sent is not None and cell_sent - probe_sent > window


def behind_a_server(evidence: Evidence) -> bool:
    """Does this cell's output reach its front end through a notebook server, which drops a
    kernel's output above its iopub rate limits? Yes for a front end that names itself
    (JupyterLab, Notebook 7, VS Code: it may be a remote server) or runs a widget manager; no for
    headless clients (papermill, nbclient, jupyter_client), which read the kernel's sockets
    themselves, with no limit, and should get every line."""
    return evidence.in_kernel and bool(front_end_name(evidence.metadata) or evidence.opened_control)


def choose(evidence: Evidence, asked: str = "auto") -> Choice:
    """The view for one cell (``asked`` is ``--output``: auto, widgets or text), paced where a
    server is between the kernel and the front end."""
    return replace(_view(evidence, asked), paced=behind_a_server(evidence))


def _view(evidence: Evidence, asked: str) -> Choice:
    if asked == "text":
        return Choice("text")
    cannot = renders_widgets_here(evidence)
    if asked == "widgets":
        if cannot and evidence.in_kernel:
            return Choice("text", f"nbddp: --output widgets cannot show here: {cannot}; showing text")
        return Choice("widgets")
    if evidence.forced in ("widgets", "text"):
        return _view(evidence, evidence.forced)
    if not evidence.in_kernel:
        return Choice("text")
    if cannot:
        return Choice("text", f"nbddp: text view: {cannot}")
    if evidence.drew_probe or evidence.opened_control or front_end_name(evidence.metadata):
        return Choice("widgets")
    return Choice("text")
