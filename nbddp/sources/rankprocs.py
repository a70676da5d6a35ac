"""The plumbing of nbddp's own rank processes (forkserver or spawn), shared by fresh launches
(nbddp/sources/forkranks.py) and pools (nbddp/sources/pool.py): start them (spares first), read their pipes
and control messages, see them exit, signal their process groups, and close everything.

It decides nothing: what an exit or a message means is the source's business (``on_exit``,
``on_message``), when to signal is the supervisor's.
"""
from __future__ import annotations

import os
import selectors
import signal
import time
from typing import Any

from nbddp.core import messages as msg
from nbddp.core.exitstates import Stop
from nbddp.core.job import RankJob
from nbddp.core.result import RUNNING, RankResult
from nbddp.forkserver import spares, starter
from nbddp.sources import descriptors, exitstatus, ranklogs

READ_CHUNK = 1 << 16
DRAIN_LIMIT_S = 2.0  # waiting for pipes held open by something that escaped the group


class Rank:
    """One rank process and its pipes, as the launcher holds them."""

    def __init__(self, result: RankResult, stack_path: str, sigint_path: str):
        self.result = result
        self.stack_path = stack_path
        self.sigint_path = sigint_path  # the worker touches it when SIGINT runs Python code
        self.process: Any = None  # a multiprocess Process (untyped)
        self.fds: dict[int, str] = {}
        self.ctl: Any = None      # its multiprocess Connection (untyped)
        self.lifeline_w: int | None = None
        self.logs: dict[str, ranklogs.RankLog] = {}
        self.budget: ranklogs.LogBudget | None = None  # the launch's caps on its logs
        self.started = False  # said msg.STARTED: setsid done, user code may run
        self.alive = False
        self.ended = False    # reported the end of its user code (exception / exit / done)
        self.reported: int | None = None  # the exit code it said it exits with
        self.pidfd: int | None = None     # readable once the process has ended
        self.orphan = False   # its forkserver ended: no exit status comes; watched by pidfd
        self.began = False    # a pool rank: began the current cell
        self.finished: tuple[int, float] | None = None  # (its exit code, when): the cell is over, the process exiting
        self.lingered = False  # nbddp ended it after its cell finished (it did not exit)
        self.stop: Stop | None = None  # (reason, why) once nbddp signalled it
        self.sent: set[int] = set()

    def open_logs(self, budget: ranklogs.LogBudget | None = None) -> None:
        """This launch's (or pool cell's) log files, made empty now and held open only once the
        rank writes (nbddp/sources/ranklogs.py: bounded, a failed write ends only the log)."""
        self.close_logs()
        self.budget = budget or self.budget or ranklogs.LogBudget(lambda text: None)
        name = f"rank {self.result.rank}"
        self.logs = {"stdout": ranklogs.RankLog(self.result.stdout_path, self.budget, name),
                     "stderr": ranklogs.RankLog(self.result.stderr_path, self.budget, name)}

    def close_logs(self) -> None:
        for log in self.logs.values():
            log.close()
        self.logs = {}

    def handling(self) -> bool:
        """Running the cell's interrupt handler: SIGINT reached Python code, and the user's
        code has not ended yet."""
        return self.alive and not self.ended and os.path.exists(self.sigint_path)


