"""Where one %%ddp cell's time goes, measured from outside nbddp: run inside the kernel, this
wraps (never edits) nbddp's launch steps with time.perf_counter stamps.

    install()            # once, in the kernel
    reset(); <run a %%ddp cell>; print(summary())
"""
from __future__ import annotations

import functools
import time

STAMPS: dict[str, float] = {}
SPANS: dict[str, float] = {}


def _wrap(owner, name, label):
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        STAMPS.setdefault(label + ".start", t0)
        try:
            return original(*args, **kwargs)
        finally:
            t1 = time.perf_counter()
            SPANS[label] = SPANS.get(label, 0.0) + (t1 - t0)
            STAMPS[label + ".end"] = t1

    setattr(owner, name, timed)


def install() -> None:
    from nbddp.core import spec
    from nbddp.sources import forkranks
    from nbddp.sources import local as launcher
    from nbddp.sources import rankprocs
    from nbddp.forkserver import spares
    from nbddp.sources import supervisor
    from nbddp.views import choose as views

    _wrap(spec, "check_cell", "compile")
    _wrap(views, "make_sinks", "sinks")
    _wrap(forkranks, "host_store", "store")
    _wrap(launcher, "new_log_dir", "logdir")
    _wrap(rankprocs.RankProcs, "start", "start_all")
    _wrap(spares, "take", "take_spares")      # ranks forked after the last cell, ready
    _wrap(supervisor.Supervisor, "_loop", "pump")
    _wrap(forkranks.ForkRanks, "close", "cleanup")
    _wrap(supervisor.Supervisor, "emit", "emit")  # every event to every sink (the output path)


def reset() -> None:
    STAMPS.clear()
    SPANS.clear()


def summary() -> dict:
    """Seconds spent in each step of the last cell."""
    out = dict(SPANS)
    s = STAMPS
    if "compile.start" in s and "start_all.start" in s:
        out["before_fork"] = s["start_all.start"] - s["compile.start"]  # parse, log dir, store, sinks
    return out
