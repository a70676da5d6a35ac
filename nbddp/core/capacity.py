"""How many ranks a launch may start on this machine, checked before anything starts.

A mistyped ``-n 4000`` would otherwise fork that many torch processes until the OOM killer
acts. The bound is what the machine can run: its cores (``PER_CORE`` ranks each), its available
memory (``RANK_MIB`` a rank), the user's process limit and the kernel's hard descriptor limit
(``FDS_PER_RANK`` a rank); ``--max-ranks N`` is the explicit way past it. ``machine()`` reads
the facts (a few small /proc and /sys files); ``refusal()`` is the pure rule over them."""
from __future__ import annotations

import os
import resource
from dataclasses import dataclass

PER_CORE = 8            # ranks per core before the machine is only oversubscribed
AT_LEAST = 64           # ... but never fewer than this (a 2-core laptop runs -n 32 lessons)
RANK_MIB = 32           # the least memory one rank takes (an idle forkserver rank's own, with margin)
FDS_PER_RANK = 4        # the kernel's pipes per rank (output, control, exit)
ANYWHERE = 65536        # ranks of one job on any launcher (the kernel keeps a result per rank)


@dataclass(frozen=True)
class Machine:
    """What bounds the ranks this machine can run (None: no limit known)."""

    cores: int
    mem_available_mib: int | None
    nproc_limit: int | None     # the soft RLIMIT_NPROC, None for unlimited or root
    fd_hard_limit: int | None   # the hard RLIMIT_NOFILE, None for unlimited


def machine() -> Machine:
    """This machine's (this container's) facts, read now."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return Machine(cores=cores, mem_available_mib=_mem_available_mib(),
                   nproc_limit=_limit(resource.RLIMIT_NPROC, soft=True) if os.geteuid() != 0 else None,
                   fd_hard_limit=_limit(resource.RLIMIT_NOFILE, soft=False))


def limits(m: Machine) -> list[tuple[int, str]]:
    """(at most this many ranks, because) for each bound of ``m``."""
    plural = "s" * (m.cores != 1)
    out = [(max(AT_LEAST, PER_CORE * m.cores),
            f"{m.cores} core{plural}: {PER_CORE} ranks a core, and never fewer than {AT_LEAST}")]
    if m.mem_available_mib is not None:
        out.append((max(1, m.mem_available_mib // RANK_MIB),
                    f"{m.mem_available_mib / 1024:.1f} GiB of memory available, at least {RANK_MIB} MiB a rank"))
    if m.nproc_limit is not None:
        out.append((max(1, m.nproc_limit - 16), f"the process limit (ulimit -u) is {m.nproc_limit}"))
    if m.fd_hard_limit is not None:
        out.append((max(1, m.fd_hard_limit // FDS_PER_RANK),
                     f"the hard descriptor limit (ulimit -Hn) is {m.fd_hard_limit}, {FDS_PER_RANK} a rank"))
    return out


def refusal(here: int, world_size: int, max_ranks: int | None, m: Machine | None,
            what: str = "-n") -> str | None:
    """Why ``here`` ranks on this machine (of ``world_size`` in the job) cannot start, or None.
    ``m`` None: the ranks run elsewhere (Slurm): only the job's size is bounded. ``max_ranks``
    (--max-ranks) replaces every bound."""
    ranks = f"{what} {here} ranks" if here == world_size else f"{here} ranks on this machine ({what} {world_size})"
    if max_ranks is not None:
        return f"{ranks} is more than --max-ranks {max_ranks}" if here > max_ranks else None
    hint = f"if you mean it, add --max-ranks {here} (max_ranks={here} in Python)"
    if world_size > ANYWHERE:
        return f"{what} {world_size} ranks is more than {ANYWHERE}, nbddp's bound for one job; {hint}"
    if m is None:
        return None
    bound, why = min(limits(m))
    if here > bound:
        return f"{ranks} is more than this machine runs: at most {bound} ({why}); {hint}"
    return None


def _limit(which: int, soft: bool) -> int | None:
    try:
        value = resource.getrlimit(which)[0 if soft else 1]
    except (OSError, ValueError):
        return None
    return None if value == resource.RLIM_INFINITY else value


def _mem_available_mib() -> int | None:
    """MemAvailable, or less where this container's memory cgroup allows less."""
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) // 1024
                    break
    except (OSError, ValueError):
        pass
    try:  # cgroup v2: the limit less what is used, the page cache it can drop not counted
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            cap = f.read().strip()
        if cap != "max":
            with open("/sys/fs/cgroup/memory.current", encoding="ascii") as f:
                used = int(f.read().strip())
            with open("/sys/fs/cgroup/memory.stat", encoding="ascii") as f:
                stat = dict(line.split() for line in f if line.count(" ") == 1)
            used -= int(stat.get("inactive_file", 0))
            left = max(0, int(cap) - used) >> 20
            available = left if available is None else min(available, left)
    except (OSError, ValueError):
        pass
    return available
