"""``%ddp_pool … --all-cells``: every cell of code runs on the pool without a magic line. An
IPython input transformer (the documented hook that sees a cell before IPython reads its magics)
puts the internal ``%%ddp_all_cells`` line before each cell that nbddp/core/cellrouting.py routes
to the pool, and drops a ``%%local`` line so that cell runs in the kernel."""
from __future__ import annotations

from nbddp.core import cellrouting

MAGIC = "ddp_all_cells"  # the cell magic the transformer names (nbddp/magic.py)
_on: list = []  # the shell whose cells go to the pool, while all-cells is on


def transform(lines: list[str]) -> list[str]:
    """IPython's cleanup transformer: the cell as IPython should run it."""
    if not _on:
        return lines
    where = cellrouting.route(lines)
    if where == cellrouting.POOL:
        return [f"%%{MAGIC}\n"] + lines
    if where == cellrouting.LOCAL:
        return cellrouting.without_local(lines)
    return lines


def on(shell) -> None:
    if transform not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(transform)  # after IPython's own cleanups
    _on[:] = [shell]


def off(shell) -> None:
    _on.clear()
    if transform in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.remove(transform)


def is_on() -> bool:
    return bool(_on)


def goes_to_pool(code: str) -> bool:
    """Whether this cell's code will run on the pool (the kernel's early-interrupt handling
    treats it as a ``%%ddp`` cell)."""
    return bool(_on) and cellrouting.route(code.splitlines(keepends=True)) == cellrouting.POOL
