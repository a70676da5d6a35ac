"""What one of nbddp's own ranks is sent: its ``RankJob`` (once, as it starts) and, for a pool
rank, a ``Cell`` per cell. Built in the kernel by nbddp/sources/rankjobs.py (one function for
fresh and pool ranks), applied by nbddp/rank/worker.py.

One stdlib pickle a rank, sent over its job pipe (multiprocess would pickle it with dill, in
pure Python, far slower; a spare forked earlier gets it the same way). Plain dataclasses: they
pickle as their class's name and a dict. Imports nothing of nbddp: the rank unpickles it."""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Cell:
    """The code a rank runs: a fresh rank's one cell (or callable), or one cell of a pool."""

    source: str | None          # the cell's text; None when a callable (RankJob.func) runs
    path: str                   # its __file__ and sys.argv[0] (nbddp/kernel/cellscript.py)
    label: str | None = None    # how tracebacks name it ("Cell In[3]"; nbddp/core/cellnames.py)
    push: dict[str, Any] | None = None  # --push values: a shared file to map (nbddp/kernel/pushing.py)
    pull: list[str] = field(default_factory=list)  # --pull names to send back after it ran
    post_mortem: bool = False   # --pdb: a failing rank opens the debugger at the failing frame
    theme: str | None = None    # the kernel's traceback colours: a failing rank shows IPython's traceback
    diff: list[str] = field(default_factory=list)  # --diff names, compared after the cell's code
    diff_folder: str | None = None  # where the ranks meet to compare them (nbddp/rank/diffing.py)


@dataclass
class RankJob:
    """Everything rank ``rank`` needs to become a torchrun-like script process."""

    rank: int
    env: dict[str, str]         # its whole environment (nbddp/core/envvars.py)
    cwd: str
    sys_path: list[str]         # the kernel's, with cwd first
    argv: list[str]             # sys.argv: the cell's path, the legacy --local-rank, script args
    stack_path: str             # where it writes its stacks when asked (nbddp/core/rankfiles.py)
    sigint_path: str            # what it touches when SIGINT reaches its Python code
    backend: str | None         # the backend auto picked (nbddp.backend() in the rank)
    cell: Cell                  # a pool rank's: only its first __file__; cells come as EXEC
    func: dict[str, Any] | None = None  # a packed callable to run instead of cell.source (nbddp/sources/local.py)
    pool: bool = False          # serve cell after cell (nbddp/sources/pool.py) instead of one
    forget: list[str] = field(default_factory=list)  # preloaded modules edited since: re-import
    fake: bool = False          # --fake: torch's fake backend, the rank's report after its cell


def dumps(job: RankJob) -> bytes:
    """One rank's job as sent over its job pipe."""
    return pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> RankJob:
    job = pickle.loads(data)
    if not isinstance(job, RankJob):
        raise TypeError(f"not a RankJob: {type(job).__name__}")
    return job
