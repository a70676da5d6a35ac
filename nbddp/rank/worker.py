"""What runs inside one rank: make the process look like a script started by torchrun, run the
cell (or callable), report how it ended, and die with the kernel.

This module is preloaded in the forkserver, so it must import nothing that touches CUDA.
"""
from __future__ import annotations

import atexit
import faulthandler
import io
import linecache
import os
import signal
import sys
import threading
import time
import traceback
import types
from typing import Any

from nbddp.core import exitstates, job as rankjob, messages as msg, settings
from nbddp.core.cellnames import name_cell
from nbddp.core.job import Cell, RankJob
from nbddp.rank import (
    asking,
    diffing,
    fakeworld,
    gpumemory,
    ipytraceback,
    netrecord,
    pushed,
    release,
    stackwatch,
    teardown,
    user_rendezvous,
)
from nbddp.rank.procname import set_name

# What this rank was launched with, for nbddp.backend() and friends; empty outside a rank.
CURRENT: dict = {}
_KEPT: list = []  # what must live as long as the rank (the stack file stackwatch writes)


def entry(pipes: dict) -> None:
    """Process target: set up, run, report, exit. Never returns. ``pipes``: this process's
    ends of its pipes (nbddp/forkserver/spares.py's Plumbing); its RankJob comes on "jobpipe"."""
    ctl = pipes["ctl"]
    code = 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the cell runs (_become_script)
    if os.getsid(0) != os.getpid():  # a spawned rank starts in a session of its own already
        os.setsid()  # own process group: the launcher ends the rank and all it started at once
    if pipes.pop("spare", False):
        set_name(b"nbddp-spare")
        _send(ctl, (msg.READY,))
    try:  # the rank's data comes when a launch needs this process (nbddp/forkserver/spares.py)
        data = pipes["jobpipe"].recv_bytes()
    except (EOFError, OSError):
        os._exit(0)  # never used: the kernel ended or discarded it
    pipes.pop("jobpipe").close()
    try:
        job = rankjob.loads(data)
        set_name(f"nbddp-rank{job.rank}".encode()[:15])
        _become_script(job, pipes)
        _refuse_outside_private_net(ctl)
        _send(ctl, (msg.STARTED, os.getpid(), time.time()))
        code = _serve(job, ctl) if job.pool else _run(job, ctl)
        if not job.pool:  # a pool rank sent its figures after each cell
            _send_gpu_memory(ctl)
    except BaseException as exc:  # setup failed: say so as plainly as possible
        try:
            os.write(2, f"nbddp: worker setup failed: {exc!r}\n".encode())
        except OSError:
            pass
    _finish(ctl, code)


def _refuse_outside_private_net(ctl) -> None:
    """A rank forked from a forkserver that could not enter the private network it was to enter
    (nbddp/forkserver/privnet.py) runs nothing: private fails closed. The kernel refuses such a
    launch before any rank starts; this is for a forkserver replaced in between."""
    why = netrecord.failure()
    if why:
        try:
            os.write(2, f"nbddp: this rank ran nothing: it was to run in a private network "
                        f"({settings.PRIVATE_NET.name}=1), but {why}\n".encode())
        except OSError:
            pass
        _finish(ctl, 1)


def _forget(names) -> None:
    """Drop preloaded modules that are out of date, with their submodules: the cell re-imports them."""
    for name in names:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            sys.modules.pop(key, None)


def _send(ctl, message) -> None:
    try:
        ctl.send(message)
    except (OSError, EOFError, ValueError):
        pass


