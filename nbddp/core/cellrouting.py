"""Where a cell runs while a pool takes every cell (``%ddp_pool start --all-cells``, in the
spirit of ipyparallel's ``%autopx``): on the pool's ranks, unless it begins with a magic or a
shell escape (``%ddp_pool status``, ``%%local``, ``!pip …``: those run in the kernel as written).
Pure: it reads the cell's lines as IPython gives them to an input transformer."""
from __future__ import annotations

POOL, KERNEL, LOCAL, NOTHING = "pool", "kernel", "local", "nothing"


def route(lines: list[str]) -> str:
    """``pool`` for a cell of code; ``local`` for a ``%%local`` cell (its body runs in the
    kernel); ``kernel`` for a cell that begins with another magic, ``!`` or ``?``; ``nothing`` for
    a blank cell. Comments and blank lines before the first code are code's (a ``# note`` cell
    runs on the ranks, as its code would)."""
    first = next((line.strip() for line in lines if line.strip()), None)
    if first is None:
        return NOTHING
    if first.split(None, 1)[0] == "%%local":
        return LOCAL
    if first[0] in "%!?" or first.endswith("?"):
        return KERNEL
    return POOL


def without_local(lines: list[str]) -> list[str]:
    """A ``%%local`` cell's body (its first non-blank line dropped), as the kernel runs it; the
    line stays as a blank one so the kernel's line numbers match what the notebook shows."""
    for i, line in enumerate(lines):
        if line.strip():
            return lines[:i] + ["\n"] + lines[i + 1:]
    return lines
