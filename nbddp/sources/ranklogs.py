"""The per-rank log files as the kernel writes them: bounded, and never the reason a job dies.

A runaway print loop writes without end, and ``/tmp`` is often RAM shared by every user, so each
log keeps at most ``NBDDP_LOG_RANK_MB`` and a launch's logs together ``NBDDP_LOG_TOTAL_MB``: past
a cap a log keeps its head, one line saying what was cut and why, then its last ``TAIL`` bytes
(the traceback the diagnosis reads). A write that fails (``ENOSPC``, a quota) stops that log only,
said once. Files are opened on a rank's first byte on that stream, so a quiet rank holds no log
descriptor, through nbddp/kernel/logdirs.py's ``private``. The views still show all output live."""
from __future__ import annotations

import io
import os

from nbddp.core import settings
from nbddp.kernel.logdirs import private

TAIL = 1 << 16  # kept past a cap: the stderr tail the diagnosis reads (result.TAIL_BYTES)


def _mb(setting) -> int:
    return int(settings.read(setting) * (1 << 20))


class LogBudget:
    """The caps of one launch's logs and what was said about them: ``note(text)`` gets at most
    one line about a cut and one about a failed write, per launch (per log folder: a pool's
    cells are launches)."""

    def __init__(self, note):
        self.note = note
        self.per_log = _mb(settings.LOG_RANK_MB)
        self.total = _mb(settings.LOG_TOTAL_MB)
        self.used: dict[str, int] = {}   # log folder → bytes written there
        self.said: set[tuple[str, str]] = set()

    def grant(self, folder: str, want: int, written: int) -> tuple[int, str]:
        """How many of ``want`` bytes a log that holds ``written`` may still write, and which cap
        stops the rest ("" if none)."""
        room = self.per_log - written
        total_room = self.total - self.used.get(folder, 0)
        if want <= min(room, total_room):
            return want, ""
        if room <= total_room:
            return max(0, room), f"{settings.LOG_RANK_MB.name}={self.per_log / (1 << 20):g} MB a log"
        return max(0, total_room), f"{settings.LOG_TOTAL_MB.name}={self.total / (1 << 20):g} MB for a launch's logs"

    def spent(self, folder: str, n: int) -> None:
        self.used[folder] = self.used.get(folder, 0) + n

    def once(self, folder: str, what: str, text: str) -> None:
        if (folder, what) not in self.said:
            self.said.add((folder, what))
            self.note(text)


class RankLog:
    """One log file (``rank3.stdout``): ``write``, ``flush``, ``close``, as a file, but bounded
    and never raising. Past a cap the file is its head, the cut line and the last bytes cut,
    rewritten after the head at each ``flush`` and at ``close`` (so a pool's cell, whose logs are
    flushed when it ends, reads whole on disk then)."""

    def __init__(self, path: str, budget: LogBudget, name: str):
        self.path, self.budget, self.name = path, budget, name
        self.folder = os.path.dirname(path)
        self.file: io.BufferedRandom | None = None
        self.written = 0          # the head: bytes written before any cut
        self.cut = 0              # bytes past a cap, not kept but their last TAIL
        self.why = ""             # the cap that cut it
        self.tail = bytearray()   # the last TAIL bytes cut
        self.stale = False        # the tail changed since it was last written
        self.broken = False       # a write failed: nothing more is written
        try:  # made anew and empty now (an earlier launch's in a reused --log-dir goes), held later
            open(path, "wb", opener=private).close()
        except OSError as exc:
            self._fail(exc)

    def write(self, data: bytes) -> None:
        if self.broken or not data:
            return
        n, why = (0, self.why) if self.cut else self.budget.grant(self.folder, len(data), self.written)
        if n and not self._put(data[:n]):
            return
        if n < len(data):
            if not self.cut:
                self.why = why
                self.budget.once(self.folder, "cut", f"{self.name}'s log reached its cap ({why}): the rest "
                                 "of it is not kept in the log folder, but its last 64 KB (the output "
                                 "shown here is whole)")
            self.cut += len(data) - n
            self.tail += data[n:]
            del self.tail[:-TAIL]
            self.stale = True

    def _open(self) -> None:
        if self.file is None:  # read-write, not appending: the tail is rewritten after the head
            self.file = open(self.path, "r+b", opener=private)
            self.file.seek(self.written)

    def _put(self, data: bytes) -> bool:
        try:
            self._open()
            self.file.write(data)
        except (OSError, ValueError) as exc:
            self._fail(exc)
            return False
        self.written += len(data)
        self.budget.spent(self.folder, len(data))
        return True

    def _fail(self, exc: BaseException) -> None:
        self.broken = True
        why = getattr(exc, "strerror", None) or str(exc)
        self.budget.once(self.folder, "failed", f"could not write {self.name}'s log in {self.folder} ({why}): "
                         "the ranks keep running and their output is shown, but their logs there "
                         "are not whole")
        try:
            if self.file is not None:
                self.file.close()
        except OSError:
            pass
        self.file = None

    def flush(self, tail: bool = True) -> None:
        """The file on disk as it stands: its head, and past a cap the cut line and the tail
        (``tail=False``: the head only, cheap enough to do after every read)."""
        if self.broken:
            return
        try:
            if self.stale and tail:
                dropped = self.cut - len(self.tail)
                marker = (f"\n[nbddp: {dropped} bytes of this log were cut here ({self.why}); "
                          f"its last {len(self.tail)} bytes follow]\n").encode()
                self._open()
                self.file.seek(self.written)
                self.file.write(marker + bytes(self.tail))
                self.file.truncate()
                self.stale = False
            if self.file is not None:
                self.file.flush()
        except (OSError, ValueError) as exc:
            self._fail(exc)

    def close(self) -> None:
        self.flush()
        if self.file is not None:
            try:
                self.file.close()
            except OSError as exc:
                self._fail(exc)
            self.file = None


def trim_copies(folder: str, budget: LogBudget) -> None:
    """torchrun's own copies of each rank's output (``--tee`` writes them under its
    ``--log-dir``: ``attempt_N/R/stdout.log``) cannot be capped while it runs; once it has
    ended, each copy longer than the cap per log keeps its head, cut where nbddp's own log was
    (that one keeps the tail as well). Never through a link."""
    for root, _, files in os.walk(folder):
        for name in files:
            if name not in ("stdout.log", "stderr.log"):
                continue
            path = os.path.join(root, name)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                size = os.fstat(fd).st_size
                if size > budget.per_log:
                    os.ftruncate(fd, budget.per_log)
                    os.lseek(fd, 0, os.SEEK_END)
                    os.write(fd, f"\n[nbddp: {size - budget.per_log} bytes of torchrun's copy were cut "
                                 f"here ({settings.LOG_RANK_MB.name}); nbddp's rank log has the end]\n".encode())
            except OSError:
                pass
            finally:
                os.close(fd)
