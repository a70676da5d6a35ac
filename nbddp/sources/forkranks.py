"""A fresh launch's ranks: one cell (or callable) run once by new processes from the forkserver
(or spawn), each ending when its cell ends — one torchrun job. A process source under
nbddp/sources/supervisor.py; the processes themselves are nbddp/sources/rankprocs.py's."""
from __future__ import annotations

import signal
import time

from nbddp.core import placement
from nbddp.core.cellnames import log_label
from nbddp.core.exitstates import settle
from nbddp.core.job import Cell
from nbddp.core.launch import Launch
from nbddp.core.rankfiles import RankFiles
from nbddp.core.result import FAILED, KILLED, launch_result
from nbddp.core.states import StopReason
from nbddp.forkserver import spares
from nbddp.kernel.logdirs import write_private
from nbddp.sources import descriptors
from nbddp.sources.rankjobs import rank_jobs
from nbddp.sources.rankprocs import Rank, RankProcs
from nbddp.sources.rendezvous import host_for
from nbddp.sources.supervisor import Source

FAILFAST_DELAY_S = 0.25  # torchrun's agent notices a failed worker at its next check (0.1 s)


class ForkRanks(Source):
    """The ranks of one fresh launch running its cell or packed callable, placed by ``plan``
    (nbddp/core/placement.py, planned once by nbddp/sources/local.py)."""

    def __init__(self, launch: Launch, *, plan: placement.Placement, push, log_dir: str,
                 script: str | None = None):
        self.spec, self.source_text, self.func, self.push = launch.spec, launch.source, launch.func, push
        self.cwd, self.base_env, self.log_dir, self.plan = launch.cwd, launch.env_base, log_dir, plan
        self.log_copy = RankFiles(log_dir).cell_copy
        self.cell_path = script or self.log_copy  # the ranks' __file__ (nbddp/kernel/cellscript.py)
        self.cell_label = launch.cell_label or log_label(self.log_copy)
        self.theme = launch.traceback_theme
        self.diff_folder = launch.diff_folder
        self.procs = RankProcs(on_exit=self._on_exit, emit=self.emit)
        self.store = None
        self.use_spares = False

    # ---------------------------------------------------------------- startup
    def _start(self) -> None:
        spec, log_dir = self.spec, self.log_dir
        self.use_spares = spares.usable(spec, pool_mode=False)
        # before any line is shown; spares (ready, or being forked now) counted at their most:
        # RankProcs.start checks again with those it really takes
        descriptors.fit(len(spec.ranks_run), spares.limit() if self.use_spares else 0)
        failed = write_private(self.log_copy, self.source_text if self.source_text is not None else
                               f"# nbddp ran the function {self.func['name']}\n")
        plan = self.plan
        self.result = launch_result(spec, log_dir, script=self.cell_path)
        self.store, port = host_for(spec)
        self.result.master_port = port
        self.emit("launch_started", self.result, spec, plan.backend)
        if failed is not None:  # the ranks get the cell in their job: they run, the copy is missing
            self.note(f"could not keep the cell's copy in {log_dir} ({failed.strerror}); the ranks run it anyway")
        if plan.note:
            self.note(plan.note)
        files = RankFiles(log_dir)
        cell = Cell(self.source_text, self.cell_path, self.cell_label, self.push,
                    [name.split("@")[0] for name in spec.pull], post_mortem=spec.pdb, theme=self.theme,
                    diff=list(spec.diff), diff_folder=self.diff_folder)
        jobs = rank_jobs(spec, files, cell, master_port=port, cwd=self.cwd, base_env=self.base_env,
                         plan=plan, func=self.func)
        ranks = []
        for res, job in zip(self.result.ranks, jobs, strict=True):
            ranks.append(Rank(res, job.stack_path, job.sigint_path))
        restarted = self.procs.start(ranks, jobs, spec.start_method, duplex=True, use_spares=self.use_spares)
        if restarted:
            self.note(restarted)

    # ------------------------------------------------------------------- Source
    def busy(self) -> bool:
        return any(rank.alive for rank in self.procs.ranks)

    def poll(self, timeout: float) -> None:
        self.procs.poll(timeout)

    def _on_exit(self, rank: Rank) -> None:
        if rank.lingered:  # ended by nbddp after its cell finished: the cell's own code counts
            rank.result.exitcode = rank.finished[0]
        settle(rank.result, rank.stop, rank.sent)
        self.emit("rank_exited", rank.result)

    def failure(self) -> str | None:
        """Fail-fast, a moment after the first failure (as torchrun's monitor interval), so
        ranks failing the same way at about the same time each report their own error."""
        if not self.busy():
            return None
        bad = next((r.result for r in self.procs.ranks
                    if r.stop is None and not r.alive and r.result.state in (FAILED, KILLED)), None)
        if bad is None or time.time() - bad.ended_at < FAILFAST_DELAY_S:
            return None
        return f"after rank {bad.rank} failed"

    def signal(self, sig: int, reason: str, why: str, spare_handlers: bool = False) -> None:
        """``sig`` to the live ranks; fail-fast's SIGTERM spares ranks whose cell has ended
        already (they are exiting by themselves, with their own code), SIGKILL does not."""
        self.procs.signal([r for r in self.procs.ranks
                           if not (spare_handlers and r.handling())
                           and not (reason == StopReason.FAILFAST and sig != signal.SIGKILL and r.ended)],
                          sig, reason, why)

    def end_lingering(self, limit: float) -> None:
        """A rank whose cell finished but whose process has not exited ``limit`` s later is
        stuck in its exit (torch's teardown, a thread, an atexit handler): say so in one line
        and end it; it is reported killed (nbddp/core/exitstates.py: killed_in_its_exit), since
        its exit was cut short (torchrun would wait forever)."""
        now = time.monotonic()
        for rank in self.procs.ranks:
            if rank.alive and rank.finished and not rank.lingered and now - rank.finished[1] > limit:
                rank.lingered = True
                self.note(f"rank {rank.result.rank} finished its cell (exit code {rank.finished[0]}) "
                          f"but its process had not exited {limit:.0f} s later (--exit-grace; stuck in "
                          "its exit: torch's teardown, a thread or an atexit handler); nbddp ended it")
                self.procs.kill_rank(rank)

    def handling(self) -> list[int]:
        return [r.result.rank for r in self.procs.ranks if r.handling()]

    def kill_now(self) -> None:
        self.procs.kill_now()

    def asking_ranks(self):
        return self.procs

    def stack_targets(self) -> list:
        return [(r.result, r.process.pid, r.stack_path) for r in self.procs.ranks if r.alive and r.started]

    def close(self) -> None:
        self.procs.close()
        self.store = None

    def finish(self) -> None:
        if self.use_spares and not self.result.interrupted:
            spares.refill(len(self.procs.ranks))  # for the next cell, while the user reads this one
