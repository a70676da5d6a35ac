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


# (module, class or None, attribute, label): the launch steps wrapped, where the launch looks
# them up (a name imported into a module is wrapped there). tests/unit/test_benchmark_plumbing.py checks
# that each still exists, so a renamed step fails a test instead of the benchmark's profile.
STEPS = [
    ("nbddp.core.launchrules", None, "check_cell", "compile"),
    ("nbddp.views.choose", None, "make_sinks", "sinks"),
    ("nbddp.sources.forkranks", None, "host_for", "store"),
    ("nbddp.sources.local", None, "new_log_dir", "logdir"),
    ("nbddp.sources.rankprocs", "RankProcs", "start", "start_all"),
    ("nbddp.forkserver.spares", None, "take", "take_spares"),   # ranks forked after the last cell, ready
    ("nbddp.sources.supervisor", "Supervisor", "_loop", "pump"),
    ("nbddp.sources.forkranks", "ForkRanks", "close", "cleanup"),
    ("nbddp.sources.supervisor", "Supervisor", "emit", "emit"),  # every event to every sink (the output path)
]


def owner_of(module: str, cls: str | None):
    import importlib

    found = importlib.import_module(module)
    return getattr(found, cls) if cls else found


def install() -> None:
    for module, cls, name, label in STEPS:
        _wrap(owner_of(module, cls), name, label)


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
