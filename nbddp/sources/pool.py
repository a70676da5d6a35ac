"""Persistent workers: ranks that keep their model, optimizer and process group between cells,
like ipyparallel's engines, with nbddp's environment, views and diagnostics. ``PoolRanks`` is a
process source under nbddp/sources/supervisor.py, one supervised launch per cell; the ranks serve
cell after cell (worker._serve) and each cell gets a fresh RunResult. A rank that dies (or does
not return from an interrupt) breaks the pool, as its process group cannot be mended: the cell
raises, ``status()`` says why, ``restart()`` brings up a clean pool."""
from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from typing import TypeVar

from nbddp.core import diagnosis, messages as msg, placement
from nbddp.core.cellnames import log_label
from nbddp.core.exitstates import ended_by_nbddp, ended_by_the_stop, settle
from nbddp.core.job import Cell
from nbddp.core.launch import Launch
from nbddp.core.rankfiles import RankFiles
from nbddp.core.result import FAILED, INTERRUPTED, OK, RUNNING, TIMED_OUT, Interrupted, RunResult, launch_result
from nbddp.core.spec import LaunchSpec
from nbddp.core.states import PoolState, StopReason
from nbddp.core.summary import label
from nbddp.forkserver import storehost
from nbddp.kernel import logdirs
from nbddp.kernel.cellfiles import cell_files
from nbddp.sources import stacks, supervisor
from nbddp.sources.rankjobs import rank_jobs
from nbddp.sources.rankprocs import Rank, RankProcs
from nbddp.sources.rendezvous import host_for
from nbddp.sources.supervisor import Source, Supervisor

FAILED_PEER_GRACE_S = 3.0  # a rank raised: how long the others may finish before being interrupted
STOP_WAIT_S = 2.0          # a polite "stop" before signals
RELEASE_WAIT_S = 3.0       # a released rank returns from its collective at once; past this it is stuck for good
# An NCCL collective waits on the GPU's stream, not on a connection nbddp can close; releasing it
# would need ProcessGroupNCCL's abort, which has not run on a GPU here: the pool ends, saying so.
NCCL_NOT_RELEASED = ("nbddp releases a hung collective on gloo only: an nccl collective waits on the GPU, "
                     "which closing the group's connections does not end, so the pool is ended "
                     "(%ddp_pool restart; its state is lost)")
IDLE, BUSY, BROKEN, STOPPED = PoolState


