"""Nothing of a kernel outlives it: a small watcher process ends what the kernel leaves behind and
removes its folders (``remove_at_exit``), however the kernel ends (SIGKILL of its group included).
The kernel tells it, over a pipe whose only write end it holds, the folders and its helpers'
pipes; at that pipe's EOF the watcher finds in /proc (by pipe inode, never by pid) who still holds
one: writers (ranks, spares: one stuck in C cannot run its lifeline) end at once, readers (the
forkserver, the resource tracker) after a grace period; then the folders go. It runs ``python -I
-S`` in a session of its own, ignores SIGINT/SIGTERM/SIGHUP and is not the kernel's child; a child
the kernel forks closes its pipe (nbddp/kernel/forkguard.py), so only the kernel holds it."""
from __future__ import annotations

import atexit
import getpass
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

WRITERS_GONE_S = 2.0  # how long a read end's holder may take to end by itself
LAST_LOOK_S = 4.0     # the whole sweep, folders excepted, ends by then

_lock = threading.Lock()
_w: int | None = None  # -1: the watcher could not be started
_sent: set[str] = set()
_removed_at_exit: list[str] = []


# ------------------------------------------------------------------ kernel side
def remove_at_exit(path: str) -> None:
    """Remove ``path`` (a folder and all in it, or a file: the cell's script beside the
    notebook, nbddp/kernel/cellscript.py) when this process exits, however it ends."""
    if path not in _removed_at_exit:
        _removed_at_exit.append(path)
    _tell("rm", path)


def remove_if_empty_at_exit(path: str) -> None:
    """Remove the folder ``path`` at exit if it is an empty folder then (not created by the
    user's work: torch makes its cache folder when the forkserver imports torch._dynamo)."""
    if path:
        _tell("rmdir", path)


def end_with_kernel(fds) -> None:
    """The pipes among ``fds`` (passed to a helper of this kernel) are the kernel's own: whatever
    holds them when the kernel ends is ended (see the module's docstring). Not this process's
    standard streams: the resource tracker is passed stderr, which in a Jupyter kernel is a pipe
    to the Jupyter server."""
    streams = _pipe_inodes([0, 1, 2] + [_fileno(s) for s in (sys.stdin, sys.stdout, sys.stderr,
                                                             sys.__stdout__, sys.__stderr__)])
    for inode in _pipe_inodes(fds) - streams:
        _tell("pipe", str(inode))


def _fileno(stream) -> int:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return -1


def _pipe_inodes(fds) -> set[int]:
    inodes = set()
    for fd in fds:
        try:
            info = os.fstat(fd)
        except (OSError, TypeError, ValueError):
            continue
        if stat.S_ISFIFO(info.st_mode):
            inodes.add(info.st_ino)
    return inodes


_torch_cache_checked = False


def new_torch_cache_dir() -> str:
    """torch's inductor cache folder (as torch._inductor.runtime.cache_dir_utils names it) if it
    does not exist at the first call (before the first helper starts), else "" (then it is the
    user's, or another process's)."""
    global _torch_cache_checked
    if _torch_cache_checked:
        return ""
    _torch_cache_checked = True
    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if path is None:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = f"uid_{os.getuid()}"
        path = os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    return "" if os.path.exists(path) else os.path.abspath(path)


def _tell(kind: str, value: str) -> None:
    line = f"{kind} {value}"
    if "\n" in line:
        return
    with _lock:
        w = _watcher()
        if line in _sent or w is None:
            return
        try:
            os.write(w, os.fsencode(line) + b"\n")  # under PIPE_BUF: one write, whole
        except OSError:
            return
        _sent.add(line)


def _watcher() -> int | None:
    """Start the watcher once (``_lock`` held); the pipe's write end, or None without one.
    ``sh`` starts it in the background and exits, so it is not this process's child."""
    global _w
    if _w is None:
        r, w = os.pipe()  # non-inheritable: only this process holds w
        try:
            subprocess.run(["/bin/sh", "-c", 'exec 3<&0; "$@" <&3 3<&- >/dev/null 2>&1 &', "sh",
                            sys.executable, "-I", "-S", os.path.abspath(__file__)],
                           stdin=r, start_new_session=True, check=False, timeout=10)
        except (OSError, subprocess.SubprocessError):
            os.close(w)
            w = -1
        os.close(r)
        _w = w
        if w >= 0:
            from nbddp.kernel import forkguard  # not at the top: the watcher runs this file with -I -S

            forkguard.hold(w)
            forkguard.on_child(_forget_in_child)
    return None if _w < 0 else _w


