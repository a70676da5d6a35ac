"""Inside a rank: write this process's Python stacks to a file whenever the kernel asks, without
interrupting anything the rank is doing.

A signal would break the main thread's system call (c10d's sleeps and polls are not restarted), so
a thread waits on a FIFO beside the stack file (``<stacks>.ask``) and dumps every thread's stack
with faulthandler when a byte arrives. For a rank stuck in C holding the GIL the kernel falls
back to SIGUSR1 (registered here too, restartable where the kernel allows). Imported by worker.py
(preloaded in the forkserver) and torchrun_rank.py: stdlib only."""
from __future__ import annotations

import faulthandler
import os
import signal
import threading

from nbddp.rank import release

SIGNAL = signal.SIGUSR1
ASK_SUFFIX = ".ask"
END_MARK = "# nbddp: end of stacks\n"  # written after a dump the thread made: complete, for certain


def ask_path(stack_path: str) -> str:
    """The FIFO the kernel writes a byte to, to ask for a dump into ``stack_path``."""
    return stack_path + ASK_SUFFIX


def serve(stack_path: str):
    """Answer stack requests for ``stack_path`` from now on; returns the open stack file."""
    # append mode: the kernel truncates the file before each request, and a plain "w" offset
    # would put the next dump after a hole of NUL bytes. Made under another name and renamed once
    # the handler is in place: the kernel asks only a rank whose stack file exists, and SIGUSR1
    # before the handler would kill the rank (an idle warning during a slow start asks for stacks).
    pending = f"{stack_path}.{os.getpid()}.new"
    stack_file = open(pending, "a", opener=_private)
    faulthandler.register(SIGNAL, file=stack_file, all_threads=True, chain=False)
    try:
        signal.siginterrupt(SIGNAL, False)  # SA_RESTART for the fallback signal
    except (OSError, ValueError, AttributeError):
        pass
    os.replace(pending, stack_path)
    fifo = ask_path(stack_path)
    try:
        if os.path.exists(fifo):  # a pool rank of an earlier start, or a rerun in the same folder
            os.unlink(fifo)
        os.mkfifo(fifo, 0o600)
        # read-write: opening never blocks, and the FIFO never reports EOF between requests
        fd = os.open(fifo, os.O_RDWR)
    except OSError:
        return stack_file  # no FIFO here: the kernel uses the signal
    threading.Thread(target=_answer, args=(fd, stack_file), name="nbddp-stacks", daemon=True).start()
    return stack_file


def _answer(fd: int, stack_file) -> None:
    while True:
        try:
            asked = os.read(fd, 64)
        except OSError:
            return
        if not asked:
            return
        if release.REQUEST in asked:  # a pool rank blocked in a collective (nbddp/rank/release.py)
            release.release()
            if not asked.strip(release.REQUEST):
                continue
        try:
            faulthandler.dump_traceback(file=stack_file, all_threads=True)
            os.write(stack_file.fileno(), END_MARK.encode())  # the reader need not guess
        except (OSError, ValueError):
            pass


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)
