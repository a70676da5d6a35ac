"""Persistent workers: ranks that keep their model, optimizer and process group between cells,
like ipyparallel's engines, with nbddp's environment, views and diagnostics.

A Pool is a Launch whose ranks serve cell after cell (worker._serve) instead of running one
source; per cell it hands out a fresh RunResult, so ``_ddp``, views and DDPError work as for a
fresh job. A rank that dies breaks the pool (its process group cannot be mended): the cell
raises, ``status()`` says what happened, ``restart()`` brings up a clean pool.
"""
from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import replace

from IPython.core.error import UsageError

from . import diagnosis, launcher, logdirs, placement, pushing
from .launcher import INTERRUPT_GRACE_S, Launch, new_log_dir
from .rendezvous import host_store
from .result import FAILED, INTERRUPTED, OK, RUNNING, TIMED_OUT, RankResult, RunResult
from .spec import LaunchSpec, make_spec

FAILED_PEER_GRACE_S = 3.0  # a rank raised: how long the others may finish before being interrupted
IDLE, BUSY, BROKEN, STOPPED = "ready", "running a cell", "broken", "stopped"


class Pool(Launch):
    """``Pool(n=4).start()``, then ``pool.run(source)`` as often as needed, then ``stop()``."""

    def __init__(self, spec: LaunchSpec | None = None, *, cwd: str | None = None,
                 base_env: dict | None = None, **options):
        spec = spec or make_spec(**options)
        super().__init__(replace(spec, timeout=None, ranks_shown=None, push=(), pull=()),
                         source="", cwd=cwd, base_env=base_env)
        self.pool_mode = True
        self.state = STOPPED
        self.why_broken = ""
        self.cells_run = 0
        self.started_wall = 0.0
        self.store = None
        self.pending: set[int] = set()
        self.peer_failed_at: float | None = None

    # --------------------------------------------------------------- lifecycle
    def start(self) -> "Pool":
        if self.state in (IDLE, BUSY):
            return self
        spec = self.spec
        self.log_root = new_log_dir(spec.log_dir, hold=True)  # kept while the pool lives
        self.store, port = host_store(spec.master_addr, spec.master_port)
        plan = placement.plan(spec, placement.cuda_device_count(), self.base_env)
        self.backend, self.backend_note = plan.backend, plan.note
        self.result = self._fresh_result(self.log_root)
        self.result.master_port = port
        with launcher._live_lock:
            launcher._live.add(self)
        try:
            self._start_all(os.path.join(self.log_root, "cell.py"), port, str(uuid.uuid4()),
                            self.backend, self.log_root)
        except BaseException:
            self.stop()
            raise
        self.master_port = port
        self.started_wall = time.time()
        self.state, self.why_broken, self.cells_run = IDLE, "", 0
        return self

    def stop(self) -> None:
        """End every rank (a polite 'stop' first, then signals) and release the port."""
        for rank in self.ranks:
            if rank.alive and rank.ctl is not None:
                try:
                    rank.ctl.send(("stop",))
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + 2.0
        while any(r.alive for r in self.ranks) and time.monotonic() < deadline:
            for rank in self.ranks:
                if rank.alive and rank.process.exitcode is not None:
                    self._reap(rank)
            time.sleep(0.02)
        self.kill_now()
        for rank in self.ranks:
            if rank.alive:
                rank.process.join(5)
                self._reap(rank)
        if self.ranks:
            self._cleanup()
        self.ranks = []
        self.selector = __import__("selectors").DefaultSelector()
        with launcher._live_lock:
            launcher._live.discard(self)
        self.store = None
        self.state = STOPPED
        logdirs.release(getattr(self, "log_root", None))

    def restart(self) -> "Pool":
        self.stop()
        self.failing = None
        self.kill_deadline = None
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
        if getattr(self, "backend_note", ""):
            lines.append(self.backend_note)
        if self.state == BROKEN:
            lines.append(f"broken: {self.why_broken}. Use %ddp_pool restart (or pool.restart()).")
        for rank in self.ranks:
            alive = "alive" if rank.alive else f"ended ({rank.result.cause or rank.result.state})"
            lines.append(f"  rank {rank.result.rank}: pid {rank.result.pid}, {alive}")
        return "\n".join(lines)

    # -------------------------------------------------------------------- cells
    def run(self, source: str, *, ranks=None, timeout: float | None = None, push: dict | None = None,
            pull=(), sinks=(), check: bool = True, header: str = "") -> RunResult:
        """Run ``source`` on ``ranks`` (default all) of the live pool; returns this cell's RunResult."""
        if self.state == BROKEN:
            raise UsageError(f"%%ddp: the pool is broken ({self.why_broken}); run %ddp_pool restart, "
                             f"or %%ddp --fresh for a separate job")
        if self.state != IDLE:
            raise UsageError("%%ddp: no pool is running; start one with %ddp_pool start -n N")
        world = self.spec.world_size
        targets = sorted(set(range(world) if ranks is None else ranks))
        bad = [r for r in targets if not 0 <= r < world]
        if bad:
            raise UsageError(f"%%ddp: --ranks {','.join(map(str, bad))} outside 0..{world - 1}")
        payload = pushing.pack(push)  # one shared file, read by every rank
        self.cells_run += 1
        cell_dir = logdirs.new_cell_dir(self.log_root, self.cells_run)
        cell_path = os.path.join(cell_dir, "cell.py")
        with open(cell_path, "w", opener=logdirs.private) as f:
            f.write(source)
        self.source = source
        self.spec = replace(self.spec, timeout=timeout)
        self.sinks = list(sinks)
        self.result = self._fresh_result(cell_dir)
        self.failing = self.kill_deadline = self.peer_failed_at = None
        self.idle_warned = False
        self.last_output = time.monotonic()
        self._reopen_logs(cell_dir)
        self._emit("launch_started", self.result, self.spec, self.backend)
        warning = diagnosis.collective_warning(source, targets, world)
        if warning:
            self._note(warning)
        cell = {"source": source, "cell_path": cell_path, "push": payload, "pull": list(pull)}
        self.pending = set()
        self.state = BUSY
        for rank in self.ranks:
            res = rank.result
            if res.rank in targets:
                res.state, res.started_at = RUNNING, time.time()
                rank.ctl.send(("exec", cell))
                self.pending.add(res.rank)
                self._emit("rank_started", res)
            else:
                res.state, res.cause = OK, diagnosis.NOT_TARGETED
        try:
            try:
                self._pump()
            except KeyboardInterrupt:
                self._interrupt()
        finally:
            pushing.discard(payload)
            if self.state == BUSY:
                self.state = IDLE if all(r.alive for r in self.ranks) else BROKEN
            if self.state == BROKEN and not self.why_broken:
                self.why_broken = f"a rank ended during cell {self.cells_run}"
            for rank in self.ranks:
                for log in rank.logs.values():
                    log.flush()
        self.result.ended_at = time.time()
        diagnosis.add_hints(self.result)
        self._emit("launch_finished", self.result)
        if check:
            self.result.raise_for_status()
        return self.result

    def _fresh_result(self, log_dir: str) -> RunResult:
        spec = self.spec
        ranks = []
        for r in range(spec.world_size):
            res = RankResult(rank=r, local_rank=spec.local_rank_of(r), node_rank=spec.node_of(r))
            res.stdout_path = os.path.join(log_dir, f"rank{r}.stdout")
            res.stderr_path = os.path.join(log_dir, f"rank{r}.stderr")
            if r < len(self.ranks):
                res.pid = self.ranks[r].result.pid
                self.ranks[r].result = res
            ranks.append(res)
        return RunResult(ranks=ranks, world_size=spec.world_size, log_dir=log_dir,
                         master_port=getattr(self, "master_port", None), started_at=time.time())

    def _reopen_logs(self, cell_dir: str) -> None:
        for rank in self.ranks:
            for log in rank.logs.values():
                log.close()
            rank.logs = {"stdout": open(rank.result.stdout_path, "wb", opener=logdirs.private),
                         "stderr": open(rank.result.stderr_path, "wb", opener=logdirs.private)}

    # ------------------------------------------------------- Launch overrides
    def _busy(self) -> bool:
        return bool(self.pending) and any(r.alive for r in self.ranks)

    def _on_message(self, rank, message) -> None:
        if message[0] != "done":
            return super()._on_message(rank, message)
        self._drain_now(rank)
        res = rank.result
        self.pending.discard(res.rank)
        res.ended_at = time.time()
        if message[1] == "ok":
            res.state = OK
        elif message[1] == "interrupted":
            res.state, res.cause = (TIMED_OUT if self.result.timed_out else INTERRUPTED), "stopped in the cell"
        else:
            res.state, res.exitcode = FAILED, None
            res.cause = diagnosis.describe_failure(res.exception, None)
            if self.peer_failed_at is None and self.pending:
                self.peer_failed_at = time.monotonic()
        self._emit("rank_exited", res)

    def _drain_now(self, rank) -> None:
        """Read what the rank wrote before it said 'done' (already in the pipe)."""
        for fd, (stream, _) in list(rank.fds.items()):
            while self._read_output(fd, rank, stream) and fd in rank.fds:
                pass

    def _on_exit(self, rank) -> None:
        was_pending = rank.result.rank in self.pending
        super()._on_exit(rank)
        self.pending.discard(rank.result.rank)
        if self.state != STOPPED:
            self.state = BROKEN
            if not self.why_broken:
                self.why_broken = (f"rank {rank.result.rank} {rank.result.cause or rank.result.state} "
                                   f"{'during' if was_pending else 'after'} cell {self.cells_run}")
        # the ranks stopped because of it leave the pending set as they exit

    def _reap(self, rank) -> None:
        if rank.alive:
            self.state = STOPPED
            super()._on_exit(rank)

    def _check_clock(self) -> None:
        if self.peer_failed_at is not None and self.pending:
            if time.monotonic() - self.peer_failed_at > FAILED_PEER_GRACE_S:
                self.peer_failed_at = None
                who = [r.rank for r in self.result.ranks if r.state == FAILED]
                self._note(f"rank {who[0]} failed in this cell while ranks "
                           f"{','.join(map(str, sorted(self.pending)))} were still running it; "
                           f"interrupting them")
                self._soft_stop("failed peer")
        super()._check_clock()

    def _time_out(self) -> None:
        live = [r for r in self.ranks if r.alive and r.result.rank in self.pending]
        self._collect_stacks(live)
        self.result.timed_out = True
        self._note(diagnosis.timeout_report(self.spec.timeout, self.result))
        self.spec = replace(self.spec, timeout=None)  # fire once
        self._soft_stop("timeout")

    def _idle_warning(self, idle_s: float) -> None:
        live = [r for r in self.ranks if r.alive and r.result.rank in self.pending]
        self._collect_stacks(live)
        self._note(diagnosis.idle_report(idle_s, self.result, [r.result for r in live]))

    def _interrupt(self) -> None:
        self.result.interrupted = True
        self._soft_stop("interrupt")
        self._note("interrupted: the cell was stopped on every rank" if self.state != BROKEN else
                   "interrupted: ranks did not stop in time, so the pool was ended")

    def _soft_stop(self, why: str) -> None:
        """SIGINT the ranks still in the cell; those that do not return in time break the pool."""
        for rank in self.ranks:
            if rank.alive and rank.result.rank in self.pending:
                try:
                    os.kill(rank.process.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while self._busy() and time.monotonic() < deadline:
            try:
                for key, _ in self.selector.select(timeout=0.05):
                    kind, rank, stream = key.data
                    if kind == "out":
                        self._read_output(key.fd, rank, stream)
                    elif kind == "ctl":
                        self._read_ctl(rank)
                    else:
                        self._on_exit(rank)
            except KeyboardInterrupt:
                break
        if self._busy():
            stuck = sorted(self.pending)
            self.why_broken = (f"{diagnosis._plural('rank', stuck)} did not stop after SIGINT "
                               f"({why}), blocked in C code such as a collective")
            self.state = BROKEN
            self.failing = f"when the pool was ended ({why})"
            self.kill_now()
            for rank in self.ranks:
                if rank.alive:
                    rank.process.join(5)
                    rank.stopped_by_us = "failfast"
                    Launch._on_exit(self, rank)
                    if rank.result.rank in stuck:  # keep why it was stopped, not how
                        rank.result.state = TIMED_OUT if why == "timeout" else INTERRUPTED
                        rank.result.cause = "blocked; the pool was ended"
                    elif rank.result.state != OK:
                        rank.result.state = OK if rank.result.cause == diagnosis.NOT_TARGETED else rank.result.state
            self.pending.clear()
