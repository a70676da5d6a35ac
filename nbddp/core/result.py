"""What a launch produced: per-rank status, output and cause of failure, and the errors the
cell raises. Plain data, so the magic, the Python API and the views all read the same thing."""
from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbddp.core.diagnosis import TIMEOUT_NOTE, final_notes, is_hang_note
from nbddp.core.errors import NbddpError
from nbddp.core.fakereport import fake_line
from nbddp.core.rankfiles import RankFiles
from nbddp.core.states import RankState
from nbddp.core.summary import label, state_lines, wrapped

if TYPE_CHECKING:
    from nbddp.core.spec import LaunchSpec

TAIL_BYTES = 1 << 16  # what the diagnosis reads of a rank's stderr: its tail, in bytes
_STATE_LINE = re.compile(r"ranks? [\d–, ]+: ")  # "rank 0: failed (…)": kept whole in DDPError

# Rank states (nbddp/core/states.py), by the names the sources and views import from here.
STARTING, RUNNING, OK, FAILED, TIMED_OUT, KILLED, TERMINATED, INTERRUPTED = RankState


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class RankResult:
    """One rank: how it ended and why."""

    rank: int
    local_rank: int
    node_rank: int
    pid: int | None = None
    state: RankState = STARTING
    exitcode: int | None = None
    cause: str = ""
    exception: dict[str, Any] | None = None
    value: Any = None
    pulled: dict[str, Any] = field(default_factory=dict)
    pull_errors: dict[str, str] = field(default_factory=dict)  # name -> why the rank could not send it
    started_at: float | None = None
    ended_at: float | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    stack: str | None = None
    blocked_at: str | None = None
    hint: str | None = None
    fake: dict[str, Any] | None = None  # --fake: what the rank holds and sends (nbddp/core/fakereport.py)
    gpu_memory: list[dict[str, Any]] | None = None  # CUDA memory per device, if the cell used CUDA (core/gpureport.py)

    @property
    def ok(self) -> bool:
        return self.state == OK

    @property
    def elapsed(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or self.started_at) - self.started_at

    def _read(self, path: str | None) -> str:
        if not path or not os.path.exists(path):
            return ""
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")

    @property
    def stdout(self) -> str:
        """Everything the rank wrote on fd 1 (read from its full log on disk)."""
        return self._read(self.stdout_path)

    @property
    def stderr(self) -> str:
        return self._read(self.stderr_path)

    def stderr_tail(self, limit: int = TAIL_BYTES) -> str:
        """The last ``limit`` bytes of the rank's stderr log, from a line's start: what the
        diagnosis reads at the end of a launch. A rank that wrote gigabytes (``NCCL_DEBUG=INFO``)
        costs the kernel ``limit`` bytes, not the log's size, right when the user pressed stop."""
        path = self.stderr_path
        if path is None:
            return ""
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - limit))
                data = f.read(limit)
        except OSError:
            return ""
        if size > limit:  # cut in a line (or a character): start at the next whole line
            data = data[data.find(b"\n") + 1:] if b"\n" in data else data
        return data.decode("utf-8", errors="replace")

    def describe(self) -> str:
        """One line: the rank's final state and its cause."""
        text = f"rank {self.rank}: {self.state}"
        return f"{text} ({self.cause})" if self.cause else text


@dataclass
class RunResult:
    """The whole launch; stored as ``_ddp`` in the notebook after every ``%%ddp`` cell."""

    ranks: list[RankResult]
    world_size: int
    log_dir: str
    master_port: int | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    interrupted: bool = False
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)
    displayed: list[int] = field(default_factory=list)  # ranks whose output a view showed
    script: str | None = None  # the ranks' __file__ and sys.argv[0] (beside the notebook while it ran)
    fake: bool = False         # --fake: only ``ranks`` ran, of a world on torch's fake backend
    diff: str | None = None    # --diff's report: what differs across the ranks (nbddp/core/rankdiff.py)

    @property
    def cell_file(self) -> str:
        """The cell as the ranks ran it, kept in the log folder (``script`` is removed after the
        launch; tracebacks name it ``Cell In[N]``)."""
        return RankFiles(self.log_dir).cell_copy

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.ranks) and not self.interrupted and not self.timed_out

    def rank(self, number: int) -> RankResult | None:
        """The result of global rank ``number``, or None where it ran on another node
        (under ``--launcher torchrun`` a node holds only its own ranks)."""
        return next((r for r in self.ranks if r.rank == number), None)

    @property
    def remote(self) -> list[int]:
        """Global ranks that ran on other nodes (empty for a one-machine launch)."""
        here = {r.rank for r in self.ranks}
        return [n for n in range(self.world_size) if n not in here]

    @property
    def elapsed(self) -> float:
        return self.ended_at - self.started_at

    @property
    def failed(self) -> list[RankResult]:
        """Ranks that caused the failure (not those nbddp stopped because of it)."""
        return [r for r in self.ranks if r.state in (FAILED, KILLED, TIMED_OUT)]

    @property
    def values(self) -> list[Any]:
        return [r.value for r in self.ranks]

    @property
    def stdout(self) -> list[str]:
        return [r.stdout for r in self.ranks]

    @property
    def stderr(self) -> list[str]:
        return [r.stderr for r in self.ranks]

    def summary(self, hang_notes: bool = True) -> str:
        """A few lines naming each failed rank and its cause, then what happened to the rest,
        then nbddp's notes (``hang_notes=False``: without the idle warning and timeout report)."""
        if self.ok:
            if self.fake:
                return fake_line([r.rank for r in self.ranks], self.world_size, self.elapsed)
            if self.remote:
                return (f"all {len(self.ranks)} ranks on this node (of {self.world_size} in the job) "
                        f"finished ok in {self.elapsed:.2f} s")
            return f"all {self.world_size} ranks finished ok in {self.elapsed:.2f} s"
        lines = state_lines(self.ranks)  # ranks in the same state said once
        oks = [r.rank for r in self.ranks if r.ok]
        if oks:
            lines.append(f"{label(oks)} finished ok")
        return "\n".join(lines + [n for n in final_notes(self.notes) if hang_notes or not is_hang_note(n)])

    def raise_for_status(self) -> RunResult:
        if self.ok:
            return self
        if self.interrupted:
            raise Interrupted("nbddp: " + next((n for n in reversed(self.notes) if n.startswith("interrupted")),
                                               "interrupted: all ranks were stopped"))
        raise (DDPTimeout if self.timed_out else DDPError)(self)


