"""A torchrun launch's ranks as their status files tell, and their final states.

The status-file protocol (written by nbddp/rank/torchrun_rank.py, atomically, in the launch's
status folder): ``rank{N}.json`` holds ``rank``, ``local_rank``, ``node_rank``, ``pid``, ``host``,
``restart`` and ``started_at`` once the rank starts, and ``exitcode``, ``ended_at``, ``gpu_memory``
and (if the cell raised) ``exception`` (``type``, ``message``, ``traceback``, ``cell_line``) at its end;
``rank{N}.sigint`` appears when SIGINT reached the cell's Python code (its handler runs);
``rank{N}.stacks`` is where it writes its Python stacks when asked.

torchrun assigns global ranks at the rendezvous, so the ranks shown before it are guesses that
a status file confirms and, if need be, renumbers.
"""
from __future__ import annotations

import glob
import json
import os
import socket
import stat
import time

from nbddp.core import exitstates
from nbddp.core.rankfiles import RankFiles
from nbddp.core.result import RankResult, RunResult
from nbddp.core.states import RankState
from nbddp.sources.exitstatus import running


class TorchrunRanks:
    """The RankResults of this node's ranks, kept true from the status files in ``status_dir``.
    ``emit`` gets ``rank_started``/``rank_exited``, ``note`` a line for the user."""

    def __init__(self, result: RunResult, status_dir: str, nproc_per_node: int, emit, note):
        self.result, self.status_dir, self.nproc_per_node = result, status_dir, nproc_per_node
        self.emit, self.note = emit, note
        self.by_rank: dict[int, RankResult] = {}
        self.confirmed: set[int] = set()
        self.seen: dict[int, dict] = {}       # rank → its last status file
        self.gone_at: dict[int, float] = {}   # pid → when a rank was first seen gone without a word
        self.here = socket.gethostname()

    def get(self, rank: int, local_rank: int, node_rank: int, confirmed: bool = False) -> RankResult:
        """The RankResult for ``rank`` (made where missing); ``confirmed``: by its status file,
        which takes over the guess with the same local rank."""
        res = self.by_rank.get(rank)
        if res is None and confirmed:
            guess = next((r for r in self.by_rank.values()
                          if r.local_rank == local_rank and r.rank not in self.confirmed), None)
            if guess is not None:
                del self.by_rank[guess.rank]
                guess.rank, guess.node_rank = rank, node_rank
                res = self.by_rank[rank] = guess
        if res is None:
            res = RankResult(rank=rank, local_rank=local_rank, node_rank=node_rank)
            self.by_rank[rank] = res
        if confirmed:
            self.confirmed.add(rank)
        log_dir = self.result.log_dir
        res.stdout_path = RankFiles(log_dir).stdout(rank)
        res.stderr_path = RankFiles(log_dir).stderr(rank)
        self.result.ranks = [self.by_rank[r] for r in sorted(self.by_rank)]
        return res

    def wrote(self, rank: int, stop, sent) -> None:
        """``rank`` wrote a line: known from now on (its status file, written before any output,
        names its local rank; else numbered as torchrun numbers one node)."""
        if rank not in self.confirmed:
            self.scan(stop, sent)
        if rank not in self.by_rank:
            self.get(rank, rank % self.nproc_per_node, rank // self.nproc_per_node)

    def live(self) -> dict[int, dict]:
        """Ranks started and not ended, by their status files: rank → its status."""
        return {r: s for r, s in self.seen.items() if "exitcode" not in s and s.get("pid")}

    def ending(self) -> bool:
        """Has a rank of this attempt ended badly? torchrun then stops the others (and restarts
        them all, or ends): the launch is ending, not hanging."""
        if any(r.state in (RankState.FAILED, RankState.KILLED, RankState.TERMINATED)
               for r in self.by_rank.values()):
            return True
        return any(s["pid"] in self.gone_at for s in self.live().values())

    def sigint_path(self, rank: int) -> str:
        return RankFiles(self.status_dir).sigint(rank)

    def stacks_path(self, rank: int) -> str:
        return RankFiles(self.status_dir).stacks(rank)

    def scan(self, stop, sent) -> None:
        """Read the status files: a rank started (or restarted by torchrun), a rank ended.
        ``stop`` and ``sent``: what nbddp did to the launch (its exit state depends on them)."""
        found = []
        for path in glob.glob(RankFiles(self.status_dir).status_glob):
            try:  # never through a link, never blocking on a FIFO; only a regular file
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                with open(fd, "rb") as f:
                    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                        continue
                    status = json.loads(f.read(1 << 20))
                if not isinstance(status, dict) or not isinstance(status.get("rank"), int):
                    continue
            except (OSError, ValueError):
                continue
            found.append(status)
        # the ends in the order they happened: a rank torchrun stopped after another failed is
        # settled after that failure, whichever file the folder lists first
        found.sort(key=lambda st: ("exitcode" in st, _when(st.get("ended_at"))))
        for status in found:
            r = status["rank"]
            old = self.seen.get(r)
            if old == status:
                continue
            self.seen[r] = status
            res = self.get(r, status["local_rank"], status["node_rank"], confirmed=True)
            res.local_rank, res.node_rank = status["local_rank"], status["node_rank"]
            if old is None or old.get("restart") != status.get("restart") or old.get("pid") != status["pid"]:
                if old is not None:
                    self.note(f"rank {r} restarted by torchrun (restart {status.get('restart')})")
                res.pid, res.state, res.started_at = status["pid"], RankState.RUNNING, status["started_at"]
                res.exitcode = res.ended_at = None
                res.exception, res.cause = None, ""
                self.emit("rank_started", res)
            if "exitcode" in status and (old is None or "exitcode" not in old):
                res.exception, res.gpu_memory = status.get("exception"), status.get("gpu_memory")
                self.end(res, status["exitcode"], stop, sent, status.get("ended_at"))
        for s in self.live().values():  # died without a word (a signal): torchrun tells how at the end
            if s["pid"] not in self.gone_at and s.get("host") == self.here and not running(s["pid"]):
                self.gone_at[s["pid"]] = time.time()

    def end(self, res: RankResult, code: int | None, stop, sent, ended_at: float | None = None,
            closed: set[int] | None = None) -> None:
        gone_at = self.gone_at.get(res.pid) if res.pid is not None else None
        res.exitcode, res.ended_at = code, ended_at or gone_at or time.time()
        others_failed = any(exitstates.failed_by_itself(r) for r in self.by_rank.values() if r is not res)
        exitstates.settle_torchrun(res, stop, sent, others_failed, closed)
        self.emit("rank_exited", res)

    def settle_all(self, stop, sent, agent_code: int | None, failures, closed: set[int] | None = None) -> None:
        """After the agent ended: ranks its failure summary names (``failures``: (rank, local
        rank, exit code)) end with that code, those torchrun did not stop (``closed``: the pids
        it signalled, None where its log names none) before those it did, whatever order its
        summary gives them (its "root cause" is the failure with the earliest whole-second
        timestamp, often the rank that lost its peer); every rank still without an end gets one."""
        stopped_last = sorted(failures, key=lambda f: closed is not None and
                              getattr(self.by_rank.get(f[0]), "pid", None) in closed)
        for r, local, code in stopped_last:
            res = self.by_rank.get(r)
            if res is not None and res.ended_at is None:
                res.local_rank = local
                self.end(res, code, stop, sent, closed=closed)
        first_failed = next((r.rank for r in self.result.ranks if exitstates.failed_by_itself(r)),
                            next((r.rank for r in self.result.ranks
                                  if r.state in (RankState.FAILED, RankState.KILLED)), None))
        for res in self.result.ranks:
            if res.ended_at is not None and res.state != RankState.RUNNING:
                continue
            if exitstates.settle_unreported(res, stop, agent_code, first_failed):
                res.ended_at = time.time()
                self.emit("rank_exited", res)
            else:
                self.end(res, 0, stop, sent)


def _when(value: object) -> float:
    """A status file's ``ended_at`` as a number to sort by (a file that lacks it sorts first)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
