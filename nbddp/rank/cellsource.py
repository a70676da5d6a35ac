"""Where a torchrun rank reads the cell from: nbddp's own copy, not whatever the script's path
names by then.

Each torchrun start and restart runs ``python -m nbddp.rank.torchrun_rank SCRIPT``, and
``SCRIPT`` is the hidden ``.nbddp-<kernel pid>.py`` beside the notebook (nbddp/kernel/cellscript.py),
so that ``__file__``, ``sys.argv[0]``, ``Path(__file__).parent`` and hydra's ``config_path="."``
see what ``torchrun script.py`` run from the notebook's folder gives. In a group-writable folder
another user can ``rename()`` a file of their own over that name between two starts, and the
next restart would run their code as the user. So the kernel also names the copy it wrote in
the launch's 0700 log folder (``SOURCE_VAR``), and the rank reads the source from there,
keeping the script's path for ``__file__``/``sys.argv[0]`` and tracebacks: the path stays
torchrun-like, the code run is the code nbddp wrote. (An open descriptor was the other way:
torchrun starts its ranks with ``close_fds``, so none would reach them.) On a node without that
copy (another node of a Slurm job, where the folder is the shared ``.nbddp-slurm/``), or with
no copy named, the script's path is read as before.
"""
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