class PoolRanks(Source):
    """The pool's processes; one cell at a time is their launch."""

    FIRST_SIGNAL = dict.fromkeys(StopReason, signal.SIGINT)
    persistent = True

    def __init__(self, pool: LivePool):
        self.pool = pool
        self.procs = RankProcs(on_exit=self._on_exit, on_message=self._on_message, emit=self.emit)
        self.pending: set[int] = set()
        self.peer_failed_at: float | None = None
        self.deferred: dict[int, tuple[str, str]] = {}  # SIGINT for ranks that have not begun
        self.cell: Cell | None = None  # the next cell, sent to the ranks in ``targets``
        self.targets: list[int] = []
        self.released_at: float | None = None  # when nbddp closed the ranks' process group (this cell)
        self.released_for = ""  # the stop's reason then

    @property
    def interrupted_note(self) -> str:
        return ("interrupted: ranks did not stop in time, so the pool was ended" if self.pool.state == BROKEN
                else "interrupted: the cell was stopped on every rank")

    # ----------------------------------------------------------------- a cell
    def _start(self) -> None:
        """Hand the cell to its ranks (they are running already)."""
        self.emit("launch_started", self.result, self.pool.spec, self.pool.backend)
        if self.pool.group_closed_in:
            self.note(f"the process group was closed to release cell {self.pool.group_closed_in}'s blocked "
                      f"collective, and destroyed on every rank: create it again (dist.init_process_group)")
            self.pool.group_closed_in = 0
        self.released_at = None
        targets = self.targets
        warning = diagnosis.collective_warning(self.source_text, targets, self.pool.spec.world_size)
        if warning:
            self.note(warning)
        self.pending, self.peer_failed_at, self.deferred = set(), None, {}
        for rank in self.procs.ranks:
            res = rank.result
            rank.stop, rank.sent, rank.ended, rank.began = None, set(), False, False
            if res.rank in targets and rank.alive:
                res.state, res.started_at = RUNNING, time.time()
                try:
                    rank.ctl.send((msg.EXEC, self.cell))
                except (OSError, ValueError, AttributeError):
                    continue  # it died meanwhile: its exit breaks the pool
                self.pending.add(res.rank)
                self.emit("rank_started", res)
            elif res.rank not in targets:
                res.state, res.cause = OK, diagnosis.NOT_TARGETED

    def busy(self) -> bool:
        return bool(self.pending) and any(r.alive for r in self.procs.ranks)

    def poll(self, timeout: float) -> None:
        self.procs.poll(timeout)
        if self.released_at is not None and time.monotonic() - self.released_at > RELEASE_WAIT_S:
            self._end_stuck(self.released_for, "when the pool was ended")

    def _on_message(self, rank: Rank, message) -> None:
        if message[0] == msg.BEGAN:  # the rank runs the cell: an interrupt that waited goes now
            rank.began = True
            if rank.result.rank in self.deferred:
                self.procs.signal([rank], signal.SIGINT, *self.deferred.pop(rank.result.rank))
            return
        if message[0] != msg.DONE:
            return
        self.procs.drain_now(rank)
        rank.ended = True
        res = rank.result
        self.pending.discard(res.rank)
        res.ended_at = time.time()
        if message[1] == msg.DONE_OK:
            res.state, res.cause = OK, ""
        elif self.released_at is not None and message[1] == msg.DONE_INTERRUPTED:
            res.state = TIMED_OUT if self.result.timed_out else INTERRUPTED
            res.cause = "released from a blocked collective; its process group was closed"
        elif ended_by_the_stop(rank.stop, message[1] == msg.DONE_INTERRUPTED and signal.SIGINT in rank.sent,
                               res.exception):
            res.state = TIMED_OUT if self.result.timed_out else INTERRUPTED
            res.cause = "stopped in the cell"
        else:
            res.state, res.exitcode = FAILED, None
            res.cause = diagnosis.describe_failure(res.exception, None)
            if self.peer_failed_at is None and self.pending:
                self.peer_failed_at = time.monotonic()
        self.emit("rank_exited", res)

    def _on_exit(self, rank: Rank) -> None:
        res = rank.result
        was_pending = res.rank in self.pending
        self.pending.discard(res.rank)
        if was_pending or self.pool.state != BUSY:
            settle(res, rank.stop, rank.sent)
            if was_pending and rank.stop is not None and ended_by_nbddp(res.exitcode, res.exception, rank.sent):
                res.cause = "did not return from the cell; the pool was ended"
            self.emit("rank_exited", res)
        self.pool.rank_ended(f"rank {res.rank} {res.cause or res.state} "
                             f"{'during' if was_pending else 'after'} cell {self.pool.cells_run}")

    def failure(self) -> str | None:
        if not self.pending:
            return None
        died = next((r.result for r in self.procs.ranks if not r.alive and r.stop is None), None)
        if died is not None:
            return f"after rank {died.rank} ended"
        if self.peer_failed_at is not None and time.monotonic() - self.peer_failed_at > FAILED_PEER_GRACE_S:
            who = [r.rank for r in self.result.ranks if r.state == FAILED]
            self.note(f"rank {who[0]} failed in this cell while {label(self.pending)} "
                      f"{'were' if len(self.pending) > 1 else 'was'} still running it; interrupting them")
            return f"after rank {who[0]} failed"
        return None

    def signal(self, sig: int, reason: str, why: str, spare_handlers: bool = False) -> None:
        """SIGINT: the ranks still in the cell. Anything harder ends the whole pool: a rank
        that did not return from the cell leaves a process group that cannot be mended."""
        if sig == signal.SIGINT:  # a rank that has not begun the cell yet gets it when it does
            pending = [r for r in self.procs.ranks if r.result.rank in self.pending]
            for rank in pending:
                self.procs.read_ctl(rank)
            self.procs.signal([r for r in pending if r.began], sig, reason, why)
            for rank in pending:
                if not rank.began and rank.result.rank in self.pending:
                    rank.stop = rank.stop or (reason, why)
                    self.deferred[rank.result.rank] = (reason, why)
            return
        stuck = [r for r in self.procs.ranks if r.alive and r.result.rank in self.pending]
        if not stuck or (spare_handlers and all(r.handling() for r in stuck)):
            return
        if self.released_at is None and self._release(stuck, reason):
            return  # poll() ends the pool if they do not return within RELEASE_WAIT_S
        if self.released_at is not None and time.monotonic() - self.released_at <= RELEASE_WAIT_S:
            return
        self._end_stuck(reason, "when the pool was ended", sig)

    def _release(self, stuck: list[Rank], reason: str) -> bool:
        """Ranks blocked in C after SIGINT (a collective some rank never joined): every rank
        closes its process group's connections, so the blocked call raises and the cell ends on
        each, keeping the ranks and their state (nbddp/rank/release.py). False where a stuck
        rank cannot be asked (no FIFO) or the pool's backend is nccl: the pool is ended as before."""
        if self.pool.backend == "nccl":  # untested on a GPU: say why instead of trying
            self.note(NCCL_NOT_RELEASED)
            return False
        asked = [stacks.ask_release(r.stack_path) for r in stuck]
        if not all(asked):
            return False
        for rank in self.procs.ranks:
            if rank.alive and rank not in stuck:
                stacks.ask_release(rank.stack_path)  # its side of the group is closed too
        self.released_at, self.released_for = time.monotonic(), reason
        self.pool.group_closed_in = self.pool.cells_run
        self.note(f"{label(r.result.rank for r in stuck)} did not return from the cell after SIGINT "
                  f"(blocked in C code such as a collective): nbddp closes the process group's "
                  f"connections to release {'them' if len(stuck) > 1 else 'it'}, keeping every rank "
                  f"and its state")
        return True

    def _end_stuck(self, reason: str, why: str, sig: int | None = None) -> None:
        stuck = [r for r in self.procs.ranks if r.alive and r.result.rank in self.pending]
        released, self.released_at = self.released_at, None
        if not stuck:
            return
        if released is not None:
            self.note(f"{label(r.result.rank for r in stuck)} did not return even then (not blocked on "
                      f"the process group): the pool is ended")
        self.pool.ranks_stuck(f"{label(r.result.rank for r in stuck)} "
                              f"did not stop after SIGINT ({reason}), blocked in C code such as a collective")
        self.procs.signal(self.procs.ranks, signal.SIGKILL if sig is None else sig, reason, why)

    def handling(self) -> list[int]:
        return [r.result.rank for r in self.procs.ranks if r.result.rank in self.pending and r.handling()]

    def kill_now(self) -> None:
        self.procs.kill_now()

    def asking_ranks(self):
        return self.procs

    def stack_targets(self) -> list:
        return [(r.result, r.process.pid, r.stack_path) for r in self.procs.ranks
                if r.alive and r.started and r.result.rank in self.pending]

    def close(self) -> None:
        for rank in self.procs.ranks:
            for log in rank.logs.values():
                log.flush()

    def finish(self) -> None:
        self.pool.cell_ended(all(r.alive for r in self.procs.ranks))
        if self.pool.state == BROKEN:
            rest = [r for r in self.procs.ranks if r.alive]  # their process group is gone
            self.procs.signal(rest, signal.SIGKILL, StopReason.FAILFAST, "when the pool broke")
            for rank in rest:
                self.procs.reap(rank, wait=5.0)


