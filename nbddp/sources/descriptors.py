"""Whether a launch's ranks fit in the kernel's file descriptors, checked before any starts.

While they start, each rank holds ``PER_RANK`` descriptors in the kernel (its pipes, a pidfd, its
logs once it writes; a rank taken from the spares only ``PER_SPARE``). As systemd, Go's runtime and
Julia do, the soft limit is raised to the hard one when a launch needs it; a launch that still
cannot fit is refused in one line saying how many it needs, before anything starts, rather than
a fork failing half-way with "Too many open files" (docs/explanation/performance.md)."""
from __future__ import annotations

import os
import resource

from nbddp.core.errors import DDPUsageError

PER_RANK = 15   # the kernel's descriptors per new rank while they start, its two logs included
PER_SPARE = 3   # ... per rank from a spare (its pipes are open already): its logs and a pidfd
MARGIN = 32     # for the rest of the kernel meanwhile (the store, its clients, files, ZMQ)


def open_now() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _ceiling(hard: int) -> int:
    """How far the soft limit may go: the hard limit, or the system's per-process maximum."""
    try:
        with open("/proc/sys/fs/nr_open") as f:
            nr_open = int(f.read())
    except (OSError, ValueError):
        nr_open = 1 << 20
    return nr_open if hard == resource.RLIM_INFINITY else min(hard, nr_open)


def fit(n: int, spares: int = 0) -> None:
    """Make room for ``n`` ranks, ``spares`` of them from spares (raising the soft RLIMIT_NOFILE
    toward the hard one), or raise DDPUsageError saying how many descriptors they need."""
    spares = min(spares, n)
    need = open_now() + (n - spares) * PER_RANK + spares * PER_SPARE + MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    ceiling = _ceiling(hard)
    if ceiling > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
            soft = ceiling
        except (ValueError, OSError):
            pass
    if need <= soft:
        return
    raise DDPUsageError(
        f"{n} ranks need about {need} file descriptors in the kernel (up to {PER_RANK} a rank while they "
        f"start, {open_now()} open now), more than its limit of {soft} (ulimit -n; the "
        f"hard limit is {'unlimited' if hard == resource.RLIM_INFINITY else hard}): start Jupyter "
        f"with a higher limit (ulimit -n {need}), or run fewer ranks")