def _become_script(job: RankJob, pipes: dict) -> None:
    CURRENT.update(rank=job.rank, backend=job.backend)
    for fd, conn in ((1, pipes["stdout"]), (2, pipes["stderr"])):
        os.dup2(conn.fileno(), fd)
        conn.close()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    asking.install(pipes["ctl"], job.rank)  # input() and pdb ask the notebook (nbddp/rank/asking.py)
    # the rank's own streams, also as the originals (typeshed declares those Final: they are, but for us)
    sys.stdout = sys.__stdout__ = _line_stream(1)  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = _line_stream(2)  # type: ignore[misc]
    _watch_lifeline(pipes["lifeline"])
    faulthandler.enable(file=sys.stderr, all_threads=True)
    _KEPT.append(stackwatch.serve(job.stack_path))  # stacks on request, no signal
    _INTERRUPT.update(armed=True, ack=job.sigint_path)
    signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch_cache = os.environ.get(TORCH_CACHE)  # nbddp's private one, from the forkserver
    os.environ.clear()
    os.environ.update(job.env)
    _keep_torch_cache_private(torch_cache)
    user_rendezvous.install(job.env, job.cell.path)  # a cell's own MASTER_PORT/tcp:// works
    _apply_thread_env()
    teardown.install()  # destroy_process_group without torch's teardown race (nbddp/rank/teardown.py)
    os.chdir(job.cwd)
    sys.path[:] = [job.cwd] + [p for p in job.sys_path if p not in ("", job.cwd)]
    sys.argv = list(job.argv)
    if job.forget:  # preloaded modules whose files changed since (nbddp/forkserver/preload.py)
        _forget(job.forget)
    atexit._clear()  # handlers inherited from the forkserver are not the script's
    _install_display(pipes["ctl"])


TORCH_CACHE = "TORCHINDUCTOR_CACHE_DIR"


def _keep_torch_cache_private(given: str | None) -> None:
    """torch.compile's cache folder: the one the kernel's environment names, unless that is none
    or torch's predictable default (the kernel's own torch writes it there): then the private
    folder nbddp gave the forkserver (nbddp/forkserver/starter.py), which this rank inherited."""
    named = os.environ.get(TORCH_CACHE)
    if given and (not named or os.path.abspath(named) == predictable_torch_cache()):
        os.environ[TORCH_CACHE] = given


