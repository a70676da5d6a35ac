"""A forkserver rank's exit status, read once and never invented.

multiprocess's ``Popen.poll`` reads the exit code from a pipe the forkserver writes, without a
lock, and takes EOF for "exit code 255"; two threads polling the same rank (``Process.start()``
polls every earlier child: ``starter.start_all``'s threads, the spares' refill) could store a
false 255 over the real code. Here it is read under a lock, once. When the forkserver itself has
ended the pipe closes with no status though the rank may run on: ``lost(process)`` says so, and
the launcher watches the process (``pidfd``) and takes the code the rank reported."""
from __future__ import annotations

import os
import threading
import time

from multiprocess import forkserver, popen_forkserver
from multiprocess.connection import wait

LOST = 255  # what multiprocess stores for a status it could not read
_lock = threading.Lock()


def _poll(self, flag=os.WNOHANG):
    if self.returncode is None:
        if not wait([self.sentinel], 0 if flag == os.WNOHANG else None):
            return None
        with _lock:
            if self.returncode is None:  # another thread may have read it meanwhile
                try:
                    self.returncode = forkserver.read_signed(self.sentinel)
                except (OSError, EOFError):  # the forkserver ended before it could say
                    self.status_lost = True
                    self.returncode = LOST
    return self.returncode


popen_forkserver.Popen.poll = _poll


def lost(process) -> bool:
    """The process's status pipe closed without an exit code: the forkserver has ended."""
    return getattr(getattr(process, "_popen", None), "status_lost", False)


def pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when process ``pid`` ends (None where Linux has none).
    Opened while the process is known to exist, so a reused pid can never be watched."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def wait_ended(fd: int | None, pid: int, timeout: float = 0.0) -> bool:
    """Whether the process has ended (exited, or a zombie no one reaped yet), waiting for it up
    to ``timeout`` seconds; by the pidfd ``fd``, else by /proc (a reused pid would read as
    running: the launcher's deadlines still end the wait)."""
    if fd is not None:
        return bool(wait([fd], timeout))
    deadline = time.monotonic() + timeout
    while True:
        alive = running(pid)
        if not alive or time.monotonic() >= deadline:
            return not alive
        time.sleep(0.02)


def running(pid: int) -> bool:
    """Whether ``pid`` still runs, by /proc: a zombie (ended, not yet reaped) or a gone pid does not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
