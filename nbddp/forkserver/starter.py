"""How worker processes are started: a forkserver per kernel with torch preloaded (fork speed,
without forking the multi-threaded kernel or a process that has touched CUDA), or spawn.

multiprocess is adjusted (``_adjust_multiprocess``: its helper's session, the main script, the
flush) when the first context is made, not on import. What the notebook shows while a new
forkserver imports torch is given by the extension (``give_notes``: nbddp/views/startnote.py);
without it (plain Python) nothing is shown.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager

import multiprocess
from multiprocess import forkserver, spawn, util

from nbddp.core.errors import NbddpError
from nbddp.forkserver import privnet
from nbddp.forkserver.preload import (
    NAMES as PRELOAD,  # the list and the reason for each entry: nbddp/forkserver/preload.py
    PROBE_TIMEOUT_S,
)
from nbddp.kernel import forkguard, janitor
from nbddp.rank import worker

_lock = threading.Lock()
_preload_set = False
_adjusted = False


def context(start_method: str = "forkserver"):
    """The multiprocess context for ``start_method``; the forkserver gets the preload list."""
    global _preload_set
    ctx = multiprocess.get_context(start_method)
    with _lock:
        _adjust_multiprocess()
        if start_method == "forkserver":
            if not _preload_set:
                _short_socket_folder()
                # first, before torch: NBDDP_PRIVATE_NET=1 moves the forkserver into a private
                # network (nbddp/forkserver/privnet.py), decided once per kernel, here
                privnet.requested()
                ctx.set_forkserver_preload(["nbddp.forkserver.serve_private_net"] + PRELOAD)
                _preload_set = True
    return ctx


def _adjust_multiprocess() -> None:
    """Once, before the first process starts (the caller holds ``_lock``): multiprocess starts
    its helpers in a session of their own, never re-runs the caller's main script in a rank,
    and does not flush the kernel's streams from a start thread (the three functions below)."""
    global _adjusted
    if not _adjusted:
        util.spawnv_passfds = _spawnv_passfds_in_own_session
        spawn.get_preparation_data = _preparation_without_main
        util._flush_std_streams = _flush_unless_starting
        _adjusted = True


# What the notebook shows while a new forkserver imports torch (give_notes); nothing by default.
_notes: dict = {"show": lambda: None, "clear": lambda: None}


def give_notes(show, clear) -> None:
    """``show()`` a line in the running cell while ranks wait for a new forkserver (it may be
    importing torch), and ``clear()`` it once they have started (the extension gives
    nbddp/views/startnote.py's)."""
    _notes.update(show=show, clear=clear)


def show_note() -> None:
    """Show the line of ``give_notes`` (a launch waits for a new forkserver's import of torch)."""
    _notes["show"]()


UNIX_PATH_MAX = 107  # a Unix socket's path: 108 bytes with the closing NUL


def _short_socket_folder() -> None:
    """multiprocess puts the forkserver's socket in a ``pymp-*`` folder of TMPDIR; under a long
    TMPDIR (a cluster job's scratch folder, a test's) the socket's path passes 107 bytes and the
    first cell would fail deep inside with "AF_UNIX path too long". Then that folder (private,
    0700, removed with the kernel) is made where a path is short, as Python 3.12's
    multiprocessing does."""
    config = multiprocess.process.current_process()._config
    socket_path = os.path.join(tempfile.gettempdir(), "pymp-" + "x" * 8, "listener-" + "x" * 8)
    if config.get("tempdir") or len(os.fsencode(socket_path)) <= UNIX_PATH_MAX:
        return
    for base in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            config["tempdir"] = tempfile.mkdtemp(prefix="pymp-", dir=base)
            return


_children: dict[int, subprocess.Popen] = {}  # kept, so nothing reaps them behind multiprocess


def _spawnv_passfds_in_own_session(path, args, passfds):
    """multiprocess's helper that starts the forkserver (and spawned ranks), but in a session
    of its own: Jupyter's stop button signals the kernel's whole process group, and a SIGINT
    there would kill the forkserver while it imports torch. The forkserver still ends with
    the kernel (its alive pipe closes), so do the ranks and spares it forked (lifelines), and
    the watcher of nbddp/kernel/janitor.py ends whatever of them is stuck and removes multiprocess's
    ``pymp-*`` folder (the listener's socket) and torch's cache folder if the preload made it
    empty (``import torch._dynamo`` creates it)."""
    janitor.remove_at_exit(util.get_temp_dir())
    forkguard.on_child(_forget_helpers_in_child)
    child = subprocess.Popen(list(args), executable=path, pass_fds=tuple(sorted(map(int, passfds))),
                             close_fds=True, start_new_session=True, env={**os.environ, **_torch_cache()})
    _children[child.pid] = child
    janitor.end_with_kernel(passfds)
    return child.pid


