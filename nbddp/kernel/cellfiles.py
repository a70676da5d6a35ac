"""The files one cell's launch needs while its ranks run, made and removed in one place.

``--push`` values packed once into a shared-memory file every rank maps (nbddp/kernel/pushing.py)
and the cell as the notebook's script, a hidden file beside the notebook that is the ranks'
``__file__`` (nbddp/kernel/cellscript.py). A fresh launch (nbddp/sources/local.py) and a pool's
cell (nbddp/sources/pool.py) both hold them in ``cell_files``; they go when the cell has ended on
every rank, however it ended.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from nbddp.kernel import cellscript, pushing


@dataclass(frozen=True)
class CellFiles:
    push: dict | None    # what the ranks are sent to map the pushed values (None: nothing pushed)
    script: str | None   # the script beside the notebook (None: none could be made, or no source)


@contextlib.contextmanager
def cell_files(cwd: str, source: str | None, push: dict | None) -> Iterator[CellFiles]:
    """The cell's files for as long as the ``with`` block runs its ranks."""
    packed = pushing.pack(push)  # one shared file, read by every rank
    script = None
    try:
        script = None if source is None else cellscript.create(cwd, source)
        yield CellFiles(packed, script)
    finally:
        cellscript.remove(script)  # the ranks have ended: it leaves the notebook's folder
        pushing.discard(packed)  # no one reads it any more
