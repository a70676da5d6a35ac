"""Where a launch's per-rank files are: one place that names them (as torch's ``LogsSpecs`` owns its
paths), a contract between the kernel (nbddp/sources/), the ranks (nbddp/rank/), the tests and the
docs. Imports nothing but ``os.path``. In a launch's log folder (nbddp/kernel/logdirs.py)::

    cell.py             the cell as the ranks ran it (tracebacks name it "Cell In[N]")
    rank{r}.stdout      everything rank r wrote, in full (the views show bounded tails)
    rank{r}.stderr
    rank{r}.stacks      rank r's Python stacks, written when the kernel asks (nbddp/rank/stackwatch.py)
    rank{r}.sigint      left by rank r when SIGINT reached its Python code (its except/finally runs)
    rank{r}.error.json  torch's TORCHELASTIC_ERROR_FILE for rank r (@record writes it)
    status/             torchrun launches: what each rank reports without a control pipe
      rank{r}.json      its pid, host, start, and at the end its exit code and exception
      rank{r}.stacks, rank{r}.sigint   as above, beside the status file"""
from __future__ import annotations

import os

CELL_COPY = "cell.py"
STATUS_DIR = "status"
STATUS_GLOB = "rank*.json"


class RankFiles:
    """The files of rank ``r`` in folder ``root``: ``RankFiles(log_dir).stdout(3)``."""

    __slots__ = ("root",)

    def __init__(self, root: str):
        self.root = root

    def __repr__(self) -> str:
        return f"RankFiles({self.root!r})"

    def _path(self, rank: int, suffix: str) -> str:
        return os.path.join(self.root, f"rank{rank}.{suffix}")

    def log(self, rank: int, stream: str) -> str:
        """The full log of ``stream`` ("stdout" or "stderr")."""
        return self._path(rank, stream)

    def stdout(self, rank: int) -> str:
        return self._path(rank, "stdout")

    def stderr(self, rank: int) -> str:
        return self._path(rank, "stderr")

    def stacks(self, rank: int) -> str:
        return self._path(rank, "stacks")

    def sigint(self, rank: int) -> str:
        return self._path(rank, "sigint")

    def error_file(self, rank: int) -> str:
        return self._path(rank, "error.json")

    def status(self, rank: int) -> str:
        """A torchrun rank's status file (``root`` is the status folder)."""
        return self._path(rank, "json")

    @property
    def status_glob(self) -> str:
        """Every torchrun rank's status file (``root`` is the status folder)."""
        return os.path.join(self.root, STATUS_GLOB)

    @property
    def cell_copy(self) -> str:
        """The cell as the ranks ran it, kept with their logs."""
        return os.path.join(self.root, CELL_COPY)

    @property
    def status_dir(self) -> str:
        """The folder of a torchrun launch's status files (``RankFiles(status_dir)`` names them)."""
        return os.path.join(self.root, STATUS_DIR)