_Pool = TypeVar("_Pool", bound="LivePool")  # start() and restart() return the pool they are called on


class LivePool:
    """The pool's ranks between cells and all of its state (IDLE, BUSY, BROKEN and why, STOPPED),
    written here only: PoolRanks reports what its ranks did through ``rank_ended``,
    ``ranks_stuck`` and ``cell_ended``. ``spec``: checked already (nbddp/pool.py's Pool)."""

    def __init__(self, spec: LaunchSpec, *, cwd: str | None = None, base_env: dict | None = None):
        self.spec = replace(spec, timeout=None, ranks_shown=None, push=(), pull=())
        self.cell_timeout = spec.timeout  # the start's --timeout: each cell's, unless it gives one
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.state = STOPPED
        self.why_broken = ""
        self.cells_run = 0
        self.started_wall = 0.0
        self.store = None
        self.master_port = None
        self.backend_note = ""
        self.group_closed_in = 0  # the cell whose hang nbddp released by closing the group (0: none)
        self.source = PoolRanks(self)

    # ------------------------------------------------ what its ranks report (PoolRanks)
    def rank_ended(self, why: str) -> None:
        """A rank's process ended: its process group cannot be mended (unless the pool stops)."""
        if self.state != STOPPED:
            self.state = BROKEN
            self.why_broken = self.why_broken or why

    def ranks_stuck(self, why: str) -> None:
        """Ranks did not return from the cell after SIGINT: the pool is ended."""
        if self.state != BROKEN:
            self.state, self.why_broken = BROKEN, why

    def cell_ended(self, all_alive: bool) -> None:
        """The cell's launch is over: ready for the next one, or broken."""
        if self.state == BUSY:
            self.state = IDLE if all_alive else BROKEN
        if self.state == BROKEN and not self.why_broken:
            self.why_broken = f"a rank ended during cell {self.cells_run}"

    @property
    def ready(self) -> bool:
        """Started, not broken, and not running a cell: the next cell can run."""
        return self.state == IDLE

    @property
    def ranks(self) -> list[Rank]:
        """The pool's rank handles (each with its current ``result``)."""
        return self.source.procs.ranks

    # --------------------------------------------------------------- lifecycle
    def start(self: _Pool) -> _Pool:
        if self.state in (IDLE, BUSY):
            return self
        interrupts = []
        with supervisor.sigint_deferred(lambda *_: interrupts.append(1)):
            try:
                self._start()
            except BaseException:
                self.stop()
                raise
            if interrupts:
                self.stop()
        if interrupts:
            raise Interrupted("nbddp: interrupted while starting the pool; its ranks were stopped")
        return self

    def _start(self) -> None:
        spec = self.spec
        self.source = source = PoolRanks(self)
        self.log_root = logdirs.new_log_dir(spec.log_dir, hold=True)  # kept while the pool lives
        self.store, port = host_for(spec)
        self.master_port = port
        plan = placement.plan(spec, storehost.device_count(), self.base_env)
        self.backend, self.backend_note = plan.backend, plan.note
        source.result = self._fresh_result(self.log_root)
        supervisor.register(source)
        files = RankFiles(self.log_root)
        first = Cell(source="", path=files.cell_copy)  # each cell comes as msg.EXEC with its own
        jobs = rank_jobs(spec, files, first, master_port=port, cwd=self.cwd, base_env=self.base_env,
                         plan=plan, pool=True)
        ranks = [Rank(res, job.stack_path, job.sigint_path) for res, job in zip(source.result.ranks, jobs, strict=True)]
        restarted = source.procs.start(ranks, jobs, spec.start_method, duplex=True, use_spares=False)
        if restarted:
            print(f"nbddp: {restarted}")
        self.started_wall = time.time()
        self.state, self.why_broken, self.cells_run = IDLE, "", 0

    def stop(self) -> None:
        """End every rank (a polite 'stop' first, then signals) and release the port."""
        with supervisor.sigint_deferred(lambda *_: self.source.kill_now()):  # again: no more grace
            self.state = STOPPED
            procs = self.source.procs
            for rank in procs.ranks:
                if rank.alive and rank.ctl is not None:
                    try:
                        rank.ctl.send((msg.STOP,))
                    except (OSError, ValueError):
                        pass
            deadline = time.monotonic() + STOP_WAIT_S
            while any(r.alive for r in procs.ranks) and time.monotonic() < deadline:
                procs.poll(0.05)
            procs.close()  # SIGKILL for what is left
            supervisor.unregister(self.source)
            self.source = PoolRanks(self)
            self.store = None
            logdirs.release(getattr(self, "log_root", None))  # its logs now age like any launch's

    def restart(self: _Pool) -> _Pool:
        self.stop()
        return self.start()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def status(self) -> str:
        spec = self.spec
        shape = f"{spec.world_size} ranks ({spec.nnodes} node{'s' if spec.nnodes > 1 else ''} x {spec.nproc_per_node})"
        if self.state == STOPPED:
            return "nbddp pool: stopped"
        up = time.time() - self.started_wall
        lines = [f"nbddp pool: {shape}, {self.state}; up {up:.0f} s, {self.cells_run} cells run, "
                 f"MASTER_PORT {self.master_port}, logs in {self.log_root}"]
        if self.cell_timeout is not None:
            lines.append(f"each cell times out after {self.cell_timeout:g} s unless it gives --timeout")
        if self.backend_note:
            lines.append(self.backend_note)
        if self.state == BROKEN:
            lines.append(f"broken: {self.why_broken}. Use %ddp_pool restart (or pool.restart()).")
        for rank in self.ranks:
            alive = "alive" if rank.alive else f"ended ({rank.result.cause or rank.result.state})"
            lines.append(f"  rank {rank.result.rank}: pid {rank.result.pid}, {alive}")
        return "\n".join(lines)

    # -------------------------------------------------------------------- cells
    def run_cell(self, launch: Launch) -> RunResult:
        """One cell, already checked against the pool (nbddp/core/launchrules.py choose_source), on
        ``spec.ranks_shown`` (default all ranks), with ``spec.timeout``, pulling ``spec.pull``'s names."""
        spec, source, sinks = launch.spec, launch.source, list(launch.sinks)
        push, cell_label = launch.push, launch.cell_label
        world = self.spec.world_size
        targets = sorted(set(range(world) if spec.ranks_shown is None else spec.ranks_shown))
        pull = [name.split("@")[0] for name in spec.pull]
        with cell_files(self.cwd, source, push) as files:  # pushed values, this cell's __file__
            script, payload = files.script, files.push
            self.cells_run += 1
            cell_dir = logdirs.new_cell_dir(self.log_root, self.cells_run)
            log_copy = RankFiles(cell_dir).cell_copy
            with open(log_copy, "w", opener=logdirs.private) as f:
                f.write(source)
            cell_path = script or log_copy
            src = self.source
            src.source_text, src.cell_path = source, cell_path
            src.cell_label = cell_label = cell_label or log_label(log_copy)
            src.result = self._fresh_result(cell_dir)
            src.result.script = cell_path
            for rank in src.procs.ranks:
                rank.open_logs()
            src.cell = Cell(source, cell_path, cell_label, payload, list(pull), post_mortem=spec.pdb,
                            theme=launch.traceback_theme, diff=list(spec.diff), diff_folder=launch.diff_folder)
            src.targets = targets
            self.state = BUSY
            try:
                return Supervisor(src, replace(self.spec, timeout=spec.timeout), sinks).run()
            finally:
                if self.state == BUSY:  # the supervisor ended before its source's finish()
                    self.state = IDLE if all(r.alive for r in src.procs.ranks) else BROKEN

    def _fresh_result(self, log_dir: str) -> RunResult:
        """This cell's RunResult, each rank's handle given its RankResult (its pid kept)."""
        result = launch_result(self.spec, log_dir, master_port=self.master_port)
        for res, handle in zip(result.ranks, self.ranks, strict=False):  # no handles yet while the pool starts
            res.pid = handle.result.pid
            handle.result = res
        return result


def run(launch: Launch) -> RunResult:
    """The pool's entry in nbddp/api.py's table of sources: the cell on the started pool's ranks."""
    return launch.pool.run_cell(launch)
