"""Asking running ranks where they are: each rank answers on a FIFO next to its stack file
(nbddp/rank/stackwatch.py) by appending its Python stacks to that file, so a hung collective can be
shown by line without stopping or interrupting it. A rank whose answering thread cannot run
(C code holding the GIL) is asked with SIGUSR1 (faulthandler) instead. Process plumbing shared
by the local launcher and the torchrun launcher; parsing the dumps is nbddp.core.diagnosis's job."""
from __future__ import annotations

import os
import time

from nbddp.core.diagnosis import stack_complete
from nbddp.rank.release import REQUEST as RELEASE
from nbddp.rank.stackwatch import END_MARK, SIGNAL, ask_path

_ANSWER_FRAME = 'stackwatch.py", line'

WAIT_S = 1.0
SIGNAL_AFTER_S = 0.5  # the thread has not begun to answer by then: ask with the signal


def read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def ask(targets, wait_s: float = WAIT_S) -> dict:
    """``targets``: (key, pid, stack file) of live ranks. Empties each file, asks each rank,
    waits (at most ``wait_s``) until every dump is complete; returns {key: dump} for the ranks
    asked."""
    asked, by_thread = [], set()
    for key, pid, path in targets:
        try:
            os.truncate(path, 0)
        except OSError:
            continue  # it ended meanwhile (or never started)
        if _ask_thread(path):
            by_thread.add(key)
        elif not _signal(pid):  # no answering thread there (an older rank), or it ended
            continue
        asked.append((key, pid, path))
    start = time.monotonic()
    pending = list(asked)
    while pending and time.monotonic() - start < wait_s:
        time.sleep(0.02)
        pending = [t for t in pending if not _complete(read_text(t[2]), t[0] in by_thread)]
        if time.monotonic() - start >= SIGNAL_AFTER_S:
            for key, pid, path in pending:
                # not a line yet: the thread cannot run (C code holding the GIL), so signal
                if key in by_thread and not read_text(path):
                    by_thread.discard(key)
                    _signal(pid)
    if any(key not in by_thread for key, _, _ in asked):
        time.sleep(0.05)  # a signal's dump that looks complete may still be writing its next thread
    return {key: without_answering_thread(read_text(path).replace(END_MARK, "")) for key, _, path in asked}


def _complete(text: str, by_thread: bool) -> bool:
    """The answering thread ends its dump with END_MARK; a signal's dump has no end mark, so a
    complete-looking one is taken (and the caller waits a little more)."""
    return END_MARK in text if by_thread else stack_complete(text)


def without_answering_thread(dump: str) -> str:
    """The dump less the block of nbddp's thread that wrote it (noise where the user looks)."""
    blocks = dump.split("\n\n")
    kept = [b for b in blocks if not (b.startswith("Current thread") and _ANSWER_FRAME in b)]
    return "\n\n".join(kept) if kept else dump


def ask_release(path: str) -> bool:
    """Ask a pool rank to close its process group's connections, so a collective it is blocked in
    returns (nbddp/rank/release.py); False where no rank reads its FIFO."""
    return _ask_thread(path, RELEASE)


def _ask_thread(path: str, request: bytes = b"?") -> bool:
    """One byte into the rank's FIFO; False where no rank reads it (not there, or ended)."""
    try:
        fd = os.open(ask_path(path), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.write(fd, request)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _signal(pid: int) -> bool:
    try:
        os.kill(pid, SIGNAL)
        return True
    except OSError:
        return False
