"""The states nbddp compares, named: a rank's, a launch's (the supervisor's), a pool's, and why
nbddp stopped a launch. ``str`` enums, so each member equals its word ("ok" == RankState.OK),
prints, reprs and goes into JSON as it: views, ``_ddp`` and saved notebooks read the same text."""
from __future__ import annotations

from enum import Enum


class _Words(str, Enum):
    """A str enum that prints, formats and reprs as its value (so ``_ddp.ranks`` and a list of
    states in a notebook read as plain strings: 'ok', not <RankState.OK: 'ok'>)."""

    def __repr__(self) -> str:
        return str.__repr__(self)

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(str.__str__(self), spec)


class RankState(_Words):
    """A rank's state, in the order a rank goes through them (the last six are final)."""

    STARTING = "starting"
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    TIMED_OUT = "timed out"
    KILLED = "killed"
    TERMINATED = "terminated"
    INTERRUPTED = "interrupted"


FINAL_STATES = (RankState.OK, RankState.FAILED, RankState.TIMED_OUT, RankState.KILLED,
                RankState.TERMINATED, RankState.INTERRUPTED)
CAUSING = (RankState.FAILED, RankState.KILLED, RankState.TIMED_OUT)  # explain a failure by themselves


class LaunchState(_Words):
    """One launch under the supervisor: NEW → STARTING → RUNNING → (STOPPING) → CLOSING → DONE."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    CLOSING = "closing"
    DONE = "done"


class PoolState(_Words):
    """A ``%ddp_pool`` between and during cells."""

    IDLE = "ready"
    BUSY = "running a cell"
    BROKEN = "broken"
    STOPPED = "stopped"


class StopReason(_Words):
    """Why nbddp signals a launch's ranks (the supervisor's first signal depends on it)."""

    FAILFAST = "failfast"
    TIMEOUT = "timeout"
    INTERRUPT = "interrupt"
