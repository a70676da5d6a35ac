"""Where a torchrun rank reads the cell from: nbddp's own copy, not whatever the script's path names
by then. Each torchrun (re)start runs ``python -m nbddp.rank.torchrun_rank SCRIPT``, SCRIPT being
the hidden script beside the notebook (nbddp/kernel/cellscript.py) so ``__file__`` is torchrun-like;
in a group-writable folder another user could ``rename()`` a file over it before a restart. So the
rank reads the source from the copy in the launch's 0700 log folder (``SOURCE_VAR``), keeping the
script's path for ``__file__`` and tracebacks; without that copy (another Slurm node, or none
named) it reads the script's path."""
from __future__ import annotations

import os

from nbddp.core import settings

SOURCE_VAR = settings.ELASTIC_SOURCE  # internal: set by nbddp


def read(cell_path: str) -> str:
    """The cell's source text for the script at ``cell_path``, from nbddp's copy where the
    kernel named one (``SOURCE_VAR``, taken out of the environment: the cell sees none of nbddp's)."""
    copy = os.environ.pop(SOURCE_VAR, "")
    if copy:
        try:
            fd = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            with open(fd, encoding="utf-8") as f:
                return f.read()
    with open(cell_path, encoding="utf-8") as f:
        return f.read()
