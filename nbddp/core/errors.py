"""The errors' base, and the one error nbddp raises for input it refuses before anything starts.

``NbddpError`` is the base of every error a user can meet from nbddp; each error also keeps the
builtin base Python code expects (``ValueError``, ``RuntimeError``, ``KeyboardInterrupt`` for the
stop button), so the base derives from ``BaseException`` (an interrupt is still no
``Exception``) and is never raised itself: ``class DDPError(RuntimeError, NbddpError)``.
``DDPUsageError`` is a ``ValueError`` for the Python API; the magic (nbddp/magic.py, the only
module that knows IPython) shows it as a ``UsageError``: one line, no traceback."""
from __future__ import annotations


class NbddpError(BaseException):
    """The base of nbddp's errors (never raised itself; see the module's docstring)."""


class DDPUsageError(ValueError, NbddpError):
    """A bad option, an option that does not fit the launcher or the running pool, or a cell
    with a syntax error: refused before any rank starts."""
