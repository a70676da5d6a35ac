"""The one error nbddp raises for input it refuses, before any process starts.

A ``ValueError``, so the Python API (``nbddp.run``, ``nbddp.Pool``) raises what Python code
expects for a bad argument; the magic (nbddp/magic.py, the only module that knows IPython's
``UsageError``) shows it as a ``UsageError``: the one-line reason, no traceback."""
from __future__ import annotations


class DDPUsageError(ValueError):
    """A bad option, an option that does not fit the launcher or the running pool, or a cell
    with a syntax error: refused before any rank starts."""
