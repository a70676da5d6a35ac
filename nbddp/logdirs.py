"""Where a launch's logs go, and how long they stay.

The kernel's default folder (``/tmp/nbddp-*``, 0700) keeps the last ``KEEP`` launches' folders
(0700, files 0600) while the kernel runs and is removed when the kernel exits — also when it is
killed, by a tiny janitor process that waits for the kernel's end on a pipe. A ``--log-dir``
folder is the user's: nbddp never deletes anything in it.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import threading

KEEP = 50  # launches (fresh cells, pools, a pool's cells) whose logs are kept

_lock = threading.Lock()
_root: str | None = None
_count = 0
_kept: list[str] = []     # this kernel's launch folders, oldest first
_held: set[str] = set()   # folders still in use (a running pool's), never pruned
_janitor_w: int | None = None
_removed_at_exit: list[str] = []


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


def remove_at_exit(path: str) -> None:
    """Remove ``path`` (a folder or a file) when this process exits, however it ends; a path
    given again is not added again (a launch's script reuses its name: nbddp/cellscript.py)."""
    if path in _removed_at_exit:
        return
    _removed_at_exit.append(path)
    w = _janitor()
    if w is not None:
        try:
            os.write(w, os.fsencode(path) + b"\n")
        except OSError:
            pass


def _janitor() -> int | None:
    """A detached ``sh`` that reads folder names from a pipe and removes them at EOF, which
    comes when this process ends (even by SIGKILL). Own session: the stop button's SIGINT to
    the kernel's process group does not reach it; double-forked: it is not the kernel's child."""
    global _janitor_w
    if _janitor_w is None:
        r, w = os.pipe()
        script = 'while IFS= read -r p; do set -- "$@" "$p"; done; rm -rf -- "$@"'
        try:
            subprocess.run(["/bin/sh", "-c", f"exec 3<&0; ( {script} ) <&3 >/dev/null 2>&1 &"],
                           stdin=r, start_new_session=True, check=False, timeout=10)
        except (OSError, subprocess.SubprocessError):
            os.close(w)
            w = -1
        os.close(r)
        _janitor_w = w
    return None if _janitor_w < 0 else _janitor_w


@atexit.register
def _remove_now() -> None:
    """A clean exit removes the folders itself (the janitor then finds nothing to do)."""
    for path in _removed_at_exit:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            try:
                os.remove(path)
            except OSError:
                pass
