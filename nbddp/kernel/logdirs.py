"""Where a launch's logs go, and how long they stay.

The kernel's default folder (``/tmp/nbddp-*``, 0700) keeps the last ``KEEP`` launches' folders and
is removed when the kernel exits, or is killed (nbddp/kernel/janitor.py). A ``--log-dir`` folder
is the user's: nbddp deletes nothing in it but its own ``status/``. Another user who can write a
folder can plant ``rank0.stdout -> ~/.bashrc``, so ``check_log_dir`` refuses a ``--log-dir`` another
user owns or can write, and ``private`` opens every file nbddp writes never through a link and
made anew (``O_EXCL``) where created."""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading

from nbddp.core.errors import DDPUsageError
from nbddp.kernel.janitor import remove_at_exit

KEEP = 50  # launches (fresh cells, pools, a pool's cells) whose logs are kept

_lock = threading.Lock()
_root: str | None = None
_count = 0
_kept: list[str] = []     # this kernel's launch folders, oldest first
_held: set[str] = set()   # folders still in use (a running pool's), never pruned


def private(path: str, flags: int) -> int:
    """``open(..., opener=private)``: a file only its owner can read (0600), never opened
    through a symbolic link; one opened to be truncated ("w") is made anew (the old name
    unlinked, then ``O_EXCL``), so nothing planted under its name is written through."""
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    if flags & os.O_TRUNC:
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                os.unlink(path)
        except FileNotFoundError:
            pass
        flags = (flags & ~os.O_TRUNC) | os.O_CREAT | os.O_EXCL
    return os.open(path, flags, 0o600)


def write_private(path: str, text: str) -> OSError | None:
    """Write ``text`` to a new private file ``path``; the error instead of a partial file where
    it cannot be written whole (a full disk): nothing half-written is left to be read or run."""
    try:
        with open(path, "w", encoding="utf-8", opener=private) as f:
            f.write(text)
        return None
    except OSError as exc:
        try:
            os.unlink(path)
        except OSError:
            pass
        return exc


def check_log_dir(path: str) -> None:
    """Refuse (``DDPUsageError``, one line) a ``--log-dir`` nbddp cannot safely write: not a
    folder, or a folder another user owns or can write (they could plant links to the user's
    files under the log's names). A folder that does not exist yet is fine (made 0700)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DDPUsageError(f"--log-dir {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise DDPUsageError(f"--log-dir {path} is not a folder")
    if info.st_uid != os.geteuid():
        raise DDPUsageError(f"--log-dir {path} belongs to another user (uid {info.st_uid}): "
                            "give a folder of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise DDPUsageError(f"--log-dir {path} can be written by other users (mode "
                            f"{stat.S_IMODE(info.st_mode):o}): chmod go-w it, or give another folder")


def new_log_dir(requested: str | None, hold: bool = False) -> str:
    """A new folder for one launch: ``requested`` itself (created if need be), or the next
    ``launch-N`` in this kernel's folder, pruning the oldest beyond ``KEEP``. ``hold`` keeps it
    from pruning until ``release`` (a pool writes into it for its whole life)."""
    global _root, _count
    if requested:
        check_log_dir(requested)
        try:
            os.makedirs(requested, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise DDPUsageError(f"--log-dir {requested}: cannot create it: {exc.strerror}") from None
        check_log_dir(requested)  # what was made (or raced in) meanwhile
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
    if os.path.islink(path) or os.stat(path).st_uid != os.geteuid():
        raise OSError(f"{path} is not nbddp's own folder")
    if _root is not None and os.path.dirname(parent) == _root and number > KEEP:
        shutil.rmtree(os.path.join(parent, f"cell-{number - KEEP}"), ignore_errors=True)
    return path


def fresh_subdir(path: str) -> str:
    """``path`` as a new, empty 0700 folder of nbddp's own (a launch's ``status/``): whatever
    was there (an earlier launch's in a reused ``--log-dir``, or a link) is removed first."""
    try:
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
        else:
            shutil.rmtree(path)
    except FileNotFoundError:
        pass
    os.mkdir(path, 0o700)
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
