"""Rich output from inside a rank: ``display(obj)`` (the builtin and ``IPython.display.display``)
and matplotlib's ``plt.show()`` turn the object into a mime bundle and send it to the kernel over
the rank's control pipe as ``(msg.DISPLAY, bundle)`` (nbddp/core/messages.py); the kernel's
views show it in that rank's tab.

Imported in the forkserver with the worker (it imports IPython's display machinery, never CUDA);
``install`` runs once in each rank.
"""
from __future__ import annotations

import base64
import builtins
import io
import sys
import threading
import types
from typing import Any

import IPython.display as _ipython_display
from IPython.core import display as _core_display

from nbddp.core import messages as msg

_display_functions: types.ModuleType
try:
    import IPython.core.display_functions as _display_functions  # IPython 8: display() moved here
except ImportError:  # IPython 7 (Colab's 7.34): it is IPython.core.display's
    _display_functions = _core_display

MAX_BUNDLE_BYTES = 8 << 20  # bigger bundles are replaced by a one-line note

_ctl = None
_lock = threading.Lock()
_formatter = None


def install(ctl) -> None:
    """Route this process's display() calls (and the inline matplotlib backend's) to ``ctl``."""
    global _ctl
    _ctl = ctl
    # the name rebound in each module that holds one; the builtin is IPython's addition (no stub has it)
    builtins.display = display  # type: ignore[attr-defined]
    modules: tuple[Any, ...] = (_ipython_display, _display_functions, _core_display)  # which has it varies
    for module in modules:
        module.display = display
    inline: Any = sys.modules.get("matplotlib_inline.backend_inline")
    if inline is not None:  # imported before this rank started: rebind its module-level name
        inline.display = display


def _format(obj) -> tuple[dict, dict]:
    global _formatter
    figure = _as_figure(obj)
    if figure is not None:
        buf = io.BytesIO()
        figure.savefig(buf, format="png", bbox_inches="tight")
        return ({"image/png": base64.b64encode(buf.getvalue()).decode("ascii"),
                 "text/plain": repr(figure)}, {})
    if _formatter is None:
        from IPython.core.formatters import DisplayFormatter

        _formatter = DisplayFormatter()
    data, metadata = _formatter.format(obj)
    return dict(data), dict(metadata or {})


def _as_figure(obj):
    if "matplotlib" not in sys.modules:
        return None
    try:
        from matplotlib.figure import Figure
    except Exception:
        return None
    return obj if isinstance(obj, Figure) else None


def bundle_of(obj, raw: bool = False) -> dict:
    """The mime bundle ``display(obj)`` sends (``raw``: obj already is a bundle)."""
    if raw and isinstance(obj, dict):
        data = {str(k): v for k, v in obj.items()}
    else:
        data, _ = _format(obj)
    for key, value in list(data.items()):
        if isinstance(value, bytes):  # raw PNG bytes from a _repr_png_: base64 as in a notebook
            data[key] = base64.b64encode(value).decode("ascii")
        elif not isinstance(value, (str, dict, list)):
            data[key] = str(value)
    size = sum(len(v) if isinstance(v, str) else 0 for v in data.values())
    if size > MAX_BUNDLE_BYTES:
        data = {"text/plain": f"<display output of {size} bytes not shown: over nbddp's "
                              f"{MAX_BUNDLE_BYTES >> 20} MB limit>"}
    return data


def send_bundle(data: dict) -> bool:
    ctl = _ctl
    if ctl is None:
        return False
    try:
        with _lock:
            ctl.send((msg.DISPLAY, data))
        return True
    except (OSError, EOFError, ValueError):
        return False


def display(*objs, include=None, exclude=None, metadata=None, transient=None, display_id=None,
            raw=False, clear=False, **kwargs):
    """IPython's ``display`` for a rank: each object goes to the kernel as a mime bundle."""
    for obj in objs:
        try:
            data = bundle_of(obj, raw=raw)
        except Exception as exc:  # a broken _repr_*_: show what we can, as IPython would
            data = {"text/plain": f"<display failed: {type(exc).__name__}: {exc}>"}
        if include:
            data = {k: v for k, v in data.items() if k in include} or data
        if exclude:
            data = {k: v for k, v in data.items() if k not in exclude} or data
        if not send_bundle(data):
            print(data.get("text/plain", repr(obj)))
    return None
