"""Descriptors only the kernel may hold, closed in every child the kernel forks.

nbddp's cleanup after a killed kernel waits for pipes to reach their end of file (the watcher's,
the forkserver's "alive" pipe, the resource tracker's, each rank's lifeline); a child forked
without exec (``os.fork()``, multiprocessing's fork workers) that kept their write ends would keep
those helpers and their folders alive after the kernel. So one ``os.register_at_fork`` hook closes
in such a child every descriptor registered here (``hold``), if it is still the same file (device
and inode), and runs the resets registered by ``on_child``. Only the kernel registers anything."""
from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_held: dict[int, tuple[int, int]] = {}   # fd -> (st_dev, st_ino) when registered
_resets: list = []
_hooked = False


def hold(*fds: int) -> None:
    """Close ``fds`` in every child this process forks from now on."""
    with _lock:
        _hook()
        for fd in fds:
            identity = _identity(fd)
            if identity is not None:
                _held[fd] = identity
        for fd in [fd for fd, identity in _held.items() if _identity(fd) != identity]:
            del _held[fd]  # closed since (its number may be another file's now)


def on_child(reset) -> None:
    """Call ``reset()`` in every child this process forks from now on (after the closes)."""
    with _lock:
        _hook()
        if reset not in _resets:
            _resets.append(reset)


def _hook() -> None:
    global _hooked
    if not _hooked:
        os.register_at_fork(after_in_child=_in_child)
        _hooked = True


def _identity(fd: int):
    try:
        info = os.fstat(fd)
    except (OSError, TypeError, ValueError):
        return None
    return info.st_dev, info.st_ino


def _in_child() -> None:
    """In the forked child (one thread: no lock can be held by another): close, reset, and
    forget all of it, so the child's own children do nothing more."""
    global _lock
    _lock = threading.Lock()  # the parent's may have been held by a thread the child lacks
    held, resets = dict(_held), list(_resets)
    _held.clear()
    _resets.clear()
    for fd, identity in held.items():
        if _identity(fd) == identity:
            try:
                os.close(fd)
            except OSError:
                pass
    for reset in resets:
        try:
            reset()
        except Exception:  # a fork must never fail here
            pass
