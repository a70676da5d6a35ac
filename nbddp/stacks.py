"""Asking running ranks where they are: each rank registered faulthandler on SIGUSR1 to append
its Python stacks to its own file, so a hung collective can be shown by line without stopping it.
Process plumbing shared by the local launcher and the torchrun launcher; parsing the dumps is
nbddp.diagnosis's job."""
from __future__ import annotations

import os
import signal
import time

from .diagnosis import stack_complete

WAIT_S = 1.0


def read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def ask(targets, wait_s: float = WAIT_S) -> dict:
    """``targets``: (key, pid, stack file) of live ranks. Empties each file, sends SIGUSR1, waits
    (at most ``wait_s``) until every dump is complete; returns {key: dump} for the ranks asked."""
    asked = []
    for key, pid, path in targets:
        try:
            os.truncate(path, 0)
            os.kill(pid, signal.SIGUSR1)
            asked.append((key, path))
        except OSError:
            pass  # it ended meanwhile
    deadline = time.monotonic() + wait_s
    pending = list(asked)
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [(k, p) for k, p in pending if not stack_complete(read_text(p))]
    if asked:
        time.sleep(0.05)  # a dump that looks complete may still be writing its next thread
    return {key: read_text(path) for key, path in asked}
