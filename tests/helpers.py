"""Helpers the test files share: a free port, waiting with a deadline, and whether processes
still run. (The kernel driver is tests/kernel.py.)"""
from __future__ import annotations

import socket
import time

import psutil


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, timeout: float, every: float = 0.05):
    """Call ``condition()`` until it returns something true or ``timeout`` s have passed;
    return its last value (false when time ran out), so the caller's assert shows it."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(every)


def alive(pids) -> list[int]:
    """The pids among ``pids`` that still run (zombies count as gone)."""
    living = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.append(pid)
        except psutil.NoSuchProcess:
            pass
    return living


def wait_gone(pids, timeout: float = 5.0) -> list[int]:
    """Wait (``timeout`` s at most) until none of ``pids`` runs; the ones still running."""
    wait_until(lambda: not alive(pids), timeout)
    return alive(pids)