class RankProcs:
    """The processes of a launch's ranks. ``on_message(rank, message)`` gets what the common
    handling leaves (e.g. a pool's ``msg.DONE``); ``on_exit(rank)`` is called once a rank has exited."""

    def __init__(self, on_exit, on_message=None, emit=None):
        self.ranks: list[Rank] = []
        self.selector = selectors.DefaultSelector()
        self.on_exit = on_exit
        self.on_message = on_message or (lambda rank, message: None)
        self.emit = emit or (lambda *args: None)
        self.asked: list[tuple] = []  # (rank number, ask id, prompt, purpose) not taken yet
        self.budget = ranklogs.LogBudget(lambda text: self.emit("note", text))

    # ---------------------------------------------------------------- startup
    def start(self, ranks: list[Rank], jobs: list[RankJob], start_method: str, duplex: bool,
              use_spares: bool) -> str | None:
        """Start every rank at once with its job (nbddp/core/job.py). Ranks are known here before
        anything starts, so whatever did start is ended by ``kill_now``/``close``. Returns a
        line to show if the forkserver had died and a new one was started."""
        ctx = starter.context(start_method)
        restarted = starter.ensure_forkserver() if start_method == "forkserver" else None
        ready = spares.take(len(ranks)) if use_spares else []
        made = []
        try:
            descriptors.fit(len(ranks), len(ready))  # refused, saying what it needs, before any starts
            for i, rank in enumerate(ranks):
                rank.open_logs(self.budget)
                plumbing = ready[i] if i < len(ready) else spares.Plumbing(ctx, duplex=duplex)
                made.append(plumbing)
        except BaseException:  # out of descriptors half-way (or interrupted): nothing started yet
            for plumbing in ready + made[len(ready):]:
                plumbing.discard()
            for rank in ranks:
                rank.close_logs()
            raise
        self.ranks.extend(ranks)
        for rank, plumbing in zip(ranks, made, strict=True):
            rank.process, rank.ctl, rank.lifeline_w = plumbing.process, plumbing.ctl, plumbing.life_w
        for rank, plumbing, job in zip(ranks[:len(ready)], made, jobs, strict=False):  # the spares (first) begin now
            plumbing.send_job(job)
            self._watch(rank, plumbing)
        fresh = list(zip(ranks, made, jobs, strict=True))[len(ready):]
        try:
            restarted = self._start_fresh(fresh, ctx, start_method, duplex) or restarted
        finally:  # also after a failed start: the started ranks are watched (and ended)
            for rank, plumbing, job in fresh:
                plumbing.close_child_ends()
                if not plumbing.started:
                    plumbing.discard()
                    rank.process = rank.ctl = rank.lifeline_w = None
                    continue
                plumbing.send_job(job)
                self._watch(rank, plumbing)
        return restarted

    @staticmethod
    def _start_fresh(fresh: list, ctx, start_method: str, duplex: bool) -> str | None:
        """Fork ``fresh`` [(rank, plumbing, job)]; a forkserver that does not answer in time is
        ended, and the ranks start on a new one, as they do when it ends under them (``fresh``
        then holds their new plumbing). Returns the line to show when that happened."""
        limit = starter.answer_limit() if start_method == "forkserver" else None
        try:
            starter.start_all([plumbing.process for _, plumbing, _ in fresh], limit=limit)
            return None
        except starter.ForkserverStuck as stuck:
            for i, (rank, plumbing, job) in enumerate(fresh):
                if not plumbing.started:
                    plumbing.discard()
                    plumbing = spares.Plumbing(ctx, duplex=duplex)
                    rank.process, rank.ctl, rank.lifeline_w = plumbing.process, plumbing.ctl, plumbing.life_w
                    fresh[i] = (rank, plumbing, job)
            starter.ensure_forkserver()
            starter.start_all([plumbing.process for _, plumbing, _ in fresh if not plumbing.started],
                              limit=starter.FIRST_ANSWER_S)
            return stuck.line

    def _watch(self, rank: Rank, plumbing) -> None:
        res = rank.result
        rank.alive = True
        res.pid, res.state, res.started_at = rank.process.pid, RUNNING, time.time()
        rank.fds = {plumbing.out_r: "stdout", plumbing.err_r: "stderr"}
        for fd, stream in rank.fds.items():
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ, ("out", rank, stream))
        self.selector.register(rank.ctl.fileno(), selectors.EVENT_READ, ("ctl", rank, None))
        self.selector.register(rank.process.sentinel, selectors.EVENT_READ, ("exit", rank, None))
        rank.pidfd = exitstatus.pidfd(rank.process.pid)
        self.emit("rank_started", res)

    # ------------------------------------------------------------------- loop
    def poll(self, timeout: float, exits: bool = True) -> None:
        if exits:  # orphans without a pidfd are looked at each time
            for rank in self.ranks:
                if rank.orphan and rank.alive and rank.pidfd is None:
                    self.reap(rank)
        for key, _ in self.selector.select(timeout=timeout):
            kind, rank, stream = key.data
            if kind == "out":
                self.read_output(key.fd, rank, stream)
            elif kind == "ctl":
                self.read_ctl(rank)
            elif exits:
                self.reap(rank)

    def read_output(self, fd: int, rank: Rank, stream: str) -> bool:
        """Read one chunk; False when nothing was there (or the pipe closed)."""
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._forget(fd)
            rank.fds.pop(fd, None)
            os.close(fd)
            return False
        rank.logs[stream].write(data)
        self.emit("output", rank.result.rank, stream, data)
        return True

    def drain_now(self, rank: Rank) -> None:
        """Read what the rank wrote before its last message (already in the pipes)."""
        for fd, stream in list(rank.fds.items()):
            while fd in rank.fds and self.read_output(fd, rank, stream):
                pass

    def read_ctl(self, rank: Rank) -> None:
        conn = rank.ctl
        if conn is None:
            return
        try:
            while conn.poll(0):
                self._on_message(rank, conn.recv())
        except (EOFError, OSError):
            self._forget(conn.fileno())
            conn.close()
            rank.ctl = None
        except Exception as exc:  # a message that cannot be unpickled here
            self.emit("note", f"rank {rank.result.rank}: could not read a message from the worker: {exc}")

    def _on_message(self, rank: Rank, message) -> None:
        kind, res = message[0], rank.result
        if kind == msg.STARTED:
            rank.started = True
        elif kind == msg.EXCEPTION:
            res.exception = message[1]
            rank.ended = True
        elif kind == msg.EXIT:
            rank.ended = True
            rank.reported = message[1]
        elif kind == msg.FINISHED:
            rank.finished = (message[1], time.monotonic())
        elif kind == msg.RETURN:
            res.value = message[1]
        elif kind == msg.FAKE:
            res.fake = message[1]
        elif kind == msg.GPU_MEMORY:
            res.gpu_memory = message[1]
        elif kind == msg.PULLED:  # the names it has; then, if any could not be sent, why not
            res.pulled.update(message[1])
            res.pull_errors.update(message[2] if len(message) > 2 else {})
        elif kind == msg.RETURN_ERROR:
            self.emit("note", f"rank {res.rank}: {message[1]}")
        elif kind == msg.DISPLAY:
            self.emit("display", res.rank, message[1])
        elif kind == msg.ASK:  # input() or pdb: the supervisor's prompts (nbddp/sources/asking.py)
            self.asked.append((res.rank, *message[1:]))
        elif kind == msg.LEFT_DEBUGGER:
            self.asked.append((res.rank, None, None, msg.LEFT_DEBUGGER))
        else:
            self.on_message(rank, message)

    # ---------------------------------------------------------------- prompts
    def take_asked(self) -> list[tuple]:
        """The ranks' prompts since the last call: (rank number, ask id, prompt, purpose), and
        (rank number, None, None, msg.LEFT_DEBUGGER) where a rank's user left its debugger."""
        asked, self.asked = self.asked, []
        return asked

    def waits_for_answer(self, number: int) -> bool:
        """Rank ``number`` is alive and can be answered (its control pipe is open)."""
        rank = self._by_number(number)
        return rank is not None and rank.alive and rank.ctl is not None

    def answer(self, number: int, message) -> None:
        rank = self._by_number(number)
        if rank is not None and rank.ctl is not None:
            try:
                rank.ctl.send(message)
            except (OSError, ValueError):
                pass  # it ended meanwhile: its exit is seen like any other

    def drain_rank(self, number: int) -> None:
        """Read what rank ``number`` wrote before it asked (its pdb listing before its prompt)."""
        rank = self._by_number(number)
        if rank is not None:
            self.drain_now(rank)

    def _by_number(self, number: int) -> Rank | None:
        return next((r for r in self.ranks if r.result.rank == number), None)

    def reap(self, rank: Rank, wait: float = 0.0) -> None:
        """The rank's process exited (or must be waited for, up to ``wait`` seconds): record
        it, sweep its group. When its forkserver has ended, the status pipe closes while the
        rank may still run: that is no exit; the rank is watched until its process ends, and
        its code is the one it reported (none if it was killed before it could say)."""
        if not rank.alive:
            return
        if not rank.orphan:
            self._forget(rank.process.sentinel)
            rank.process.join(5)
            if exitstatus.lost(rank.process):
                rank.orphan = True
            elif rank.process.exitcode is None:  # unkillable for now (D state): try again later
                self.selector.register(rank.process.sentinel, selectors.EVENT_READ, ("exit", rank, None))
                return
        if rank.orphan:
            if rank.pidfd is not None:
                self._forget(rank.pidfd)
            if not exitstatus.wait_ended(rank.pidfd, rank.process.pid, wait):
                if rank.pidfd is not None:
                    self.selector.register(rank.pidfd, selectors.EVENT_READ, ("exit", rank, None))
                return
        rank.alive = False
        if rank.started:  # whatever the rank started and left behind in its group
            self._kill(rank, signal.SIGKILL, group_only=True)
        self.read_ctl(rank)
        res = rank.result
        res.exitcode = rank.reported if rank.orphan else rank.process.exitcode
        res.ended_at = time.time()
        self.on_exit(rank)

    # --------------------------------------------------------------- signals
    def signal(self, ranks, sig: int, reason: str, why: str) -> None:
        """``sig`` to each rank's process group; a rank that has not started its user code yet
        has nothing to be asked politely: it gets SIGKILL. Every rank is marked stopped before
        the first signal goes, and the signals go back to back: a rank whose peer ended under it
        raises within milliseconds, and that is nbddp's stop, not a failure of its own."""
        chosen = []
        for rank in ranks:
            if not rank.alive:
                continue
            self.read_ctl(rank)  # a STARTED already sent counts
            if rank.stop is None:
                rank.stop = (reason, why)
            if sig == signal.SIGINT and rank.started:
                try:
                    os.unlink(rank.sigint_path)  # an earlier cell's acknowledgement
                except OSError:
                    pass
            actual = sig if rank.started else signal.SIGKILL
            rank.sent.add(actual)
            chosen.append((rank, actual))
        for rank, actual in chosen:
            self._kill(rank, actual)

    def kill_rank(self, rank: Rank) -> None:
        rank.sent.add(signal.SIGKILL)
        self._kill(rank, signal.SIGKILL)

    def kill_now(self) -> None:
        for rank in self.ranks:
            if rank.alive:
                self.kill_rank(rank)

    def _kill(self, rank: Rank, sig: int, group_only: bool = False) -> None:
        pid = rank.process.pid if rank.process is not None else None
        if pid is None:
            return
        try:
            if rank.started:
                os.killpg(pid, sig)
            elif not group_only:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    # ---------------------------------------------------------------- closing
    def close(self) -> None:
        """Reap every rank (SIGKILL for those still alive), drain the pipes, close everything."""
        for rank in self.ranks:
            if rank.alive:
                self.kill_rank(rank)
                self.reap(rank, wait=5.0)
        deadline = time.monotonic() + DRAIN_LIMIT_S
        while any(rank.fds for rank in self.ranks) and time.monotonic() < deadline:
            self.poll(0.05, exits=False)
        for rank in self.ranks:
            for fd in list(rank.fds):
                self._forget(fd)
                os.close(fd)
            rank.fds.clear()
            if rank.ctl is not None:
                self.read_ctl(rank)
            if rank.ctl is not None:
                self._forget(rank.ctl.fileno())
                rank.ctl.close()
                rank.ctl = None
            if rank.lifeline_w is not None:
                os.close(rank.lifeline_w)
                rank.lifeline_w = None
            if rank.pidfd is not None:
                self._forget(rank.pidfd)
                os.close(rank.pidfd)
                rank.pidfd = None
            rank.close_logs()
            if rank.process is not None and rank.process.exitcode is not None:
                rank.process.close()
        self.selector.close()

    def _forget(self, fd: int) -> None:
        try:
            self.selector.unregister(fd)
        except (KeyError, ValueError):
            pass
