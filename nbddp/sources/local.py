"""A fresh launch: ``Launch(spec, source=...).run()`` runs the cell once on new ranks
(nbddp/sources/forkranks.py) under the supervisor (nbddp/sources/supervisor.py) and returns the RunResult.
Also the serializing of the callable a launch sends to its ranks (``--push`` values: nbddp/kernel/pushing.py).
"""
from __future__ import annotations

import os

from nbddp.kernel import cellscript
from nbddp.kernel import pushing
from nbddp.sources.forkranks import ForkRanks
from nbddp.kernel.logdirs import new_log_dir
from nbddp.core.result import RunResult
from nbddp.core.spec import LaunchSpec
from nbddp.sources.supervisor import Supervisor


class Launch:
    """One fresh launch of ``spec``: ``Launch(spec, source=...).run()`` returns a RunResult."""

    def __init__(self, spec: LaunchSpec, *, source: str | None = None, func=None, args=(),
                 kwargs=None, sinks=(), cwd: str | None = None, base_env: dict | None = None,
                 push: dict | None = None, cell_label: str | None = None):
        if (source is None) == (func is None):
            raise TypeError("give exactly one of source or func")
        self.spec = spec
        self.source = source
        self.func = None if func is None else pack_callable(func, args, kwargs)
        self.push = push
        self.cell_label = cell_label  # how tracebacks name the cell ("Cell In[3]"; nbddp/core/cellnames.py)
        self.sinks = list(sinks)
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.base_env = dict(os.environ if base_env is None else base_env)

    def run(self) -> RunResult:
        log_dir = new_log_dir(self.spec.log_dir)  # a --log-dir refused before anything is made
        packed = pushing.pack(self.push)  # one shared file, read by every rank
        script = None if self.source is None else cellscript.create(self.cwd, self.source)
        try:
            ranks = ForkRanks(self.spec, source=self.source, func=self.func, push=packed, cwd=self.cwd,
                              base_env=self.base_env, log_dir=log_dir,
                              script=script, cell_label=self.cell_label)
            return Supervisor(ranks, self.spec, self.sinks).run()
        finally:
            cellscript.remove(script)  # the ranks have ended: it leaves the notebook's folder
            pushing.discard(packed)  # no one reads it any more


def pack_callable(func, args=(), kwargs=None) -> dict:
    """Serialize a callable (with the notebook globals it uses) once, in the kernel, so a
    function that cannot be sent fails here with its name, not inside four ranks."""
    import dill
    import linecache

    try:
        payload = dill.dumps((func, tuple(args), dict(kwargs or {})), recurse=True)
    except Exception as exc:
        raise TypeError(f"nbddp: cannot send {getattr(func, '__qualname__', func)!r} and its "
                        f"arguments to the ranks: {exc}") from None
    code = getattr(func, "__code__", None)
    filename = code.co_filename if code is not None else None
    lines = linecache.getlines(filename) if filename else []
    return {"payload": payload, "name": getattr(func, "__qualname__", repr(func)),
            "filename": filename, "lines": lines}