TORCH_CACHE = "TORCHINDUCTOR_CACHE_DIR"
_torch_cache_dir: list[str] = []  # nbddp's private one, once made


def _torch_cache() -> dict:
    """The forkserver imports torch._dynamo, which makes torch's compile cache folder, by default
    ``/tmp/torchinductor_<user>``: a name anyone can predict and make first, and whoever owns it
    owns the user's compiled code. Unless the user named a folder, nbddp's helpers (and so the
    ranks: nbddp/rank/worker.py) get a private one (0700, removed with the kernel); the
    kernel's own torch is left as it is. Where the user named one, it is removed at exit only if
    the preload made it empty."""
    named = os.environ.get(TORCH_CACHE)
    if named and os.path.abspath(named) != worker.predictable_torch_cache():
        janitor.remove_if_empty_at_exit(janitor.new_torch_cache_dir())
        return {}
    with _lock:
        if not _torch_cache_dir:
            _torch_cache_dir.append(tempfile.mkdtemp(prefix="nbddp-inductor-"))
            janitor.remove_at_exit(_torch_cache_dir[0])
    return {TORCH_CACHE: _torch_cache_dir[0]}



def _forget_helpers_in_child() -> None:
    """In a child the kernel forked (``os.fork()``, a multiprocessing fork worker): close the
    kernel's ends of the forkserver's alive pipe and the resource tracker's pipe, which kept
    both running after the kernel died, and forget them (the child starts its own if it uses
    them). nbddp/kernel/forkguard.py runs this."""
    from multiprocess import resource_tracker

    server, tracker = forkserver._forkserver, resource_tracker._resource_tracker
    for fd in (server._forkserver_alive_fd, getattr(tracker, "_fd", None)):
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
    server._forkserver_alive_fd = server._forkserver_pid = server._forkserver_address = None
    tracker._fd = tracker._pid = None


_known_forkserver: int | None = None  # the pid the last launch used


def ensure_forkserver() -> str | None:
    """Start the forkserver if it is not running; a line to show when the one the last launch
    used has ended, else None. The replacement may have been started here or, in between
    cells, by a background fork of spares (multiprocess restarts it on any fork), so this
    compares with the pid the last launch saw, not only with the one before this call."""
    global _known_forkserver
    server = forkserver._forkserver
    before = server._forkserver_pid
    server.ensure_running()
    after = server._forkserver_pid
    known, _known_forkserver = _known_forkserver, after
    if known is None or known == after:
        return None
    _children.pop(known, None)
    if before != after:
        return (f"the forkserver had ended (pid {known}); started a new one, so this cell waits for "
                "torch to be imported again")
    return f"the forkserver had ended (pid {known}); a new one was started in the background"


_starting = threading.local()
_original_preparation = spawn.get_preparation_data


