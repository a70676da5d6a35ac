"""Ranks forked ahead of need, so a fresh ``%%ddp`` cell does not wait for its forks.

After each launch, in the background, as many processes as it had ranks (at most
``NBDDP_SPARES``; 0 turns this off) are forked from the forkserver and wait, having run nothing,
for their job (environment, argv, cwd, the cell), applied after the fork exactly as for a fresh
fork. An unused spare ends with the kernel (its job pipe closes); ``ps`` names it ``nbddp-spare``
(``nbddp-rankN`` once it runs). One rank's plumbing (its pipes and un-started process) is made
here for every rank, spare or not, so both paths are the same code."""
from __future__ import annotations

import atexit
import os
import threading
import time

from multiprocess.connection import Connection

from nbddp.core import job as rankjob, messages as msg, settings
from nbddp.forkserver import preload, starter
from nbddp.kernel import forkguard
from nbddp.rank import worker

_lock = threading.Lock()
_stock: list[Plumbing] = []
_worker: threading.Thread | None = None  # the refill running now, if any
_progress_at = 0.0  # when that refill last got on (started, began forking, forked, heard a spare ready)


def limit() -> int:
    return int(settings.read(settings.SPARES))


class Plumbing:
    """One rank's pipes (launcher's ends kept here) and its process, started or not."""

    def __init__(self, ctx, duplex: bool, spare: bool = False):
        opened: list = []  # descriptors and Connections, closed again if one cannot be made
        try:  # out of descriptors half-way: what was opened is closed, nothing leaks
            self.out_r, out_w = _pipe(opened)
            self.err_r, err_w = _pipe(opened)
            life_r, self.life_w = _pipe(opened)
            self.ctl, ctl_w = ctx.Pipe(duplex=duplex)
            opened += [self.ctl, ctl_w]
            job_r, self.job_w = ctx.Pipe(duplex=False)
        except BaseException:
            for end in opened:
                try:
                    end.close() if isinstance(end, Connection) else os.close(end)
                except OSError:
                    pass
            raise
        # a child the kernel forks (os.fork(), multiprocessing's fork workers) must not keep
        # the lifeline's write end or the rank's pipes open after the kernel dies
        forkguard.hold(self.out_r, self.err_r, self.life_w, self.ctl.fileno(), self.job_w.fileno())
        self._child_ends = [Connection(out_w, readable=False), Connection(err_w, readable=False),
                            Connection(life_r, writable=False), ctl_w, job_r]
        pipes = dict(zip(("stdout", "stderr", "lifeline", "ctl", "jobpipe"), self._child_ends, strict=True))
        pipes["spare"] = spare  # a spare says msg.READY on ctl once it waits for its job
        self.process = ctx.Process(target=worker.entry, args=(pipes,), name="nbddp-rank")

    @property
    def started(self) -> bool:
        return getattr(self.process, "_popen", None) is not None

    def close_child_ends(self) -> None:
        """After the start the child has its own copies of these."""
        for conn in self._child_ends:
            conn.close()
        self._child_ends = []

    def send_job(self, job: rankjob.RankJob) -> None:
        """The rank's data (one stdlib pickle); the rank starts its cell when it arrives."""
        try:
            self.job_w.send_bytes(rankjob.dumps(job))
        except OSError:
            pass  # it died meanwhile: the launcher sees its exit like any other rank's
        self.job_w.close()

    def discard(self) -> None:
        """Close everything; a started process gets SIGKILL (it has run nothing)."""
        self.close_child_ends()
        if self.started and self.process.exitcode is None:
            self.process.kill()
            self.process.join(2)
        for fd in (self.out_r, self.err_r, self.life_w):
            try:
                os.close(fd)
            except OSError:
                pass
        for conn in (self.ctl, self.job_w):
            conn.close()


def _pipe(opened: list) -> tuple[int, int]:
    r, w = os.pipe()
    opened += [r, w]
    return r, w


def usable(spec, pool_mode: bool) -> bool:
    """Spares serve fresh forkserver launches (a pool starts once; spawn means a new interpreter)."""
    return not pool_mode and spec.start_method == "forkserver" and limit() > 0


def take(n: int) -> list[Plumbing]:
    """Up to ``n`` ready spares (dead ones are dropped). A refill that runs now is making these
    very processes: waiting for it costs no more than forking a second set beside it, which
    would double the kernel's descriptors (about a dozen a process while it starts) and compete
    for the same cores. So the cell waits as long as the refill gets on, and gives up only where
    a fork request would be called stuck: a shorter fixed wait lets a cell on a loaded machine
    fork beside the refill, and run out of descriptors. That includes the refill's first step,
    offering the notebook's modules: its fork requests would wait behind that offer in the
    forkserver anyway."""
    thread = _worker
    while thread is not None and thread.is_alive():
        thread.join(0.05)
        if time.monotonic() - _progress_at > starter.answer_limit():
            break
    got: list[Plumbing] = []
    with _lock:
        while _stock and len(got) < n:
            spare = _stock.pop(0)
            if spare.process.exitcode is None:
                got.append(spare)
            else:
                spare.discard()
    return got


def refill(n: int) -> None:
    """Fork spares in the background until ``min(n, limit())`` wait."""
    global _worker, _progress_at
    want = min(n, limit())
    if want <= 0 or (_worker is not None and _worker.is_alive()):
        return

    def work():
        global _progress_at
        try:
            ctx = starter.context("forkserver")
            with starter.offering():
                offered = preload.offer(ctx, starter.start)
            if offered:  # the notebook's new modules, imported before these forks
                with _lock:  # spares forked before lack them
                    outdated = list(_stock)
                    _stock.clear()
                for spare in outdated:
                    spare.discard()
            with _lock:
                missing = want - len(_stock)
            if missing <= 0:
                return
            _progress_at = time.monotonic()
            made = []
            try:
                for _ in range(missing):
                    made.append(Plumbing(ctx, duplex=True, spare=True))
            except OSError:  # out of descriptors: fewer spares, none leaked
                for p in made:
                    p.discard()
                return
            try:
                starter.start_all([p.process for p in made], limit=starter.answer_limit())
            finally:
                for p in made:
                    p.close_child_ends()
            _progress_at = time.monotonic()
            for p in made:
                ready = p.started and _said_ready(p)
                _progress_at = time.monotonic()
                with _lock:
                    if ready:
                        _stock.append(p)
                    else:
                        p.discard()
        except Exception:
            pass  # spares only save time: the next launch forks its ranks itself

    _progress_at = time.monotonic()
    _worker = threading.Thread(target=work, name="nbddp-spares", daemon=True)
    _worker.start()


def _said_ready(p: Plumbing, timeout: float = 10.0) -> bool:
    try:
        return p.ctl.poll(timeout) and p.ctl.recv() == (msg.READY,)
    except (EOFError, OSError):
        return False


def settle(timeout: float = 10.0) -> None:
    """Wait until no spare is being forked (tests and benchmarks compare process lists)."""
    thread = _worker
    if thread is not None:
        thread.join(timeout)


def clear() -> None:
    """End every waiting spare (kernel exit, tests), after a refill in flight has added its own."""
    settle()
    with _lock:
        spares = list(_stock)
        _stock.clear()
    for spare in spares:
        spare.discard()


def pids() -> list[int]:
    with _lock:
        return [p.process.pid for p in _stock]


atexit.register(clear)
