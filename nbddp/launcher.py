"""A fresh launch: ``Launch(spec, source=...).run()`` runs the cell once on new ranks
(nbddp/forkranks.py) under the supervisor (nbddp/supervisor.py) and returns the RunResult.
Also the per-kernel log folders and the serializing of what a launch sends to its ranks.
"""
from __future__ import annotations

import os
import tempfile

from .forkranks import ForkRanks
from .result import RunResult
from .spec import LaunchSpec
from .supervisor import Supervisor

_log_root: str | None = None
_launch_count = 0


def new_log_dir(requested: str | None) -> str:
    global _log_root, _launch_count
    if requested:
        os.makedirs(requested, exist_ok=True)
        return os.path.abspath(requested)
    if _log_root is None or not os.path.isdir(_log_root):
        _log_root = tempfile.mkdtemp(prefix="nbddp-")
    _launch_count += 1
    path = os.path.join(_log_root, f"launch-{_launch_count}")
    os.makedirs(path, exist_ok=True)
    return path


class Launch:
    """One fresh launch of ``spec``: ``Launch(spec, source=...).run()`` returns a RunResult."""

    def __init__(self, spec: LaunchSpec, *, source: str | None = None, func=None, args=(),
                 kwargs=None, sinks=(), cwd: str | None = None, base_env: dict | None = None,
                 push: dict | None = None):
        if (source is None) == (func is None):
            raise TypeError("give exactly one of source or func")
        self.spec = spec
        self.source = source
        self.func = None if func is None else pack_callable(func, args, kwargs)
        self.push = pack_names(push)
        self.sinks = list(sinks)
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.base_env = dict(os.environ if base_env is None else base_env)

    def run(self) -> RunResult:
        ranks = ForkRanks(self.spec, source=self.source, func=self.func, push=self.push, cwd=self.cwd,
                          base_env=self.base_env, log_dir=new_log_dir(self.spec.log_dir))
        return Supervisor(ranks, self.spec, self.sinks).run()


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


def pack_names(values: dict | None) -> bytes | None:
    """Serialize notebook values for ``--push`` once (not once per rank), naming any that fails."""
    if not values:
        return None
    import dill

    try:
        return dill.dumps(dict(values), recurse=True)
    except Exception:
        pass
    for name, value in values.items():  # find the one that cannot be sent, to name it
        try:
            dill.dumps(value, recurse=True)
        except Exception as exc:
            raise TypeError(f"nbddp: cannot push {name!r} ({type(value).__name__}) to the ranks: "
                            f"{exc}") from None
    raise TypeError("nbddp: the pushed values cannot be sent together")
