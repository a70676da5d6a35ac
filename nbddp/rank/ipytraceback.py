"""Inside a rank: its traceback as IPython shows one in a plain cell (the cell's lines around the
failing one, ``---->``, the kernel's colours, ``Cell In[3], line 7``), where the cell came from a
notebook (``theme``: the kernel's colour theme). IPython's own formatter is imported only when a
rank fails; outside a notebook, or if it fails, the caller prints Python's plain traceback."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import types

from nbddp.core.cellnames import name_cell_ipython

CONTEXT = 5  # lines of the cell shown around the failing one, as IPython's Context mode shows


@contextlib.contextmanager
def deferred_sigterm():
    """A SIGTERM that comes while the failure is formatted and reported (IPython's import takes a
    moment; a launcher stopping the other ranks sends it) takes effect after: the rank's own
    error is what it reports. The handler only notes the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if came:
            os.kill(os.getpid(), signal.SIGTERM)


def format_exception(exc: BaseException, tb, *, cell_path: str, label: str | None, theme: str | None,
                     skip_file: str) -> str | None:
    """``exc`` with traceback ``tb`` (``skip_file``'s own frames left out) as IPython would show
    it in the kernel whose theme is ``theme``; None without a theme or IPython's formatter."""
    if not theme:
        return None
    try:
        from IPython.core import ultratb
        from IPython.utils.path import compress_user

        formatter = ultratb.AutoFormattedTB(mode="Context", theme_name=theme, tb_offset=0)
        lines = formatter.structured_traceback(type(exc), exc, _without(tb, skip_file), context=CONTEXT)
        text = formatter.stb2text(lines)
    except Exception:  # an IPython without this API, or a theme it does not know
        return None
    return name_cell_ipython(text, compress_user(cell_path), label) + "\n"


def _without(tb, path: str):
    """A copy of the traceback chain ``tb`` without the frames of ``path`` (nbddp's SIGINT
    handler, its own calls around the cell): they would be noise to the learner."""
    frames = []
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) != path:
            frames.append(tb)
        tb = tb.tb_next
    copy = None
    for frame in reversed(frames):
        copy = types.TracebackType(copy, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return copy