def predictable_torch_cache() -> str:
    """torch's default compile cache folder (torch._inductor.runtime.cache_dir_utils):
    ``$TMPDIR/torchinductor_<user>``, a name any user can predict and make first."""
    import getpass
    import re
    import tempfile

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.abspath(os.path.join(tempfile.gettempdir(),
                                        "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)))


_INTERRUPT: dict[str, Any] = {"armed": False, "ack": ""}  # armed while a cell runs; the file to touch


def _on_sigint(signum, frame):
    """SIGINT while the cell runs: KeyboardInterrupt, as Python raises it, after leaving a mark
    that says Python code got it, so the launcher lets the cell's own except/finally finish
    (a rank stuck in C, or ignoring SIGINT, leaves no mark and is ended within 2 s). A file,
    not a message: the control pipe may be in the middle of a message right now."""
    if not _INTERRUPT["armed"]:
        return  # a pool rank between cells: the interrupt was for the cell that just ended
    try:
        os.close(os.open(_INTERRUPT["ack"], os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError:
        pass
    raise KeyboardInterrupt


def _install_display(ctl) -> None:
    """display() and plt.show() in a rank send mime bundles to the kernel (nbddp/rank/display.py)."""
    try:
        from nbddp.rank.display import install

        install(ctl)
    except Exception as exc:  # rich output is a nicety: the rank still runs
        sys.stderr.write(f"nbddp: display() in this rank prints text only ({exc!r})\n")


def _line_stream(fd: int) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8", errors="backslashreplace",
                            line_buffering=True)


def _apply_thread_env() -> None:
    """torch was imported before the env was set: apply OMP_NUM_THREADS as a fresh process would."""
    threads = os.environ.get("OMP_NUM_THREADS")
    torch = sys.modules.get("torch")
    if threads and torch is not None:
        try:
            torch.set_num_threads(max(1, int(threads)))
        except (ValueError, RuntimeError):
            pass
    # torch.distributed reads TORCH_DISTRIBUTED_DEBUG once, at import (in the forkserver, before
    # this rank's environment existed): read it again so DETAIL's collective checks are on.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and hasattr(dist, "set_debug_level_from_env"):
        try:
            dist.set_debug_level_from_env()
        except (ValueError, RuntimeError):
            pass


def _watch_lifeline(conn) -> None:
    """End this rank's whole process group when the kernel that launched it goes away: the
    lifeline's end of file, and nothing else, means that (the kernel never writes to it). A
    read that fails for another reason (EBADF: the cell closed the descriptor, as
    ``os.closerange`` does; the same number reopened on another file) ends the watch, not the
    rank: nbddp's watcher (nbddp/kernel/janitor.py) still ends the rank with the kernel."""
    fd = _LIFELINE["fd"] = conn.fileno()
    identity = _identity(fd)

    def watch():
        while True:
            if _identity(fd) != identity:
                return  # no longer the lifeline: reading it would read someone else's file
            try:
                data = os.read(fd, 1)
            except InterruptedError:
                continue
            except OSError:
                return
            if data:
                return  # the lifeline never carries data: this is another file now
            break
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="nbddp-lifeline", daemon=True).start()


_LIFELINE: dict = {}  # its descriptor (tests close it as a cell's os.closerange would)


def _identity(fd: int):
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _run(job: RankJob, ctl) -> int:
    cell = job.cell
    main = _new_main(cell.path)
    try:
        if job.fake:
            fakeworld.install()
        if job.func is not None:
            import dill

            packed = job.func
            if packed["filename"] and packed["lines"]:  # so tracebacks show the notebook's lines
                linecache.cache[packed["filename"]] = (0, None, packed["lines"], packed["filename"])
            func, args, kwargs = dill.loads(packed["payload"])
            _send_value(ctl, func(*args, **kwargs))
        else:
            _exec_source(cell, main, ctl)
        if job.fake:
            _send(ctl, (msg.FAKE, fakeworld.report(main.__dict__)))
        return 0
    except SystemExit as exc:
        return _exit_code(exc, ctl, cell.path)
    except BaseException as exc:  # the user's error: print like Python would, and report it
        _report(ctl, exc, cell)
        try:
            _post_mortem(cell, exc)
        except KeyboardInterrupt:  # the stop button at the post-mortem prompt
            return 130
        return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _new_main(cell_path: str) -> types.ModuleType:
    main = types.ModuleType("__main__")
    main.__file__ = cell_path
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    return main


def _exec_source(cell: Cell, main: types.ModuleType, ctl) -> None:
    """Run one cell's source in ``main``: pushed names first, then the cell, --diff's comparison
    and the pulled names sent back."""
    if cell.push:
        main.__dict__.update(pushed.load(cell.push))
    source, path = cell.source, cell.path
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    exec(compile(source, path, "exec"), main.__dict__)
    if cell.diff and cell.diff_folder:  # --diff: after the cell's own code, before the rank ends
        diffing.exchange(main.__dict__, cell.diff, cell.diff_folder)
    if cell.pull:
        _send_pulled(ctl, main.__dict__, cell.pull)


def _serve(job: RankJob, ctl) -> int:
    """A pool rank: run cell after cell in one ``__main__``, keeping state and the process group.

    SIGINT raises KeyboardInterrupt only while a cell runs; one that arrives between cells (it
    was meant for the cell that just ended) is ignored, so it cannot break the control pipe."""
    main = _new_main(job.cell.path)
    _INTERRUPT["armed"] = False
    while True:
        try:
            message = ctl.recv()
        except (EOFError, OSError):
            return 0
        if message[0] in (msg.ANSWER, msg.NO_ANSWER):  # to a prompt the stop button had ended
            continue
        if message[0] != msg.EXEC:  # msg.STOP
            return 0
        cell: Cell = message[1]
        release.take()  # a group nbddp closed to release a hung cell is destroyed first
        teardown.release_retired()  # groups earlier cells destroyed (nbddp/rank/teardown.py)
        main.__file__ = sys.argv[0] = cell.path  # this cell's script (nbddp/kernel/cellscript.py)
        gpumemory.reset_peaks()  # this cell's peak, not the pool's
        status = msg.DONE_OK
        try:
            try:
                _INTERRUPT["armed"] = True
                _send(ctl, (msg.BEGAN,))  # from now on SIGINT is for this cell
                _exec_source(cell, main, ctl)
            finally:
                _INTERRUPT["armed"] = False
        except SystemExit as exc:  # leaving a pool rank ends that worker, as in a script
            return _exit_code(exc, ctl, cell.path)
        except BaseException as exc:
            exc = release.as_released(exc, cell.path)
            status = msg.DONE_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else msg.DONE_ERROR
            _report(ctl, exc, cell)
            _INTERRUPT["armed"] = True  # the stop button ends a post-mortem as it ends the cell
            try:
                _post_mortem(cell, exc)
            except KeyboardInterrupt:
                status = msg.DONE_INTERRUPTED
            finally:
                _INTERRUPT["armed"] = False
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        _send_gpu_memory(ctl)
        _send(ctl, (msg.DONE, status))


def _post_mortem(cell: Cell, exc: BaseException) -> None:
    """--pdb: the failing frame in the notebook's debugger (not for the stop button or ``q``)."""
    if cell.post_mortem and not isinstance(exc, (KeyboardInterrupt, asking.bdb.BdbQuit)):
        asking.post_mortem(_user_traceback(exc))


def _exit_code(exc: SystemExit, ctl, cell_path: str) -> int:
    """As Python exits on SystemExit; a message (``sys.exit("fatal: ...")``) is printed and
    reported, so the failure names it."""
    if exc.code is None or isinstance(exc.code, int):
        return exitstates.exit_status(exc.code)  # sys.exit(2**70) exits 255, not 0
    print(exc.code, file=sys.stderr)
    _send(ctl, (msg.EXCEPTION, {"type": "SystemExit", "message": str(exc.code), "traceback": "",
                              "cell_line": cell_line(_user_traceback(exc), cell_path)}))
    return 1


def cell_line(tb, cell_path: str):
    """The last line of the cell in traceback ``tb`` (None when the cell is not in it)."""
    line = None
    for frame, lineno in traceback.walk_tb(tb):
        if frame.f_code.co_filename == cell_path:
            line = lineno
    return line


def _user_traceback(exc: BaseException):
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def _report(ctl, exc: BaseException, cell: Cell) -> None:
    """Print the traceback as IPython would in the notebook (nbddp/rank/ipytraceback.py), else as
    Python would, naming the cell as IPython does (``Cell In[3], line 7``: the script file is gone
    after the launch); send the kernel Python's text (its summary reads that)."""
    cell_path, label, source, theme = cell.path, cell.label, cell.source, cell.theme
    tb = _user_traceback(exc)
    report = traceback.TracebackException(type(exc), exc, tb)
    for part in _chain(report):  # nbddp's own frames (e.g. the SIGINT handler) are noise here
        part.stack[:] = [f for f in part.stack if f.filename != __file__]
    text = name_cell("".join(report.format()), cell_path, label, source)
    failure = {"type": type(exc).__name__, "message": str(exc), "traceback": text, "shown": None,
               "cell_line": cell_line(tb, cell_path)}
    _send(ctl, (msg.EXCEPTION, failure))  # first: the kernel knows this rank failed by itself
    with ipytraceback.deferred_sigterm():
        shown = ipytraceback.format_exception(exc, tb, cell_path=cell_path, label=label, theme=theme,
                                              skip_file=__file__)
        sys.stderr.write(shown or text)
        sys.stderr.flush()
        if shown:
            _send(ctl, (msg.EXCEPTION, dict(failure, shown=shown)))  # as printed, for the DDPError


def _chain(report):
    seen = []
    while report is not None and report not in seen:
        seen.append(report)
        report = report.__cause__ or report.__context__
    return seen


def _send_value(ctl, value) -> None:
    try:
        ctl.send((msg.RETURN, value))
    except Exception as exc:  # unpicklable result: say which, do not fail the rank silently
        _send(ctl, (msg.RETURN_ERROR, f"{type(value).__name__} could not be sent back: {exc}"))


def _send_pulled(ctl, namespace: dict, names) -> None:
    """The asked names this rank has; the kernel tells missing ones from the errors sent."""
    pulled = {name: namespace[name] for name in names if name in namespace}
    try:
        ctl.send((msg.PULLED, pulled))
        return
    except Exception:
        pass
    errors = {}
    for name, value in pulled.items():  # find the ones that cannot be sent, to name them
        try:
            ctl.send((msg.PULLED, {name: value}))
        except Exception as exc:
            errors[name] = f"{type(value).__name__} cannot be pickled ({exc})"
    _send(ctl, (msg.PULLED, {}, errors))


def _send_gpu_memory(ctl) -> None:
    used = gpumemory.measure()
    if used:
        _send(ctl, (msg.GPU_MEMORY, used))


def _finish(ctl, code: int) -> None:
    _send(ctl, (msg.FINISHED, code))  # the cell is over; what follows is the process's exit
    try:
        threading_shutdown = getattr(threading, "_shutdown", None)
        if threading_shutdown is not None:
            threading_shutdown()
    except BaseException:
        pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    _send(ctl, (msg.EXIT, code))
    os._exit(code)
