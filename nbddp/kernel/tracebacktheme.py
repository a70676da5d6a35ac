"""Kernel side: the colour theme of the kernel's own tracebacks (``%colors``), handed to the ranks so
a failing rank's traceback looks like one from a plain cell (nbddp/rank/ipytraceback.py). None
outside IPython (``nbddp.run`` in a script): the ranks print Python's plain traceback there."""
from __future__ import annotations

import sys


def theme(shell=None) -> str | None:
    """``shell``'s traceback theme (the running IPython's when None; None without one)."""
    if shell is None:
        ipython = sys.modules.get("IPython")  # never imported for this: a script has none
        shell = ipython.get_ipython() if ipython is not None else None
    colors = getattr(shell, "colors", None)
    return str(colors).lower() if colors else None