def _preparation_without_main(name):
    """A rank builds its own ``__main__`` from the cell: never re-run the caller's main script
    in it (multiprocess would, for a script without a ``__main__`` guard). multiprocess reads
    ``__main__.__spec__``, which a notebook's ``%reset`` deletes (a fresh kernel's is None):
    without it every pool start and fresh fork raised AttributeError from multiprocess."""
    if getattr(_starting, "active", False):
        main = sys.modules["__main__"]
        if not hasattr(main, "__spec__"):
            main.__spec__ = None  # what the kernel had before the reset
        data = _original_preparation(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data
    return _original_preparation(name)



_original_flush = util._flush_std_streams


def _flush_unless_starting():
    """multiprocess flushes sys.stdout/stderr before each start, so a forked child does not
    repeat buffered output. A rank is forked by the forkserver (or spawned), never from the
    kernel, so there is nothing to protect; and in ipykernel a flush from a thread other than
    the IO thread gives that thread a zmq socket of its own (an eventfd), closed only by
    ipykernel's sweep 10-20 s after the thread ended: one per start thread."""
    if not getattr(_starting, "active", False):
        _original_flush()



def start(process) -> None:
    """Start one rank's process (see _preparation_without_main, _flush_unless_starting)."""
    _starting.active = True
    try:
        process.start()
    finally:
        _starting.active = False


FORK_ANSWER_S = 10.0  # a forkserver that has forked before answers a fork request in ms
FIRST_ANSWER_S = 300.0  # a new one first imports torch and the preload list (seconds to minutes)


class ForkserverStuck(RuntimeError, NbddpError):
    """The forkserver did not fork within the limit; it was killed (``pid``)."""

    _done = "ended it and started a new one"   # what nbddp did, in ``line``

    def __init__(self, pid: int | None, waited: float = 0.0):
        super().__init__(self._what(pid, waited))
        self.pid, self.waited = pid, waited

    @staticmethod
    def _what(pid, waited) -> str:
        return f"the forkserver (pid {pid}) did not answer in {waited:.0f} s"

    @property
    def line(self) -> str:
        """What the cell says: the ranks started on a new forkserver."""
        return f"{self}, so nbddp {self._done}: this cell waits for torch to be imported again"


class ForkserverEnded(ForkserverStuck):
    """The forkserver ended (killed: the OOM killer, a user's kill) while ranks were being
    started: multiprocess's fork request fails with "EOFError: unexpected EOF" or a refused
    connection. Started again like a stuck one."""

    _done = "started a new one"

    @staticmethod
    def _what(pid, waited) -> str:
        return f"the forkserver (pid {pid}) ended while this cell's ranks were being started"


# how a fork request fails when the forkserver ends under it
_LOST = (EOFError, ConnectionError, FileNotFoundError)
ENDING_S = 10.0   # a killed forkserver holding torch may take seconds to exit on a busy machine


_answered: int | None = None  # the forkserver that has forked for this kernel (so it is warm)
_offering = threading.Event()  # set while an offer may keep the forkserver busy (nbddp/forkserver/preload.py)


@contextmanager
def offering():
    """While the forkserver may be importing an offer (seconds), fork requests wait for it."""
    _offering.set()
    try:
        yield
    finally:
        _offering.clear()


def answer_limit() -> float:
    """How long a fork request may take: short once the forkserver has answered before; while
    it may still be importing torch and the preload list, or an offered module (whose probe
    gives up after nbddp.forkserver.preload.PROBE_TIMEOUT_S), long, but never without a limit."""
    if _offering.is_set():
        return PROBE_TIMEOUT_S + FIRST_ANSWER_S
    return FIRST_ANSWER_S if _not_answered_yet() else FORK_ANSWER_S


def _not_answered_yet() -> bool:
    """The running forkserver has not forked a rank yet (it may still be importing torch), or
    the one that has is gone: the next start makes a new one, which imports torch first (a
    limit taken before that start must not be the warm one's FORK_ANSWER_S)."""
    pid = forkserver._forkserver._forkserver_pid
    return _answered is None or _answered != pid or _ended(pid, 0)


def start_all(processes, limit: float | None = None) -> None:
    """Start several ranks at once. Each start waits for the forkserver to fork a torch-sized
    process; in threads (the wait releases the GIL) one rank's fork overlaps the next one's
    pickling (docs/explanation/performance.md). Returns when every start
    has returned (an interrupt meanwhile is re-raised after, so no rank starts unseen). With
    ``limit``, a forkserver that has not forked them all by then is killed (the blocked starts
    then fail at once) and ForkserverStuck is raised: a stuck forkserver never holds the
    kernel."""
    if _not_answered_yet():
        _notes["show"]()  # a new forkserver may still be importing torch (seconds)
    try:
        _start_all(processes, limit)
    finally:
        _notes["clear"]()


def _start_all(processes, limit):
    global _answered
    pid = forkserver._forkserver._forkserver_pid
    try:
        _start_each(processes, limit)
    except _LOST as exc:
        if pid and _ended(pid, ENDING_S):
            raise ForkserverEnded(pid) from exc
        raise
    _answered = forkserver._forkserver._forkserver_pid


def _start_each(processes, limit):
    if len(processes) <= 1 and limit is None:
        for process in processes:
            start(process)
        return
    errors: list[BaseException] = []

    def one(process):
        try:
            start(process)
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,), name="nbddp-start", daemon=True) for p in processes]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    interrupted, stuck = None, None
    for thread in threads:
        while True:
            try:
                left = None if limit is None else max(0.0, began + limit - time.monotonic())
                thread.join(left)
                if thread.is_alive() and stuck is None:  # only with a limit
                    stuck = _kill_forkserver()
                    continue
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
    if stuck is not None:  # the blocked starts fail at once now: let them, so none starts unseen
        for thread in threads:
            thread.join(5.0)
        raise ForkserverStuck(stuck, time.monotonic() - began)
    if interrupted is not None:
        raise interrupted
    if errors:
        raise errors[0]


def _kill_forkserver() -> int | None:
    """SIGKILL the forkserver (it does not answer): fork requests waiting on it fail at once,
    and the next ensure_running() starts a new one."""
    pid = forkserver._forkserver._forkserver_pid
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            return pid
        _ended(pid, 5.0)
    return pid


def _ended(pid: int, limit: float) -> bool:
    """Wait up to ``limit`` s for the forkserver ``pid`` to have exited; True once it has. Not
    reaped: multiprocess's ensure_running() reaps it and starts a new one (it would reuse one
    that is still exiting)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
