"""Launch: one launch request, the one thing every process source is given.

nbddp/api.py builds it once, after every rule has passed (nbddp/core/launchrules.py), and hands it
to the chosen source's ``run(launch) -> RunResult`` (nbddp/sources/local.py, pool.py,
torchrun.py, slurm.py); each source reads what it uses. Frozen: a source varies it with
``dataclasses.replace`` (Slurm's log folder), never in place. Pure data (the working folder and
the environment default to the kernel's, copied when the request is made).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from nbddp.core.spec import LaunchSpec


@dataclass(frozen=True)
class Launch:
    """What to run, where, with what, shown how."""

    spec: LaunchSpec
    source: str | None = None          # the cell's text (None: ``func`` runs instead)
    func: dict[str, Any] | None = None  # a callable and its arguments, serialized once in the kernel
    sinks: tuple[Any, ...] = ()        # where the launch's events go (nbddp/core/sink.py: any of its methods)
    cwd: str = field(default_factory=os.getcwd)              # the ranks' working folder, absolute
    env_base: dict[str, str] = field(default_factory=lambda: dict(os.environ))  # the ranks' environment is built on it
    push: dict[str, Any] | None = None  # --push: notebook values for every rank
    cell_label: str | None = None      # how tracebacks name the cell ("Cell In[3]")
    traceback_theme: str | None = None  # the kernel's traceback colours (None: not in IPython, Python's format)
    pool: Any = None                   # the started pool that runs the cell (source "pool")
    diff_folder: str | None = None     # --diff: the private folder the ranks compare in (nbddp/kernel/diffing.py)
