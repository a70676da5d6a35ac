"""Where a launch's logs go, and how long they stay.

The kernel's default folder (``/tmp/nbddp-*``, 0700) keeps the last ``KEEP`` launches' folders
(0700, files 0600) while the kernel runs and is removed when the kernel exits — also when it is
killed, by the watcher that waits for the kernel's end on a pipe (nbddp/kernel/janitor.py). A ``--log-dir``
folder is the user's: nbddp never deletes anything in it.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading

from nbddp.kernel.janitor import remove_at_exit

KEEP = 50  # launches (fresh cells, pools, a pool's cells) whose logs are kept

_lock = threading.Lock()
_root: str | None = None
_count = 0
_kept: list[str] = []     # this kernel's launch folders, oldest first
_held: set[str] = set()   # folders still in use (a running pool's), never pruned


def private(path: str, flags: int) -> int:
    """``open(..., opener=private)``: a file only its owner can read (0600)."""
    return os.open(path, flags, 0o600)


def new_log_dir(requested: str | None, hold: bool = False) -> str:
    """A new folder for one launch: ``requested`` itself (created if need be), or the next
    ``launch-N`` in this kernel's folder, pruning the oldest beyond ``KEEP``. ``hold`` keeps it
    from pruning until ``release`` (a pool writes into it for its whole life)."""
    global _root, _count
    if requested:
        os.makedirs(requested, mode=0o700, exist_ok=True)
        return os.path.abspath(requested)
    with _lock:
        if _root is None or not os.path.isdir(_root):
            _root = tempfile.mkdtemp(prefix="nbddp-")  # 0700
            remove_at_exit(_root)
        _count += 1
        path = os.path.join(_root, f"launch-{_count}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        _kept.append(path)
        if hold:
            _held.add(path)
        _prune(_kept)
    return path


def new_cell_dir(parent: str, number: int) -> str:
    """A pool's folder for its cell ``number``; in the kernel's folder only the last ``KEEP``
    cells of a pool are kept (a ``--log-dir`` pool keeps all)."""
    path = os.path.join(parent, f"cell-{number}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    if _root is not None and os.path.dirname(parent) == _root and number > KEEP:
        shutil.rmtree(os.path.join(parent, f"cell-{number - KEEP}"), ignore_errors=True)
    return path


def release(path: str | None) -> None:
    """The pool that held ``path`` has stopped: its logs age like any launch's."""
    with _lock:
        _held.discard(path)
        _prune(_kept)


def _prune(kept: list[str]) -> None:
    while len(kept) > KEEP:
        old = next((p for p in kept if p not in _held), None)
        if old is None or kept.index(old) >= len(kept) - KEEP:
            return
        kept.remove(old)
        shutil.rmtree(old, ignore_errors=True)
