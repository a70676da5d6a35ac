"""What this kernel has seen of each front end, per front-end session (the ``session`` of the
messages a browser tab, VS Code window or client sends), for nbddp/core/frontends.py to choose a
view from: whether it answered the small ipywidgets probe the kernel opens once per widget-front-
end session with ``comm_close`` (no widget manager), whether it opened ipywidgets'
``jupyter.widget.control`` comm (recorded per session, not kernel-wide as ipywidgets keeps it),
and whether it drew the probe's two ``jslink``-ed widgets and sent the linked value back. Probes
stay open, so a late answer still counts; a "Run all" sends its cells before any answer, so the
cell right after ``%load_ext`` may be chosen from the metadata alone."""
from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from nbddp.core import settings
from nbddp.core.frontends import WIDGETS_MAJOR, Evidence, SendClock, front_end_name, ignored, major

CONTROL_TARGET = "jupyter.widget.control"

closed_sessions: set[str] = set()  # sessions that closed a probe: no widget manager there
control_sessions: set[str] = set()  # sessions whose widget manager opened the control comm
drawn_sessions: set[str] = set()  # sessions whose widget manager drew the linked probe
_probed_sessions: dict[str, float] = {}  # session -> when its probe went out (time.time())
_clock = SendClock()
PROBE_VALUE = "nbddp-probe"
_probes: list = []  # the probe widgets, kept so their comms live


def _parent(shell) -> dict:
    kernel = getattr(shell, "kernel", None)
    parent = None
    if kernel is not None and hasattr(kernel, "get_parent"):
        try:
            parent = kernel.get_parent("shell")
        except Exception:
            parent = None
    return parent or getattr(shell, "parent_header", None) or {}


def _session_of(msg) -> str:
    return ((msg or {}).get("header") or {}).get("session", "")


def ipywidgets_version() -> str | None:
    try:
        import ipywidgets
    except Exception:
        return None
    return getattr(ipywidgets, "__version__", "0")


def _comm_managers(shell):
    """The comm managers ipywidgets may have registered its targets with (ipykernel < 6.22 has
    its own; later ones and ipywidgets 8 use the ``comm`` package's)."""
    found: list[Any] = []
    try:
        import comm

        found.append(comm.get_comm_manager())
    except Exception:
        pass
    kernel = getattr(shell, "kernel", None)
    found.append(getattr(kernel, "comm_manager", None))
    return [m for m in found if m is not None and hasattr(m, "targets")]


def _watch_control_comm(shell) -> None:
    """Wrap ipywidgets' handler for the control comm so its opener's session is recorded."""
    for manager in _comm_managers(shell):
        handler = manager.targets.get(CONTROL_TARGET)
        if handler is None or getattr(handler, "_nbddp", False):
            continue

        def recording(comm, msg, _handler=handler):
            session = _session_of(msg)
            if session:
                control_sessions.add(session)
                closed_sessions.discard(session)
            return _handler(comm, msg)

        recording._nbddp = True  # type: ignore[attr-defined]  # marks nbddp's handler (never installed twice)
        manager.targets[CONTROL_TARGET] = recording


def _header_time(msg) -> float | None:
    """The front end's clock in a message's header (a datetime from ipykernel's session, or the
    ISO text some clients send), as seconds since the epoch; None where there is none."""
    date = ((msg or {}).get("header") or {}).get("date")
    if isinstance(date, str):
        try:
            date = datetime.fromisoformat(date.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(date, datetime) or date.tzinfo is None:
        return None
    return date.timestamp()


def evidence(shell) -> Evidence:
    """What is known about the front end that sent the running cell."""
    forced = str(settings.read(settings.OUTPUT))
    if shell is None or getattr(shell, "kernel", None) is None:
        return Evidence(forced=forced, in_kernel=False)
    version = ipywidgets_version()
    if version is not None:
        _watch_control_comm(shell)
    parent = _parent(shell)
    session = _session_of(parent)
    sent = _clock.sent_at(session, _header_time(parent), time.time()) if session else None
    return Evidence(forced=forced, ipywidgets=version, metadata=parent.get("metadata") or {},
                    closed_probe=session in closed_sessions, opened_control=session in control_sessions,
                    drew_probe=session in drawn_sessions,
                    ignored_probe=ignored(_probed_sessions.get(session), sent))


def probe(shell) -> None:
    """Open a probe for a session not yet asked whose cells name a widget front end or whose
    widget manager opened the control comm (never for nbclient or papermill: their saved
    notebook would keep its models)."""
    if shell is None or getattr(shell, "kernel", None) is None:
        return
    if major(ipywidgets_version() or "0") < WIDGETS_MAJOR:
        return
    parent = _parent(shell)
    session = _session_of(parent)
    if not session or session in _probed_sessions:
        return
    if not (front_end_name(parent.get("metadata")) or session in control_sessions):
        return
    _clock.sent_at(session, _header_time(parent), time.time())  # this cell's offset, for the next
    _watch_control_comm(shell)
    from ipywidgets import Widget

    widget = Widget()
    comm = getattr(widget, "comm", None)
    if comm is None:
        return

    def closed(msg):
        answered = _session_of(msg)
        if answered and answered not in control_sessions:
            closed_sessions.add(answered)

    comm.on_close(closed)
    _probes.append(widget)
    _probes.extend(_linked_probe())
    _probed_sessions[session] = time.time()


def _linked_probe() -> list:
    """Two ipywidgets 8 HTML widgets joined by jslink: a manager that builds them sets the second
    to the first's value and sends it back; the session of each such message drew them. HTML, as
    the live view's panes: its style is an HTMLStyle model, which ipywidgets 7 has not. (Two
    IntTexts are drawn by classic Notebook 6's ipywidgets 7 manager, which loads the controls it
    bundles whatever version a model asks for, and then cannot draw the live view: tried there.)"""
    import ipywidgets as W

    source, target = W.HTML(value=PROBE_VALUE), W.HTML(value="")
    link = W.jslink((source, "value"), (target, "value"))
    comm = getattr(target, "comm", None)
    if comm is None:
        return [source, target, link]

    def answered(msg, _handle=target._handle_msg):
        data = (msg.get("content") or {}).get("data") or {}
        session = _session_of(msg)
        if session and data.get("method") == "update" and (data.get("state") or {}).get("value") == PROBE_VALUE:
            drawn_sessions.add(session)
        return _handle(msg)

    comm.on_msg(answered)
    return [source, target, link]
