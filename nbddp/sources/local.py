"""The local launcher's entry: ``run(launch)`` runs the cell (or callable) once on new ranks
(nbddp/sources/forkranks.py) under the supervisor (nbddp/sources/supervisor.py) and returns the
RunResult. Also the serializing of the callable a launch sends to its ranks (``--push`` values:
nbddp/kernel/pushing.py).
"""
from __future__ import annotations

from nbddp.core import placement
from nbddp.core.launch import Launch
from nbddp.core.result import RunResult
from nbddp.forkserver import storehost
from nbddp.kernel.cellfiles import cell_files
from nbddp.kernel.logdirs import new_log_dir
from nbddp.sources.forkranks import ForkRanks
from nbddp.sources.supervisor import Supervisor


def run(launch: Launch) -> RunResult:
    """One fresh launch: placed (a bad --gpus stops here, before anything is made), its log
    folder, the per-cell files, the ranks under the supervisor."""
    plan = placement.plan(launch.spec, storehost.device_count(), launch.env_base)
    log_dir = new_log_dir(launch.spec.log_dir)  # a --log-dir refused before anything is made
    with cell_files(launch.cwd, launch.source, launch.push) as files:
        ranks = ForkRanks(launch, plan=plan, push=files.push, log_dir=log_dir, script=files.script)
        return Supervisor(ranks, launch.spec, list(launch.sinks)).run()


def pack_callable(func, args=(), kwargs=None) -> dict:
    """Serialize a callable (with the notebook globals it uses) once, in the kernel, so a
    function that cannot be sent fails here with its name, not inside four ranks."""
    import linecache

    import dill

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