class Interrupted(KeyboardInterrupt, NbddpError):
    """The stop button ended a launch: a KeyboardInterrupt that IPython shows as one line
    (``KeyboardInterrupt: nbddp: interrupted: all ranks were stopped``), not a traceback
    through nbddp; the per-rank report was shown above it and is in ``_ddp``."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: {self}"]


Interrupted.__name__ = "KeyboardInterrupt"  # what Jupyter names the error (ename), as for any interrupt


class DDPError(RuntimeError, NbddpError):
    """Raised by a cell when any rank failed; ``.result`` holds the whole RunResult."""

    def __init__(self, result: RunResult):
        self.result = result
        super().__init__(self._headline() + "\n" + result.summary())

    def _headline(self) -> str:
        bad = self.result.failed
        if not bad:
            return "the launch failed"
        return f"{label([r.rank for r in bad])} failed"

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of a traceback from inside nbddp: each rank's state line
        whole (searched for, copied), notes and hints wrapped at word boundaries. What a view already showed is not said
        again: a failed rank's traceback, and a hang's report (where each rank waited, the hint)."""
        lines = [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self._headline()}"]
        shown_hang = bool(self.result.displayed) and any(is_hang_note(n) for n in self.result.notes)
        # each rank's state and cause on one line, whole (searched for, copied); notes are wrapped
        lines += ["  " + line if _STATE_LINE.match(line) else wrapped("  " + line)
                  for line in self._report_lines(self.result.summary(hang_notes=not shown_hang))]
        for r in self.result.failed:
            if r.hint:
                lines.append(wrapped(f"  hint (rank {r.rank}): {r.hint}"))
        shown = set(self.result.displayed)
        tracebacks = [(r.rank, r.exception.get("shown") or r.exception["traceback"]) for r in self.result.failed
                      if r.exception and r.exception.get("traceback")]  # as the rank printed it
        for rank, traceback in tracebacks:  # a traceback once: here only where no view showed it
            if rank not in shown:
                lines.append(f"--- rank {rank} traceback ---")
                lines += traceback.rstrip("\n").splitlines()
        above = [rank for rank, _ in tracebacks if rank in shown]
        if len(above) == 1:
            where = f"rank {above[0]}'s traceback is in its output above; "
        elif above:
            where = f"{label(above)}: tracebacks in their output above; "
        else:
            where = ""
        if shown_hang:
            where += "where each rank waited: nbddp's note above; "
        lines.append(wrapped(f"({where}full per-rank logs: {self.result.log_dir}; the result is in _ddp)"))
        return lines

    def _report_lines(self, summary: str) -> list[str]:
        return summary.splitlines()


class DDPTimeout(DDPError):
    """Raised when the launch ran past ``--timeout``; the ranks' stacks say where they were."""

    def _timeout_note(self) -> str | None:
        return next((n for n in self.result.notes if n.startswith(TIMEOUT_NOTE)), None)

    def _headline(self) -> str:
        note = self._timeout_note()   # "timed out after 20 s. rank 0 blocked at …"
        return note.split(". ", 1)[0] if note else "timed out"

    def _report_lines(self, summary: str) -> list[str]:
        """The timeout report without what the headline said, its hint on a line of its own."""
        note, lines = self._timeout_note(), []
        for line in summary.splitlines():
            if note is not None and line == note:
                rest = note.split(". ", 1)[1] if ". " in note else ""
                where, _, hint = rest.partition(" Hint: ")
                lines += [x for x in (where, hint and f"Hint: {hint}") if x]
            else:
                lines.append(line)
        return lines


def launch_result(spec: LaunchSpec, log_dir: str, *, with_ranks: bool = True, master_port: int | None = None,
                  script: str | None = None) -> RunResult:
    """A launch's RunResult as it starts, made here for every source: one RankResult per rank
    (numbered as torchrun numbers them, its logs in ``log_dir``), or none where the ranks are
    learnt as they come (torchrun's agent: nbddp/sources/torchrun_ranks.py)."""
    files = RankFiles(log_dir)
    ranks = [RankResult(rank=r, local_rank=spec.local_rank_of(r), node_rank=spec.node_of(r),
                        stdout_path=files.stdout(r), stderr_path=files.stderr(r))
             for r in spec.ranks_run] if with_ranks else []
    return RunResult(ranks=ranks, world_size=spec.world_size, log_dir=log_dir, master_port=master_port,
                     started_at=time.time(), script=script, fake=spec.fake)
