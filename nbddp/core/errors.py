"""The errors' base, and the one error nbddp raises for input it refuses before anything starts.

``NbddpError`` is the base of every error a user can meet from nbddp (``except
nbddp.NbddpError`` catches them all); each also keeps the builtin base Python code expects
(``ValueError`` for bad input, ``RuntimeError`` for failed ranks, ``KeyboardInterrupt`` for the
stop button), so what ``except Exception`` caught before it still catches, and an interrupt is
still not an ``Exception``: that is why the base derives from ``BaseException`` and is never
raised itself. A class becomes one by naming it: ``class DDPError(RuntimeError, NbddpError)``.

``DDPUsageError`` is a ``ValueError``, so the Python API (``nbddp.run``, ``nbddp.Pool``) raises
what Python code expects for a bad argument; the magic (nbddp/magic.py, the only module that
knows IPython's ``UsageError``) shows it as a ``UsageError``: the one-line reason, no traceback."""
from __future__ import annotations


class NbddpError(BaseException):
    """The base of nbddp's errors (never raised itself; see the module's docstring)."""


class DDPUsageError(ValueError, NbddpError):
    """A bad option, an option that does not fit the launcher or the running pool, or a cell
    with a syntax error: refused before any rank starts."""
