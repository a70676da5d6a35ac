"""How worker processes are started: a forkserver per kernel with torch preloaded (fork speed,
without forking the multi-threaded kernel or a process that has touched CUDA), or spawn.
"""
from __future__ import annotations

import subprocess
import threading

import multiprocess
from multiprocess import forkserver, spawn, util

from . import janitor
from .preload import NAMES as PRELOAD  # the list and the reason for each entry: nbddp/preload.py

_lock = threading.Lock()
_preload_set = False


def context(start_method: str = "forkserver"):
    """The multiprocess context for ``start_method``; the forkserver gets the preload list."""
    global _preload_set
    ctx = multiprocess.get_context(start_method)
    if start_method == "forkserver":
        with _lock:
            if not _preload_set:
                ctx.set_forkserver_preload(PRELOAD)
                _preload_set = True
    return ctx


_children: dict[int, subprocess.Popen] = {}  # kept, so nothing reaps them behind multiprocess


def _spawnv_passfds_in_own_session(path, args, passfds):
    """multiprocess's helper that starts the forkserver (and spawned ranks), but in a session
    of its own: Jupyter's stop button signals the kernel's whole process group, and a SIGINT
    there would kill the forkserver while it imports torch. The forkserver still ends with
    the kernel (its alive pipe closes), so do the ranks and spares it forked (lifelines), and
    the watcher of nbddp/janitor.py ends whatever of them is stuck and removes multiprocess's
    ``pymp-*`` folder (the listener's socket) and torch's cache folder if the preload made it
    empty (``import torch._dynamo`` creates it)."""
    janitor.remove_if_empty_at_exit(janitor.new_torch_cache_dir())
    janitor.remove_at_exit(util.get_temp_dir())
    child = subprocess.Popen(list(args), executable=path, pass_fds=tuple(sorted(map(int, passfds))),
                             close_fds=True, start_new_session=True)
    _children[child.pid] = child
    janitor.end_with_kernel(passfds)
    return child.pid


util.spawnv_passfds = _spawnv_passfds_in_own_session


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
        return ("the forkserver had ended (pid %d); started a new one, so this cell waits for "
                "torch to be imported again" % known)
    return "the forkserver had ended (pid %d); a new one was started in the background" % known


_starting = threading.local()
_original_preparation = spawn.get_preparation_data


def _preparation_without_main(name):
    """A rank builds its own ``__main__`` from the cell: never re-run the caller's main script
    in it (multiprocess would, for a script without a ``__main__`` guard)."""
    data = _original_preparation(name)
    if getattr(_starting, "active", False):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


spawn.get_preparation_data = _preparation_without_main


def start(process) -> None:
    """Start one rank's process (see _preparation_without_main)."""
    _starting.active = True
    try:
        process.start()
    finally:
        _starting.active = False


def start_all(processes) -> None:
    """Start several ranks at once. Each start waits ~5 ms for the forkserver to fork a
    torch-sized process; in threads (the wait releases the GIL) one rank's fork overlaps the
    next one's pickling, which shortens a 4-rank launch by a third. Returns when every start
    has returned (an interrupt meanwhile is re-raised after, so no rank starts unseen)."""
    if len(processes) <= 1:
        for process in processes:
            start(process)
        return
    errors: list[BaseException] = []

    def one(process):
        try:
            start(process)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,), name="nbddp-start", daemon=True) for p in processes]
    for thread in threads:
        thread.start()
    interrupted = None
    for thread in threads:
        while True:
            try:
                thread.join()
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
    if interrupted is not None:
        raise interrupted
    if errors:
        raise errors[0]


_torch_ready = threading.Event()
_torch_ready.set()  # nothing to wait for until warm_up() starts importing torch in the background


def warm_up() -> threading.Thread:
    """Start the forkserver (and import torch here, for the rendezvous store) in the background,
    so the first cell does not pay for it while the user is still typing. Until that import
    has finished, the next cell waits for it (``wait_for_torch``, an IPython pre_run_cell
    hook) instead of importing torch at the same time: two threads importing torch's nested
    packages at once can fail or abort the kernel (pytorch/pytorch#182560; seen here as
    "terminate called after throwing an instance of 'python_error'")."""
    import sys

    def work():
        try:
            context("forkserver")
            forkserver.ensure_running()
            import torch.distributed  # noqa: F401 - the launcher hosts a TCPStore
        except Exception:
            pass  # the first launch will start it and report any real problem
        finally:
            _torch_ready.set()

    if "torch.distributed" not in sys.modules:
        _torch_ready.clear()
    thread = threading.Thread(target=work, name="nbddp-warm-up", daemon=True)
    thread.start()
    return thread


def wait_for_torch(*_args) -> None:
    """Block until the background import of torch (``warm_up``) has finished; at once after.
    The stop button while it waits ends the wait only (the cell then runs as it would have)."""
    try:
        _torch_ready.wait()
    except KeyboardInterrupt:
        pass