def _forget_in_child() -> None:
    """In a child the kernel forked (nbddp/kernel/forkguard.py closed the watcher's pipe there):
    it neither writes to that number nor removes the kernel's folders at its own exit."""
    global _w, _lock
    _w, _lock = None, threading.Lock()
    _sent.clear()
    _removed_at_exit.clear()


@atexit.register
def _remove_now() -> None:
    """A clean exit removes the folders itself (the watcher then finds nothing left to do)."""
    for path in _removed_at_exit:
        remove(path)


def remove(path: str) -> None:
    """A folder with all in it, or a file (a link is removed, not followed); gone already is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except OSError:
            pass


# ------------------------------------------------------- the sweep (pure logic)
def holders(entries, inodes) -> tuple[set[int], set[int]]:
    """``entries``: (pid, pipe inode, writable) for every open pipe end seen. The pids that
    hold a write end of one of ``inodes``, and those that hold only read ends of them."""
    writers: set[int] = set()
    readers: set[int] = set()
    for pid, inode, writable in entries:
        if inode in inodes:
            (writers if writable else readers).add(pid)
    return writers, readers - writers


def parse(lines) -> tuple[list[str], list[str], set[int]]:
    """The watcher's orders: folders to remove, folders to remove if empty, pipe inodes."""
    remove, if_empty, inodes = [], [], set()
    for raw in lines:
        kind, _, value = raw.rstrip(b"\n").partition(b" ")
        if kind == b"rm":
            remove.append(os.fsdecode(value))
        elif kind == b"rmdir":
            if_empty.append(os.fsdecode(value))
        elif kind == b"pipe" and value.isdigit():
            inodes.add(int(value))
    return remove, if_empty, inodes


# ------------------------------------------------------------- the sweep (/proc)
def _pipe_ends(me: int):
    """(pid, inode, writable) for every pipe end open in a process we may look at."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        fd_dir = f"/proc/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if not link.startswith("pipe:["):
                continue
            try:
                with open(f"/proc/{name}/fdinfo/{fd}") as f:
                    flags = next((int(line.split()[1], 8) for line in f if line.startswith("flags:")), 0)
            except (OSError, ValueError):
                continue
            yield int(name), int(link[6:-1]), (flags & os.O_ACCMODE) != os.O_RDONLY


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _end(pid: int) -> None:
    """SIGKILL ``pid``, and its process group when it leads one (a rank and what it started)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def sweep(inodes: set[int]) -> None:
    """End every holder of ``inodes``: writers at once, readers once they had time to end."""
    if not inodes:
        return
    me, start = os.getpid(), time.monotonic()
    writers, readers = holders(_pipe_ends(me), inodes)
    for pid in writers:
        _end(pid)
    while any(map(_running, readers)) and time.monotonic() - start < WRITERS_GONE_S:
        time.sleep(0.05)
    while time.monotonic() - start < LAST_LOOK_S:  # what is left, and what was forked meanwhile
        writers, readers = holders(_pipe_ends(me), inodes)
        left = [pid for pid in writers | readers if _running(pid)]
        if not left:
            return
        for pid in left:
            _end(pid)
        time.sleep(0.05)


def main() -> None:
    os.chdir("/")
    # Not SIGINT (the stop button), nor SIGTERM or SIGHUP: systemd and TLJH stop a kernel's
    # processes with SIGTERM, a closed terminal sends SIGHUP, and a watcher that died of them
    # left the kernel's folders. It ends anyway, at its pipe's end of file.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    lines = []
    with open(0, "rb", closefd=False) as orders:
        for line in orders:  # until EOF: the kernel has ended
            lines.append(line)
    folders, if_empty, inodes = parse(lines)
    try:
        sweep(inodes)
    finally:
        for path in folders:
            remove(path)
        for path in if_empty:
            try:
                os.rmdir(path)
            except OSError:
                pass


if __name__ == "__main__":
    main()
